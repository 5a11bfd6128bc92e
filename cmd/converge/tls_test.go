package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/auth/authtest"
	"github.com/converge-sync/converge/internal/embed"
	"github.com/converge-sync/converge/internal/graph"
	gembedded "github.com/converge-sync/converge/internal/graph/embedded"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/embedded"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/pkg/contract"
)

// operatorToken is the token of the TLS projectors: read and admin.
const operatorToken = "sk_operator_0123456789abcdef"

// tlsProjectors are an index and a graph projector's APIs served over
// TLS, each needing operatorToken, and the CA file of their certificates.
type tlsProjectors struct {
	index, graph *httptest.Server
	caFile       string
}

// startTLSProjectors serves, over TLS, what the index projector serves
// (search, its live generation, verify's digests of an empty index, a
// rebuild that is done at once) and what the graph projector serves (a
// document, verify's digests of an empty graph).
func startTLSProjectors(t *testing.T) tlsProjectors {
	t.Helper()
	ctx := context.Background()
	guard := auth.NewGuard(authtest.Tokens(t, "ops admin,read "+operatorToken+"\n"), nil, slog.New(slog.DiscardHandler))
	none := func(context.Context) ([]verify.Doc, error) { return nil, nil }

	store, err := embedded.Open(t.TempDir(), embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	e, _ := embed.NewHash(32)
	x, err := index.New(ctx, store, e, index.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := contract.Document{Key: "guide/rivers", Version: 3, Title: "Rivers", Body: "Rivers carry water from mountains to the sea."}.Normalize()
	ev := contract.NewUpsertedEvent(d, []string{d.Body})
	if r := x.Apply(ctx, []*contract.Event{&ev}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	done := rebuild.Status{Projector: "index", ID: "r1", Phase: rebuild.PhaseDone, Target: "index-b", Previous: "index"}
	im := http.NewServeMux()
	im.Handle("GET "+index.SearchPath, guard.Require(auth.Read, index.SearchHandler(x)))
	im.Handle("GET "+index.InfoPath, guard.Require(auth.Read, index.InfoHandler("index", x)))
	im.Handle("/v1/verify/", guard.Require(auth.Read, verify.Handler(verify.Index, none)))
	im.Handle("POST "+rebuild.AdminPath, guard.Require(auth.Admin, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusAccepted, done)
	})))
	im.Handle("GET "+rebuild.AdminPath, guard.Require(auth.Admin, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusOK, done)
	})))

	gstore, err := gembedded.Open(t.TempDir(), gembedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gstore.Close() })
	if _, err := gstore.Apply(ctx, []graph.Doc{{Key: "guide/a", Version: 2, Title: "A", ContentHash: "h", Links: []string{"guide/b"}}}); err != nil {
		t.Fatal(err)
	}
	gm := http.NewServeMux()
	gm.Handle("GET "+graph.DocumentPath+"{key...}", guard.Require(auth.Read, graph.DocumentHandler(gstore)))
	gm.Handle("/v1/verify/", guard.Require(auth.Read, verify.Handler(verify.Graph, none)))

	p := tlsProjectors{index: quietTLSServer(t, im), graph: quietTLSServer(t, gm)}
	// Both servers present httptest's one certificate, its own CA.
	p.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.index.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// verify, rebuild, search, graph and status reach projectors that serve
// TLS at https:// addresses, trusting the CA of -tls-ca (or
// CONVERGE_TLS_CA); without it, each says that the certificate is not
// trusted and names -tls-ca.
func TestCommandsReachProjectorsOverHTTPS(t *testing.T) {
	ctx := context.Background()
	p := startTLSProjectors(t)
	t.Setenv(auth.EnvToken, operatorToken)
	t.Setenv(auth.EnvTLSCA, "")
	db := pg.MigratedDatabase(t)
	withCA := []string{"-tls-ca", p.caFile}

	for _, tc := range []struct {
		name string
		args []string
		want string // in the output
	}{
		{"search", []string{"search", "water", "-index-addr", p.index.URL}, "guide/rivers"},
		{"graph", []string{"graph", "guide/a", "-graph-addr", p.graph.URL}, "document guide/a: version 2"},
		{"verify", []string{"verify", "-postgres-url", db, "-index-addr", p.index.URL, "-graph-addr", p.graph.URL}, "graph  agrees with Postgres"},
		{"rebuild", []string{"rebuild", "index", "-no-verify", "-index-addr", p.index.URL}, "index rebuilt from the stream's start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(ctx, append(tc.args, withCA...), &out); err != nil || !strings.Contains(out.String(), tc.want) {
				t.Errorf("with -tls-ca: %v\n%s", err, out.String())
			}
			out.Reset()
			err := run(ctx, tc.args, &out)
			if err == nil || !strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), "-tls-ca") ||
				strings.Contains(err.Error(), "running?") {
				t.Errorf("without -tls-ca: %v; want the certificate refused, naming -tls-ca", err)
			}
		})
	}

	t.Run("status", func(t *testing.T) {
		status := func(args ...string) statusReport {
			t.Helper()
			var out bytes.Buffer
			if err := run(ctx, append([]string{"status", "--json", "-postgres-url", db, "-index-addr", p.index.URL}, args...), &out); err != nil {
				t.Fatal(err)
			}
			var rep statusReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Index == nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			return rep
		}
		if rep := status(withCA...); rep.Index.Info == nil || rep.Index.Error != "" || rep.Index.Embedder != embed.IdentityOf(mustHash(t, 32)) {
			t.Errorf("with -tls-ca: %+v", rep.Index)
		}
		if rep := status(); rep.Index.Info != nil || !strings.Contains(rep.Index.Error, "-tls-ca") {
			t.Errorf("without -tls-ca: %+v; want an error naming -tls-ca", rep.Index)
		}
	})

	t.Run("CONVERGE_TLS_CA", func(t *testing.T) {
		t.Setenv(auth.EnvTLSCA, p.caFile)
		var out bytes.Buffer
		if err := run(ctx, []string{"search", "water", "-index-addr", p.index.URL}, &out); err != nil || !strings.Contains(out.String(), "guide/rivers") {
			t.Errorf("search with %s: %v\n%s", auth.EnvTLSCA, err, out.String())
		}
		t.Setenv(auth.EnvTLSCA, filepath.Join(t.TempDir(), "missing.pem"))
		if err := run(ctx, []string{"search", "water", "-index-addr", p.index.URL}, &out); err == nil || !strings.Contains(err.Error(), "-tls-ca") {
			t.Errorf("a missing CA file: %v", err)
		}
	})
}

