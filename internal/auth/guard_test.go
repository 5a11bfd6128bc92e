package auth_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/telemetry"

	"github.com/converge-sync/converge/internal/testenv"
)

type answer struct {
	code, body, wwwAuthenticate string
	status                      int
}

func call(t *testing.T, c *http.Client, method, url, authorization string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return answer{status: resp.StatusCode, code: e.Error.Code, body: string(b), wwwAuthenticate: resp.Header.Get("WWW-Authenticate")}
}

func TestRequire(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens+"ops-reader admin,read sk_opsread_0123456789\n"))
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	g := auth.NewGuard(tokens, reg, log)
	served := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "served "+auth.Name(r.Context()))
	}
	mux := http.NewServeMux()
	mux.Handle("PUT /v1/documents/{key...}", g.Require(auth.Write, http.HandlerFunc(served)))
	mux.Handle("POST /v1/admin/reemit", g.Require(auth.Admin, http.HandlerFunc(served)))
	mux.Handle("GET /v1/documents/{key...}", g.Require(auth.Read|auth.Write, http.HandlerFunc(served)))
	mux.Handle("/", telemetry.Handler(reg))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := srv.Client()

	const unknown = "sk_unknown_0123456789abc"
	for _, tc := range []struct {
		name, method, path, authorization string
		status                            int
		code, body                        string
	}{
		{"no token", "PUT", "/v1/documents/a", "", 401, "unauthorized", ""},
		{"another scheme", "PUT", "/v1/documents/a", "Basic " + writeToken, 401, "unauthorized", ""},
		{"bearer without a token", "PUT", "/v1/documents/a", "Bearer ", 401, "unauthorized", ""},
		{"unknown token", "PUT", "/v1/documents/a", "Bearer " + unknown, 401, "unauthorized", ""},
		{"a known token's prefix", "PUT", "/v1/documents/a", "Bearer " + writeToken[:len(writeToken)-1], 401, "unauthorized", ""},
		{"read token on a write route", "PUT", "/v1/documents/a", "Bearer " + readToken, 403, "forbidden", ""},
		{"admin does not imply write", "PUT", "/v1/documents/a", "Bearer " + adminToken, 403, "forbidden", ""},
		{"write token on an admin route", "POST", "/v1/admin/reemit", "Bearer " + writeToken, 403, "forbidden", ""},
		{"write token", "PUT", "/v1/documents/a", "Bearer " + writeToken, 200, "", "served writer-client"},
		{"scheme in any case", "PUT", "/v1/documents/a", "bearer " + writeToken, 200, "", "served writer-client"},
		{"admin token", "POST", "/v1/admin/reemit", "Bearer " + adminToken, 200, "", "served ops"},
		{"the last token of the file", "POST", "/v1/admin/reemit", "Bearer sk_opsread_0123456789", 200, "", "served ops-reader"},
		{"either scope: read", "GET", "/v1/documents/a", "Bearer " + readToken, 200, "", "served reader"},
		{"either scope: write", "GET", "/v1/documents/a", "Bearer " + writeToken, 200, "", "served writer-client"},
		{"either scope: neither", "GET", "/v1/documents/a", "Bearer " + adminToken, 403, "forbidden", ""},
		{"metrics stay open", "GET", "/metrics", "", 200, "", ""},
		{"healthz stays open", "GET", "/healthz", "Bearer " + unknown, 200, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := call(t, c, tc.method, srv.URL+tc.path, tc.authorization)
			if a.status != tc.status || a.code != tc.code || !strings.Contains(a.body, tc.body) {
				t.Fatalf("%d %s, want %d %s %q", a.status, a.body, tc.status, tc.code, tc.body)
			}
			if tc.status == 401 && !strings.HasPrefix(a.wwwAuthenticate, "Bearer") {
				t.Fatalf("401 with WWW-Authenticate %q", a.wwwAuthenticate)
			}
			if tc.status == 403 && !strings.Contains(a.wwwAuthenticate, "insufficient_scope") {
				t.Fatalf("403 with WWW-Authenticate %q", a.wwwAuthenticate)
			}
		})
	}

	// What a refusal leaves behind (logs, metrics, the answers) names
	// tokens, never shows one.
	metrics := call(t, c, "GET", srv.URL+"/metrics", "").body
	m, err := telemetry.Parse(strings.NewReader(metrics))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		reason, route string
		n             float64
	}{
		{auth.ReasonNoToken, "PUT /v1/documents/{key...}", 3},
		{auth.ReasonUnknownToken, "PUT /v1/documents/{key...}", 2},
		{auth.ReasonScope, "PUT /v1/documents/{key...}", 2},
		{auth.ReasonScope, "POST /v1/admin/reemit", 1},
		{auth.ReasonScope, "GET /v1/documents/{key...}", 1},
	} {
		if v, err := m.Value("converge_auth_refusals_total", map[string]string{"reason": w.reason, "route": w.route}); err != nil || v != w.n {
			t.Errorf("refusals %s %s = %v, %v; want %v", w.reason, w.route, v, err, w.n)
		}
	}
	forbidden := call(t, c, "PUT", srv.URL+"/v1/documents/a", "Bearer "+readToken).body
	for what, text := range map[string]string{"log": logs.String(), "metrics": metrics, "a 403": forbidden} {
		for _, tok := range []string{writeToken, adminToken, readToken, unknown, writeToken[:len(writeToken)-1], "sk_opsread"} {
			if strings.Contains(text, tok) {
				t.Errorf("the %s shows a token:\n%s", what, text)
			}
		}
	}
	if !strings.Contains(logs.String(), "token_name=reader") || !strings.Contains(logs.String(), "reason=unknown_token") {
		t.Errorf("the log does not say what was refused:\n%s", logs.String())
	}
	if !strings.Contains(forbidden, "reader") || !strings.Contains(forbidden, "write") {
		t.Errorf("a 403 does not name the token and the scope it lacks: %s", forbidden)
	}
}

