package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/console"
	"github.com/converge-sync/converge/internal/testenv"
)

const (
	adminToken = "admin-token-0123456789abcdefgh"
	readToken  = "read-token-0123456789abcdefghi"
	writeToken = "write-token-0123456789abcdefgh"
)

// newConsole serves a console whose API accepts an admin, a read and a
// write token; it never reads the pipeline (no Run), so its reading is
// refused as not read yet by the handler, past the guard.
func newConsole(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	lines := "operator admin,read " + adminToken + "\nviewer read " + readToken + "\nproducer write " + writeToken + "\n"
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{DB: pool, JS: js, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func do(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	auth.SetBearer(req.Header, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// The page holds no data and is served to anyone; reading needs the read
// scope, a redrive the admin scope (a read token is refused 403 whatever
// the page shows it); the access route tells the page which a token has.
func TestTheAPIRefusesWhatATokenMayNotDo(t *testing.T) {
	base := newConsole(t)
	redrive := base + strings.Replace(console.RedrivePath, "{consumer}", "index", 1)
	for _, tc := range []struct {
		method, path, token, body string
		want                      int
		has                       string
	}{
		{"GET", "/", "", "", http.StatusOK, "<svg id=\"picture\""},
		{"GET", "/console.js", "", "", http.StatusOK, "/v1/console/reading"},
		{"GET", console.AccessPath, "", "", http.StatusUnauthorized, "unauthorized"},
		{"GET", console.AccessPath, "not-a-token-of-this-console-000", "", http.StatusUnauthorized, "unauthorized"},
		{"GET", console.AccessPath, writeToken, "", http.StatusForbidden, "forbidden"},
		{"GET", console.AccessPath, readToken, "", http.StatusOK, `"token_name":"viewer","read":true,"admin":false`},
		{"GET", console.AccessPath, adminToken, "", http.StatusOK, `"token_name":"operator","read":true,"admin":true`},
		{"GET", console.ReadingPath, "", "", http.StatusUnauthorized, "unauthorized"},
		{"GET", console.ReadingPath, writeToken, "", http.StatusForbidden, "forbidden"},
		{"GET", console.ReadingPath, readToken, "", http.StatusServiceUnavailable, "not_read_yet"},
		{"POST", redrive, "", `{"seqs":[1]}`, http.StatusUnauthorized, "unauthorized"},
		{"POST", redrive, readToken, `{"seqs":[1]}`, http.StatusForbidden, "this route needs admin"},
		{"POST", redrive, adminToken, `{"seqs":[]}`, http.StatusBadRequest, "invalid_request"},
		{"POST", redrive, adminToken, `{"seqs":[1],"all":true}`, http.StatusBadRequest, "invalid_request"},
	} {
		url := tc.path
		if strings.HasPrefix(url, "/") {
			url = base + url
		}
		code, body := do(t, tc.method, url, tc.token, tc.body)
		if code != tc.want || !strings.Contains(body, tc.has) {
			t.Errorf("%s %s with %q: %d %s, want %d with %q", tc.method, tc.path, tc.token, code, body, tc.want, tc.has)
		}
	}
	code, body := do(t, "GET", base+console.AccessPath, readToken, "")
	var a console.Access
	if code != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil || a.RefreshMillis != console.DefaultInterval.Milliseconds() {
		t.Errorf("access: %d %s", code, body)
	}
}