// quietTLSServer serves h over TLS with httptest's certificate, without
// logging the handshakes that a client refuses: the tests make them on
// purpose.
func quietTLSServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func mustHash(t *testing.T, dim int) embed.Embedder {
	t.Helper()
	e, err := embed.NewHash(dim)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The writer's client of backfill, dlq redrive and verify --repair
// trusts -tls-ca too.
func TestBackfillReachesTheWriterOverHTTPS(t *testing.T) {
	ctx := context.Background()
	plain, _ := newWriterAPI(t, 2)
	srv := quietTLSServer(t, plain.Config.Handler)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(auth.EnvTLSCA, "")
	var out bytes.Buffer
	if err := run(ctx, []string{"backfill", "--keys", "doc-01", "-writer-url", srv.URL, "-tls-ca", ca}, &out); err != nil || !strings.Contains(out.String(), "re-emitted 1 documents") {
		t.Errorf("with -tls-ca: %v\n%s", err, out.String())
	}
	if err := run(ctx, []string{"backfill", "--keys", "doc-01", "-writer-url", srv.URL}, &out); err == nil || !strings.Contains(err.Error(), "-tls-ca") {
		t.Errorf("without -tls-ca: %v; want the certificate refused, naming -tls-ca", err)
	}
}

// The token goes over plain HTTP to loopback only: to any other host the
// commands refuse before sending anything, naming https:// and
// -insecure-plain-http.
func TestCommandsRefuseTheTokenOverPlainHTTPBeyondLoopback(t *testing.T) {
	ctx := context.Background()
	t.Setenv(auth.EnvToken, operatorToken)
	t.Setenv(auth.EnvInsecurePlainHTTP, "false")
	db := pg.MigratedDatabase(t)
	// .invalid names no host: were a request made, it would fail
	// otherwise than with the refusal.
	for _, args := range [][]string{
		{"search", "water", "-index-addr", "projector-index.invalid:9103"},
		{"graph", "guide/a", "-graph-addr", "http://projector-graph.invalid:9104"},
		{"verify", "-postgres-url", db, "-stores", "index", "-index-addr", "projector-index.invalid:9103"},
		{"rebuild", "graph", "-no-verify", "-graph-addr", "projector-graph.invalid:9104"},
		{"backfill", "--keys", "a", "-writer-url", "http://writer.invalid:8080"},
		{"verify", "--repair", "-postgres-url", db, "-writer-url", "http://writer.invalid:8080"},
	} {
		var out bytes.Buffer
		err := run(ctx, args, &out)
		if !errors.Is(err, auth.ErrPlainHTTP) || !strings.Contains(err.Error(), "https://") || !strings.Contains(err.Error(), "-insecure-plain-http") {
			t.Errorf("%q: %v; want the token refused over plain HTTP", args, err)
		}
		if err != nil && strings.Contains(err.Error(), operatorToken) {
			t.Errorf("%q: the error holds the token", args)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"status", "--json", "-postgres-url", db, "-index-addr", "projector-index.invalid:9103"}, &out); err != nil {
		t.Fatal(err)
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Index == nil || !strings.Contains(rep.Index.Error, "-insecure-plain-http") {
		t.Errorf("status: %v, %+v; want the index's error naming -insecure-plain-http", err, rep.Index)
	}
	// Told that the network is trusted, the commands send it.
	err := run(ctx, []string{"search", "water", "-index-addr", "projector-index.invalid:9103", "-insecure-plain-http"}, &out)
	if err == nil || errors.Is(err, auth.ErrPlainHTTP) {
		t.Errorf("search with -insecure-plain-http: %v; want the request made (and failed)", err)
	}
}
