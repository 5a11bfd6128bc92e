//go:build linux

package e2e_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/testenv"
)

// denialRun is what checkDenials needs of a running pipeline.
type denialRun struct {
	bin       *testenv.Binaries
	cli       *cli
	creds     *credentials
	natsURL   string
	api       string // the writer's API, http://host:port or https://host:port
	indexAddr string // the index projector's metrics address (host:port or https://host:port)
	// qdrant is the index's Qdrant instance (with an API key and a
	// read-only key, over TLS), nil with the embedded index.
	qdrant *testenv.QdrantTLS
	// driversCA is the environment that makes the Neo4j and Qdrant
	// drivers trust the run's CA (none without TLS).
	driversCA []string
}

// refusals are what checkDenials saw: the processes it started and the
// bodies of the refused requests (for the secrets check), and each refusal
// as "what: the text that said so".
type refusals struct {
	processes []*process
	responses map[string]string
	observed  []string
}

// checkDenials checks that the binaries refuse what their credentials do
// not allow: a projector given a Postgres URL, requests without a token or
// with a token of another scope, a Postgres role with another's password,
// a NATS user with another's password, a projector connected as
// another projector's NATS user, and, with the index on Qdrant, the index
// projector given Qdrant's read-only key, no key or a wrong one.
func checkDenials(t *testing.T, d denialRun) refusals {
	t.Helper()
	r := refusals{responses: map[string]string{}}
	saw := func(what, text string) { r.observed = append(r.observed, what+": "+text) }
	child := func(name, user, password string, env []string, args ...string) *process {
		listen := freePort(t)
		args = append(append(append([]string{"-nats-url", d.natsURL, "-metrics-addr", listen},
			d.creds.natsArgs(user)...), d.creds.httpArgs()...), args...)
		p := &process{t: t, name: name + " as " + user, bin: d.bin.Path(name), addr: d.creds.serviceAddr(listen),
			args: args, env: append([]string{natsauth.EnvPassword + "=" + password}, env...)}
		r.processes = append(r.processes, p)
		return p
	}

	// A projector holds no Postgres credentials: given a URL, it does not
	// start, and says which variable to unset.
	p := child("projector-index", natsauth.UserIndex, d.creds.nats[natsauth.UserIndex],
		[]string{config.EnvPostgresURL + "=" + d.creds.roleURL(t, roles.Writer)},
		"-data-dir", t.TempDir(), "-tokens-file", d.creds.projectorTokens)
	p.name = "projector-index with a Postgres URL"
	p.start()
	code := exitCode(t, p, 30*time.Second)
	if line := lineWith(p.logs.String(), config.EnvPostgresURL); code == 0 || line == "" {
		t.Errorf("projector-index with %s in its environment: exit %d, output:\n%s", config.EnvPostgresURL, code, p.logs.String())
	} else {
		saw(fmt.Sprintf("projector-index with %s (exit %d)", config.EnvPostgresURL, code), line)
	}

	// The writer's API: no token, 401; a read-only token, 403.
	batch := `{"key":"denied/1","version":1,"title":"t","body":"b"}` + "\n"
	for _, c := range []struct {
		what, token string
		want        int
	}{
		{"writer POST /v1/documents:batch without a token", "", http.StatusUnauthorized},
		{"writer POST /v1/documents:batch with a read token", d.creds.read, http.StatusForbidden},
	} {
		req, err := http.NewRequest(http.MethodPost, d.api+"/v1/documents:batch", strings.NewReader(batch))
		if err != nil {
			t.Fatal(err)
		}
		auth.SetBearer(req.Header, c.token)
		r.expectStatus(t, c.what, req, c.want)
	}
	// The index projector's search: no token, 401.
	req, err := http.NewRequest(http.MethodGet, serviceURL(d.indexAddr)+index.SearchPath+"?q=probe&k=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.expectStatus(t, "projector-index GET "+index.SearchPath+" without a token", req, http.StatusUnauthorized)
	// And through the CLI: converge search without CONVERGE_TOKEN is
	// refused; with the reader's token it is answered.
	out, err := d.cli.run(nil, "search", "-index-addr", d.indexAddr, "-k", "1", "probe")
	if line := lineWith(out, "401"); err == nil || line == "" {
		t.Errorf("converge search without %s: %v\n%s", auth.EnvToken, err, out)
	} else {
		saw("converge search without "+auth.EnvToken, line)
	}
	if out, err := d.cli.run([]string{auth.EnvToken + "=" + d.creds.read}, "search", "-index-addr", d.indexAddr, "-k", "1", "probe"); err != nil {
		t.Errorf("converge search with the reader's token: %v\n%s", err, out)
	}

	// Postgres checks each role's password: the reader's URL with the
	// writer's password is refused.
	wrong := d.creds.urlAs(t, roles.Reader, d.creds.roles[roles.Writer])
	out, err = d.cli.run([]string{config.EnvPostgresURL + "=" + wrong}, "status")
	if line := lineWith(out, "password authentication failed"); err == nil || line == "" {
		t.Errorf("converge status as %s with another role's password: %v\n%s", roles.Reader, err, out)
	} else {
		saw("converge status as "+roles.Reader+" with the writer's password", line)
	}

	// NATS checks each user's password: the relay with the writer's does
	// not start.
	p = child("relay", natsauth.UserRelay, d.creds.nats[natsauth.UserWriter], d.creds.postgresEnv(t, roles.Relay))
	p.name = "relay with the writer's NATS password"
	p.start()
	code = exitCode(t, p, 30*time.Second)
	if line := lineWith(p.logs.String(), "Authorization Violation"); code == 0 || line == "" {
		t.Errorf("relay with another user's NATS password: exit %d, output:\n%s", code, p.logs.String())
	} else {
		saw(fmt.Sprintf("relay with the writer's NATS password (exit %d)", code), line)
	}

	// The graph projector connected as the index projector's user: the
	// server refuses the graph's subjects, and the projector logs the
	// subject and counts the refusal.
	p = child("projector-graph", natsauth.UserIndex, d.creds.nats[natsauth.UserIndex], nil,
		"-data-dir", t.TempDir(), "-tokens-file", d.creds.projectorTokens)
	p.start()
	defer p.kill()
	testenv.Eventually(t, "projector-graph as "+natsauth.UserIndex+" to log a refusal", 60*time.Second, func() bool {
		return lineWith(p.logs.String(), "Permissions Violation") != ""
	})
	line := lineWith(p.logs.String(), "Permissions Violation")
	if !strings.Contains(line, `"subject":"`) || !strings.Contains(line, ".graph") {
		t.Errorf("projector-graph as %s: the refusal does not name the graph's subject: %s", natsauth.UserIndex, line)
	}
	saw("projector-graph as "+natsauth.UserIndex, line)
	if p.ready() {
		t.Errorf("projector-graph as %s is ready", natsauth.UserIndex)
	}
	const counter = "converge_nats_permission_violations_total"
	metrics := scrape(serviceURL(p.addr)+"/metrics", "")
	p.mu.Lock()
	exited := p.child.Exited()
	p.mu.Unlock()
	switch c := sample(metrics, counter); {
	case metrics == "" && exited:
		// Exited before it served /metrics: its log is the evidence.
		saw("projector-graph as "+natsauth.UserIndex+" /metrics", "not served (exited)")
	case c == "" || strings.HasSuffix(c, " 0"):
		t.Errorf("projector-graph as %s: /metrics has no refusal counted (%q)", natsauth.UserIndex, c)
	default:
		saw("projector-graph as "+natsauth.UserIndex+" /metrics", c)
	}
	if d.qdrant != nil {
		checkQdrantKeyDenials(t, d, child, saw)
	}
	return r
}

// checkQdrantKeyDenials starts projector-index on d.qdrant's collection
// (live, made by the run's projector-index) and on one not made yet, with
// Qdrant's read-only key, no key and a wrong key (made a secret of the
// run, like the others): each exits, saying why, and creates nothing.
func checkQdrantKeyDenials(t *testing.T, d denialRun, child func(name, user, password string, env []string, args ...string) *process, saw func(what, text string)) {
	t.Helper()
	q := *d.qdrant
	wrong := "wrong-" + rand.Text()
	d.creds.secrets["a wrong qdrant API key"] = wrong
	unmade := q.Collection + "_denied"
	for _, c := range []struct {
		what, key, collection, says string
	}{
		// qdrant.WriteDeniedError, on a collection that exists (the
		// write check) and on one it would create.
		{"the read-only key", q.ReadOnlyKey, q.Collection, "the API key may not write to collection"},
		{"the read-only key on a new collection", q.ReadOnlyKey, unmade, "the API key may not write to collection"},
		{"no key", "", q.Collection, "Unauthenticated"},
		{"a wrong key", wrong, q.Collection, "Unauthenticated"},
	} {
		p := child("projector-index", natsauth.UserIndex, d.creds.nats[natsauth.UserIndex],
			append([]string{indexprojector.EnvQdrantAPIKey + "=" + c.key}, d.driversCA...),
			"-qdrant-url", q.TLSURL, "-qdrant-collection", c.collection, "-data-dir", t.TempDir(), "-tokens-file", d.creds.projectorTokens)
		p.name = "projector-index with " + c.what
		p.start()
		code := exitCode(t, p, 60*time.Second)
		if line := lineWith(p.logs.String(), c.says); code == 0 || line == "" {
			t.Errorf("projector-index on Qdrant with %s: exit %d, want a failure saying %q; output:\n%s", c.what, code, c.says, p.logs.String())
		} else {
			saw(fmt.Sprintf("projector-index on Qdrant with %s (exit %d)", c.what, code), line)
		}
	}
	names, err := qdrantREST{url: q.HTTPURL, key: q.APIKey}.collections(context.Background(), unmade)
	if err != nil || len(names) != 0 {
		t.Errorf("collections %v (%v) after projector-index with the read-only key; want none made", names, err)
	}
}

// expectStatus sends req and checks its status; the body is kept.
func (r *refusals) expectStatus(t *testing.T, what string, req *http.Request, want int) {
	t.Helper()
	resp, err := serviceClient.Do(req)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	r.responses[what] = resp.Status + " " + resp.Header.Get("WWW-Authenticate") + " " + string(body)
	if resp.StatusCode != want {
		t.Errorf("%s: %s, want %d: %s", what, resp.Status, want, body)
		return
	}
	r.observed = append(r.observed, fmt.Sprintf("%s: %s %s", what, resp.Status, strings.TrimSpace(string(body))))
}

// exitCode waits for p to exit and returns its exit status (-1: killed
// after timeout).
func exitCode(t *testing.T, p *process, timeout time.Duration) int {
	t.Helper()
	p.mu.Lock()
	c := p.child
	p.mu.Unlock()
	select {
	case <-c.Done():
	case <-time.After(timeout):
		p.kill()
		t.Errorf("%s did not exit within %v", p.name, timeout)
		return -1
	}
	p.take()
	var ee *exec.ExitError
	if err := c.Err(); errors.As(err, &ee) {
		return ee.ExitCode()
	} else if err != nil {
		return -1
	}
	return 0
}

// lineWith is the first line of text holding s, "" when none does.
func lineWith(text, s string) string {
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// sample is the line of metric name in a /metrics text ("" when none).
func sample(metrics, name string) string {
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func mustParseURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// inboxSpy is a connection as one NATS user subscribed, while the pipeline
// runs, to every inbox but its own: _INBOX.> and each other user's
// (natsauth.InboxPrefix). Replies, pull deliveries, key-value answers and
// publish acknowledgements go there; the server must refuse each
// subscription, so that nothing arrives.
type inboxSpy struct {
	user     string
	nc       *nats.Conn
	subjects []string
	// got takes each message as the connection reads it: after a round
	// trip it holds all that the server sent before.
	got chan *nats.Msg

	mu   sync.Mutex
	errs []string
}

// spyOnInboxes connects as user with password (trusting certs' CA, when
// not nil) and subscribes.
func spyOnInboxes(t *testing.T, natsURL, user, password string, certs *testenv.Certificates) *inboxSpy {
	t.Helper()
	s := &inboxSpy{user: user, subjects: []string{"_INBOX.>"}, got: make(chan *nats.Msg, 4096)}
	for _, u := range slices.Sorted(maps.Keys(natsauth.Permissions())) {
		if u != user {
			s.subjects = append(s.subjects, natsauth.InboxPrefix(u)+".>")
		}
	}
	cc := natsauth.ClientConfig{User: user, Password: password}
	if certs != nil {
		cc.CAFile = certs.CAFile
	}
	opts, err := cc.Options()
	if err != nil {
		t.Fatal(err)
	}
	s.nc, err = nats.Connect(natsURL, append(opts, nats.Name("inbox spy as "+user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			s.mu.Lock()
			s.errs = append(s.errs, err.Error())
			s.mu.Unlock()
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.nc.Close)
	for _, subject := range s.subjects {
		if _, err := s.nc.ChanSubscribe(subject, s.got); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// check fails the test for each message the spy read and each
// subscription the server did not refuse.
func (s *inboxSpy) check(t *testing.T, saw func(what, text string)) {
	t.Helper()
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(s.got); n > 0 {
		var read []string
		for range min(n, 10) {
			m := <-s.got
			read = append(read, m.Subject+" (reply "+m.Reply+")")
		}
		t.Errorf("%s read %d messages of other users' inboxes, the first: %q", s.user, n, read)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, subject := range s.subjects {
		want := `Permissions Violation for Subscription to "` + subject + `"`
		i := slices.IndexFunc(s.errs, func(e string) bool { return strings.Contains(e, want) })
		if i < 0 {
			t.Errorf("%s subscribed to %s unrefused; the server sent: %q", s.user, subject, s.errs)
			continue
		}
		saw(s.user+" subscribing to "+subject+" while the pipeline ran (nothing read)", s.errs[i])
	}
}