// Without tokens every request is served: authentication is off.
func TestRequireWithoutTokens(t *testing.T) {
	for name, g := range map[string]*auth.Guard{
		"nil tokens": auth.NewGuard(nil, nil, nil),
		"no guard":   nil,
		"empty":      auth.NewGuard(&auth.Tokens{}, nil, nil),
	} {
		t.Run(name, func(t *testing.T) {
			if g.Enabled() {
				t.Fatal("enabled")
			}
			h := g.Require(auth.Admin, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/admin/reemit", nil))
			if rec.Code != 200 {
				t.Fatalf("%d without tokens", rec.Code)
			}
		})
	}
}

// Two guards on one registry share the counter.
func TestGuardsShareARegistry(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens))
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	for range 2 {
		g := auth.NewGuard(tokens, reg, nil)
		rec := httptest.NewRecorder()
		g.Require(auth.Write, http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("PUT", "/x", nil))
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "converge_auth_refusals_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 2 {
				t.Fatalf("refusals %v, want 2", v)
			}
			return
		}
	}
	t.Fatal("no converge_auth_refusals_total")
}

// Allows answers as Require would, and counts and logs nothing: a page
// asking what to show is no refused request.
func TestAllowsAnswersAsRequireWithoutCounting(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens))
	if err != nil {
		t.Fatal(err)
	}
	reg := telemetry.NewRegistry()
	var logs testenv.Buffer
	g := auth.NewGuard(tokens, reg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	for _, c := range []struct {
		authorization string
		scope         auth.Scope
		want          bool
	}{
		{"", auth.Read, false},
		{"Bearer not-a-token", auth.Read, false},
		{"Bearer " + readToken, auth.Read, true},
		{"Bearer " + readToken, auth.Admin, false},
		{"Bearer " + adminToken, auth.Admin, true},
		{"Bearer " + adminToken, auth.Read, false},
		{"Bearer " + writeToken, auth.Read | auth.Write, true},
	} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if c.authorization != "" {
			req.Header.Set("Authorization", c.authorization)
		}
		if got := g.Allows(req, c.scope); got != c.want {
			t.Errorf("Allows(%q, %v) = %v, want %v", c.authorization, c.scope, got, c.want)
		}
	}
	if mfs, err := reg.Gather(); err != nil {
		t.Fatal(err)
	} else {
		for _, mf := range mfs {
			if mf.GetName() == "converge_auth_refusals_total" && len(mf.GetMetric()) > 0 {
				t.Errorf("Allows counted refusals: %v", mf)
			}
		}
	}
	if logs.String() != "" {
		t.Errorf("Allows logged: %s", logs.String())
	}
	if !auth.NewGuard(nil, nil, nil).Allows(httptest.NewRequest(http.MethodGet, "/", nil), auth.Admin) {
		t.Error("without tokens, Allows refused")
	}
}
