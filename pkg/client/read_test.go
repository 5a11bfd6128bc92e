package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/atleast"
	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/pkg/client"
	"github.com/converge-sync/converge/pkg/contract"
)

// projections are the index and the graph projectors' read APIs, in
// process: the routes of their live generations (the very handlers the
// projector processes serve, after= and wait= included) over an embedded
// index and graph, behind the guard of the projectors' metrics address
// (every GET route needs the read scope). What the relay and the
// projectors' runtime do is apply: the test decides when a write reaches
// the projections.
type projections struct {
	index, graph       *rebuild.Generation
	indexURL, graphURL string

	mu       sync.Mutex
	requests []*http.Request // as the projectors received them
}

func startProjections(t *testing.T) *projections {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	p := &projections{}
	is, err := indexprojector.NewStores(ctx, &indexprojector.Config{DataDir: dir}, index.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	gs := graphprojector.NewStores(&graphprojector.Config{DataDir: dir}, nil)
	for _, s := range []struct {
		stores rebuild.Stores
		g      **rebuild.Generation
	}{{is, &p.index}, {gs, &p.graph}} {
		name, err := s.stores.Live(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.stores.Open(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		*s.g = g
	}
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	guard := auth.NewGuard(tk, nil, nil)
	serve := func(g *rebuild.Generation) string {
		mux := http.NewServeMux()
		for pattern, h := range g.Routes {
			mux.Handle(pattern, guard.Require(auth.Read, h))
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p.mu.Lock()
			p.requests = append(p.requests, r.Clone(context.Background()))
			p.mu.Unlock()
			mux.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	p.indexURL, p.graphURL = serve(p.index), serve(p.graph)
	return p
}

// apply brings doc to both projections, as the projectors apply the
// writer's event.
func (p *projections) apply(t *testing.T, doc contract.Document) {
	t.Helper()
	d, err := doc.Normalize()
	if err != nil {
		t.Error(err)
		return
	}
	ev := contract.NewUpsertedEvent(d, []string{d.Body})
	for _, g := range []*rebuild.Generation{p.index, p.graph} {
		for _, r := range g.Store.Apply(context.Background(), []*contract.Event{&ev}) {
			if r.Err != nil {
				t.Errorf("apply %s@%d to %s: %v", d.Key, d.Version, g.Name, r.Err)
			}
		}
	}
}

// last is the latest request the projectors received.
func (p *projections) last(t *testing.T) *http.Request {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.requests) == 0 {
		t.Fatal("no request reached the projectors")
	}
	return p.requests[len(p.requests)-1]
}

func (p *projections) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.requests)
}

func newReader(t *testing.T, base string, opts ...client.Option) *client.Reader {
	t.Helper()
	r, err := client.NewReader(base, append([]client.Option{client.WithToken(readToken), fast}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkQuery checks that req carries the read token and exactly the
// parameters the projectors' own clients send (index.Client and
// graph.Client build them with atleast.Query), and that each after= reads
// back, with atleast.ParseWrite, as the write.
func checkQuery(t *testing.T, req *http.Request, base url.Values, wait time.Duration, writes ...atleast.Write) {
	t.Helper()
	if got := req.Header.Get("Authorization"); got != "Bearer "+readToken {
		t.Errorf("Authorization %q, want the read token", got)
	}
	want := url.Values{}
	for k, v := range base {
		want[k] = v
	}
	atleast.Query(want, wait, writes...)
	got := req.URL.Query()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("query %v, want %v", got, want)
	}
	for i, s := range got[atleast.ParamAfter] {
		w, err := atleast.ParseWrite(s)
		if err != nil || i >= len(writes) || w != writes[i] {
			t.Errorf("after=%q reads as %+v, %v", s, w, err)
		}
	}
	if s := got.Get(atleast.ParamWait); s != "" {
		if d, err := time.ParseDuration(s); err != nil || d != wait {
			t.Errorf("wait=%q reads as %v, %v; want %v", s, d, err, wait)
		}
	}
}

// A producer writes a document and at once searches and reads the graph
// with After what the writer answered: the reads wait until the
// projections hold the write, and find it.
func TestReadAfterAWrite(t *testing.T) {
	ctx := t.Context()
	p := startProjections(t)
	w := newClient(t, writerURL)
	doc := contract.Document{Key: "read/after 1?x", Version: 3, Title: "Tide", Tags: []string{"sea"},
		Body: "The tide rises twice a day along the northern coast."}
	res, err := w.Put(ctx, doc)
	if err != nil || res.Result != client.Applied {
		t.Fatalf("put: %+v, %v", res, err)
	}
	const delay = 150 * time.Millisecond
	applying, done := make(chan time.Time, 1), make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		time.Sleep(delay) // the relay and the projectors, slow
		applying <- time.Now()
		p.apply(t, doc)
	}()

	hits, err := newReader(t, p.indexURL).Search(ctx, doc.Body, 3, client.After(res), client.Wait(10*time.Second))
	answered := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if at := <-applying; answered.Before(at) {
		t.Errorf("the search was answered before the write reached the index")
	}
	if len(hits) != 1 || hits[0].Key != doc.Key || hits[0].Version != 3 || hits[0].Title != "Tide" ||
		!reflect.DeepEqual(hits[0].Tags, []string{"sea"}) || hits[0].Text != doc.Body || hits[0].Ordinal != 0 ||
		hits[0].ChunkID != contract.ChunkID(doc.Key, 3, 0).String() || hits[0].Score <= 0 {
		t.Fatalf("search after %s: %+v", res.After(), hits)
	}
	want := atleast.Write{Key: doc.Key, Version: 3}
	checkQuery(t, p.last(t), url.Values{"q": {doc.Body}, "k": {"3"}}, 10*time.Second, want)
	if p.last(t).URL.Path != "/v1/search" {
		t.Errorf("path %q", p.last(t).URL.Path)
	}

	g, err := newReader(t, p.graphURL).Graph(ctx, doc.Key, client.AfterWrite(doc.Key, 3))
	if err != nil {
		t.Fatal(err)
	}
	if g.Key != doc.Key || g.Version != 3 || g.Stub || g.Deleted || g.Title != "Tide" || len(g.Chunks) != 1 ||
		g.Chunks[0].ID != contract.ChunkID(doc.Key, 3, 0).String() || !reflect.DeepEqual(g.Tags, []string{"sea"}) {
		t.Fatalf("graph after %s: %+v", res.After(), g)
	}
	checkQuery(t, p.last(t), url.Values{}, 0, want) // no Wait: the projector's default

	// Without After: the parameters of a plain read, k left to the
	// projector.
	if _, err := newReader(t, p.indexURL).Search(ctx, "tide", 0); err != nil {
		t.Fatal(err)
	}
	checkQuery(t, p.last(t), url.Values{"q": {"tide"}}, 0)
}

// Keys the graph route could mistake for other paths are read as they
// are.
func TestGraphReadsAnyKey(t *testing.T) {
	ctx := t.Context()
	p := startProjections(t)
	r := newReader(t, p.graphURL)
	for i, key := range []string{"kb/wal", "dir/../x", "a//b", "..", "/lead", "q?a=1#f", "100%", "ü@2"} {
		doc := contract.Document{Key: key, Version: int64(i + 1), Body: "text of " + key}
		p.apply(t, doc)
		g, err := r.Graph(ctx, key, client.AfterWrite(key, doc.Version), client.Wait(time.Second))
		if err != nil || g.Key != key || g.Version != doc.Version {
			t.Errorf("graph %q: %+v, %v", key, g, err)
		}
	}
}

// A write the projection does not hold within the wait: a typed error
// naming each write not held and the version held instead.
func TestReadNotYetApplied(t *testing.T) {
	ctx := t.Context()
	p := startProjections(t)
	p.apply(t, contract.Document{Key: "b", Version: 1, Body: "the first version of b"})
	p.apply(t, contract.Document{Key: "a/b", Version: 4, Body: "a/b, held at 4"})
	// "b@2" ends "a/b@2": the list is read against the writes asked for.
	after := []client.ReadOption{client.After(client.Result{Key: "a/b", Version: 5}), client.AfterWrite("b", 2),
		client.AfterWrite("x, y (it holds version 9)", 1), client.AfterWrite("a/b", 4), client.Wait(30 * time.Millisecond)}
	want := []client.PendingWrite{{Key: "a/b", Version: 5, Holds: 4}, {Key: "b", Version: 2, Holds: 1}, {Key: "x, y (it holds version 9)", Version: 1}}

	for _, read := range []struct {
		name   string
		base   string
		params url.Values
		f      func(*client.Reader) error
	}{
		{"search", p.indexURL, url.Values{"q": {"b"}, "k": {"1"}}, func(r *client.Reader) error { _, err := r.Search(ctx, "b", 1, after...); return err }},
		{"graph", p.graphURL, url.Values{}, func(r *client.Reader) error { _, err := r.Graph(ctx, "b", after...); return err }},
	} {
		n := p.count()
		err := read.f(newReader(t, read.base))
		var ny *client.NotYetAppliedError
		if !errors.As(err, &ny) {
			t.Fatalf("%s: %v, want a *NotYetAppliedError", read.name, err)
		}
		if !reflect.DeepEqual(ny.Pending, want) || ny.Waited < 30*time.Millisecond || ny.Waited > 10*time.Second {
			t.Errorf("%s: pending %+v after %v, want %+v", read.name, ny.Pending, ny.Waited, want)
		}
		var e *client.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusServiceUnavailable || e.Code != client.CodeNotYetApplied ||
			!errors.Is(err, client.ErrNotYetApplied) || errors.Is(err, client.ErrUnavailable) {
			t.Errorf("%s: %#v", read.name, e)
		}
		for _, s := range []string{read.base, "a/b@5 (it holds version 4)", "b@2 (it holds version 1)", "not_yet_applied"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q lacks %q", read.name, err, s)
			}
		}
		if got := p.count() - n; got != 1 {
			t.Errorf("%s: %d requests; a not_yet_applied is not retried", read.name, got)
		}
		checkQuery(t, p.last(t), read.params, 30*time.Millisecond,
			atleast.Write{Key: "a/b", Version: 5}, atleast.Write{Key: "b", Version: 2},
			atleast.Write{Key: "x, y (it holds version 9)", Version: 1}, atleast.Write{Key: "a/b", Version: 4})
	}

	// Wait(0) asks once, without waiting.
	_, err := newReader(t, p.indexURL).Search(ctx, "b", 1, client.AfterWrite("b", 2), client.Wait(0))
	var ny *client.NotYetAppliedError
	if !errors.As(err, &ny) || len(ny.Pending) != 1 || p.last(t).URL.Query().Get("wait") != "0s" {
		t.Fatalf("wait 0: %v", err)
	}
}

// The other answers are the package's *Error, named as the projector's,
// matching their class; reads the projector would refuse are refused
// before sending.
func TestReadErrors(t *testing.T) {
	ctx := t.Context()
	p := startProjections(t)
	for _, c := range []struct {
		name   string
		opts   []client.Option
		class  error
		status int
	}{
		{"no token", nil, client.ErrUnauthorized, 401},
		{"write token", []client.Option{client.WithToken(token)}, client.ErrForbidden, 403},
		{"no such document", []client.Option{client.WithToken(readToken)}, client.ErrNotFound, 404},
	} {
		r, err := client.NewReader(p.graphURL, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Graph(ctx, "nowhere")
		var e *client.Error
		if !errors.Is(err, c.class) || !errors.As(err, &e) || e.StatusCode != c.status ||
			!strings.Contains(err.Error(), "projector at "+p.graphURL) || strings.Contains(err.Error(), "writer") {
			t.Errorf("%s: %v (%#v)", c.name, err, e)
		}
	}

	n := p.count()
	r := newReader(t, p.indexURL)
	for _, c := range []struct {
		name string
		err  error
		code string
	}{
		{"empty query", first(r.Search(ctx, "", 1)), client.CodeMissingQuery},
		{"k", first(r.Search(ctx, "x", 1001)), client.CodeInvalidK},
		{"no key", first(r.Search(ctx, "x", 1, client.AfterWrite("", 1))), client.CodeInvalidAfter},
		{"version 0", first(r.Search(ctx, "x", 1, client.After(client.Result{Key: "k"}))), client.CodeInvalidAfter},
		{"wait", first(r.Search(ctx, "x", 1, client.AfterWrite("k", 1), client.Wait(2*time.Minute))), client.CodeInvalidWait},
		{"graph key", first(r.Graph(ctx, "")), client.CodeMissingKey},
	} {
		var e *client.Error
		if !errors.As(c.err, &e) || e.StatusCode != 0 || e.Code != c.code {
			t.Errorf("%s: %v, want %s refused before sending", c.name, c.err, c.code)
		}
	}
	if p.count() != n {
		t.Errorf("%d requests sent for reads refused before sending", p.count()-n)
	}
	if _, err := client.NewReader("127.0.0.1:9103"); err == nil || !strings.Contains(err.Error(), "projector") {
		t.Errorf("a URL without scheme: %v", err)
	}
}

func first[T any](_ T, err error) error { return err }

// A 503 not_yet_applied whose message is not the projectors' (a proxy's
// rewording, a later version's) is still typed; Pending is then empty.
func TestNotYetAppliedOfAnotherMessage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		// The body of httpjson.Error, the shape every converge API answers.
		_, _ = w.Write([]byte(`{"error":{"code":"not_yet_applied","message":"still catching up"}}` + "\n"))
	}))
	defer srv.Close()
	_, err := newReader(t, srv.URL).Graph(t.Context(), "k", client.AfterWrite("k", 1))
	var ny *client.NotYetAppliedError
	if !errors.As(err, &ny) || ny.Pending != nil || ny.Err.Message != "still catching up" || ny.Waited != 0 {
		t.Fatalf("%v", err)
	}
}
