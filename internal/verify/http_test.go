package verify_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/verify"
)

func docs(n int) []verify.Doc {
	out := make([]verify.Doc, n)
	for i := range out {
		key := fmt.Sprintf("doc/%03d", i)
		out[i] = verify.Doc{Key: key, Version: int64(1 + i%3), ContentHash: fmt.Sprintf("h%d", i),
			Chunks: []verify.Chunk{{ID: uuid.NewSHA1(uuid.NameSpaceURL, []byte(key)), Hash: "c"}},
			Links:  []string{"doc/000"}, Tags: []string{"t"}}
	}
	return out
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// A projector's side served over HTTP compares like the same documents in
// memory: agreement when equal, each difference named when not.
func TestRemoteRoundTrip(t *testing.T) {
	ctx := context.Background()
	truth := &verify.Memory{Label: "postgres", Docs: docs(200)}
	held := docs(200)
	held[17].Version = 9
	held = append(held[:40], held[41:]...)
	for _, tc := range []struct {
		name  string
		store []verify.Doc
		want  map[string]string
	}{
		{"equal", docs(200), map[string]string{}},
		{"different", held, map[string]string{"doc/017": verify.VersionMismatch, "doc/040": verify.Missing}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serve(t, verify.Handler(verify.Graph, func(context.Context) ([]verify.Doc, error) { return tc.store, nil }))
			rep, err := verify.Compare(ctx, truth, &verify.Remote{Label: "graph", Addr: addr}, verify.Graph, 64, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, d := range rep.Differences {
				got[d.Key] = d.Problem
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || rep.Agrees != (len(tc.want) == 0) {
				t.Fatalf("differences %v (agrees %v); want %v", got, rep.Agrees, tc.want)
			}
		})
	}
}

// A projector that fails, answers something else, or does not answer is an
// error naming it, never agreement.
func TestRemoteErrors(t *testing.T) {
	ctx := context.Background()
	failing := serve(t, verify.Handler(verify.Index, func(context.Context) ([]verify.Doc, error) {
		return nil, errors.New("store closed")
	}))
	wrongCount := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusOK, map[string]any{"kind": "index", "buckets": make([]verify.BucketDigest, 3)})
	}))
	wrongKind := serve(t, verify.Handler(verify.Graph, func(context.Context) ([]verify.Doc, error) { return nil, nil }))
	garbage := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) }))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	_ = lis.Close()
	for _, tc := range []struct{ name, addr, want string }{
		{"store error", failing, "503 Service Unavailable"},
		{"store error body", failing, "store closed"},
		{"wrong count", wrongCount, "answered 3 index digests, want 16 index"},
		{"wrong kind", wrongKind, "graph digests, want 16 index"},
		{"not JSON", garbage, "unreadable answer"},
		{"not listening", closed, "does not answer"},
	} {
		_, err := (&verify.Remote{Label: "index", Addr: tc.addr}).Digests(ctx, verify.Index, 16)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := (&verify.Remote{Label: "index", Addr: failing}).Buckets(ctx, verify.Index, 16, []int{1}); err == nil {
		t.Error("Buckets from a failing projector: no error")
	}
	// Bad requests are refused with the reason.
	addr := serve(t, verify.Handler(verify.Index, func(context.Context) ([]verify.Doc, error) { return nil, nil }))
	for _, q := range []string{"/v1/verify/digests?buckets=0", "/v1/verify/digests?buckets=x", "/v1/verify/buckets?buckets=4&b=4", "/v1/verify/buckets?buckets=4&b=-1"} {
		resp, err := http.Get("http://" + addr + q)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %s; want 400", q, resp.Status)
		}
	}
}

