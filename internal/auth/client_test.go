package auth_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
)

func TestTokenFromEnv(t *testing.T) {
	t.Setenv(auth.EnvToken, "")
	os.Unsetenv(auth.EnvToken)
	t.Setenv(auth.EnvToken+"_FILE", "")
	os.Unsetenv(auth.EnvToken + "_FILE")
	if tok, err := auth.TokenFromEnv(); tok != "" || err != nil {
		t.Fatalf("unset: %q, %v", tok, err)
	}
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(writeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(auth.EnvToken+"_FILE", path)
	if tok, err := auth.TokenFromEnv(); tok != writeToken || err != nil {
		t.Fatalf("from %s_FILE: %q, %v", auth.EnvToken, tok, err)
	}
	t.Setenv(auth.EnvToken, " "+adminToken+" ")
	if tok, err := auth.TokenFromEnv(); tok != adminToken || err != nil {
		t.Fatalf("from %s: %q, %v", auth.EnvToken, tok, err)
	}
	os.Unsetenv(auth.EnvToken)
	t.Setenv(auth.EnvToken+"_FILE", filepath.Join(t.TempDir(), "none"))
	if _, err := auth.TokenFromEnv(); err == nil {
		t.Fatal("a missing token file is no error")
	}
}

func TestTransport(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(auth.NewGuard(tokens, nil, nil).Require(auth.Write, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	for _, tc := range []struct {
		token, own string
		status     int
	}{
		{writeToken, "", 200},
		{"", "", 401},
		{readToken, "", 403},
		{readToken, "Bearer " + writeToken, 200}, // the request's own wins
	} {
		c := &http.Client{Transport: &auth.Transport{Token: tc.token}}
		req, _ := http.NewRequest("PUT", srv.URL, nil)
		if tc.own != "" {
			req.Header.Set("Authorization", tc.own)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("token %q, own %q: %d, want %d", tc.token, tc.own, resp.StatusCode, tc.status)
		}
		if tc.own == "" && req.Header.Get("Authorization") != "" {
			t.Error("the transport changed the caller's request")
		}
	}
}