// Remote sends its Token as a bearer token: a projector whose verify
// routes need the read scope answers it, and refuses a Remote without one.
func TestRemoteSendsItsToken(t *testing.T) {
	ctx := context.Background()
	const token = "verify-token-0123456789"
	tokens := authtest.Tokens(t, "reader read "+token+"\n")
	guard := auth.NewGuard(tokens, nil, slog.New(slog.DiscardHandler))
	addr := serve(t, guard.Require(auth.Read, verify.Handler(verify.Index, func(context.Context) ([]verify.Doc, error) { return docs(10), nil })))
	truth := &verify.Memory{Label: "postgres", Docs: docs(10)}
	rep, err := verify.Compare(ctx, truth, &verify.Remote{Label: "index", Addr: addr, Token: token}, verify.Index, 4, nil)
	if err != nil || !rep.Agrees {
		t.Fatalf("with the token: %v, agrees %v", err, rep.Agrees)
	}
	for _, tok := range []string{"", "another-token-0123456789"} {
		if _, err := (&verify.Remote{Label: "index", Addr: addr, Token: tok}).Digests(ctx, verify.Index, 4); err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("token %q: %v; want a 401 refusal", tok, err)
		}
	}
}

// Remote speaks HTTPS to an https:// address (its Client trusting the
// projector's CA), and refuses to send its token over plain HTTP beyond
// loopback without making the request, unless told that the network is
// trusted.
func TestRemoteOverHTTPSAndPlainHTTP(t *testing.T) {
	ctx := context.Background()
	const token = "verify-token-0123456789"
	tokens := authtest.Tokens(t, "reader read "+token+"\n")
	guard := auth.NewGuard(tokens, nil, slog.New(slog.DiscardHandler))
	srv := httptest.NewTLSServer(guard.Require(auth.Read, verify.Handler(verify.Index, func(context.Context) ([]verify.Doc, error) { return docs(10), nil })))
	defer srv.Close()
	truth := &verify.Memory{Label: "postgres", Docs: docs(10)}
	rep, err := verify.Compare(ctx, truth, &verify.Remote{Label: "index", Addr: srv.URL, Token: token, Client: srv.Client()}, verify.Index, 4, nil)
	if err != nil || !rep.Agrees {
		t.Errorf("over https: %v, agrees %v", err, rep.Agrees)
	}

	for _, addr := range []string{"10.0.0.5:9103", "http://projector-index:9103"} {
		var asked []string
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			asked = append(asked, r.URL.String())
			return nil, errors.New("no network in this test")
		})}
		_, err := (&verify.Remote{Label: "index", Addr: addr, Token: token, Client: hc}).Digests(ctx, verify.Index, 4)
		if !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "-insecure-plain-http") || len(asked) != 0 {
			t.Errorf("%s: %v, requests %v; want the token refused before any request", addr, err, asked)
		}
		_, err = (&verify.Remote{Label: "index", Addr: addr, Token: token, Client: hc, InsecurePlainHTTP: true}).Digests(ctx, verify.Index, 4)
		if errors.Is(err, auth.ErrPlainHTTP) || len(asked) != 1 {
			t.Errorf("%s with InsecurePlainHTTP: %v, requests %v; want the request made", addr, err, asked)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The index projector's digests name the embedder of its live generation,
// which verify's report carries; the graph's name none.
func TestReportNamesTheIndexEmbedder(t *testing.T) {
	ctx := context.Background()
	truth := &verify.Memory{Label: "postgres", Docs: docs(20)}
	id := embed.Identity{Kind: embed.KindHTTP, Model: "m", Dimension: 384}
	read := func(context.Context) ([]verify.Doc, error) { return docs(20), nil }
	addr := serve(t, verify.Handler(verify.Index, read, verify.WithEmbedder(id)))
	rep, err := verify.Compare(ctx, truth, &verify.Remote{Label: "index", Addr: addr}, verify.Index, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Agrees || rep.Embedder == nil || *rep.Embedder != id {
		t.Fatalf("report %+v (embedder %v); want agreement naming %+v", rep, rep.Embedder, id)
	}
	rep, err = verify.Compare(ctx, truth, &verify.Remote{Label: "graph", Addr: serve(t, verify.Handler(verify.Index, read))}, verify.Index, 8, nil)
	if err != nil || rep.Embedder != nil {
		t.Fatalf("report without an embedder: %+v, %v", rep.Embedder, err)
	}
}
