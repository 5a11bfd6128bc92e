package auth_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
)

// A service accepts bearer tokens over plain HTTP on loopback only, unless
// it serves TLS or is told that the network is trusted.
func TestCheckPlainHTTP(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr     string
		tokens   *auth.Tokens
		tls      bool
		insecure bool
		refused  bool
	}{
		{"127.0.0.1:8080", tokens, false, false, false},
		{"127.1.2.3:0", tokens, false, false, false},
		{"[::1]:8080", tokens, false, false, false},
		{"localhost:8080", tokens, false, false, false},
		{"LOCALHOST:8080", tokens, false, false, false},
		{"0.0.0.0:8080", tokens, false, false, true},
		{":8080", tokens, false, false, true},
		{"[::]:8080", tokens, false, false, true},
		{"10.0.0.5:8080", tokens, false, false, true},
		{"writer.internal:8080", tokens, false, false, true},
		{"localhost.example:8080", tokens, false, false, true},
		{"0.0.0.0:8080", tokens, true, false, false},
		{"0.0.0.0:8080", tokens, false, true, false},
		// No tokens, nothing secret to carry: CheckListen's to decide.
		{"0.0.0.0:8080", nil, false, false, false},
	} {
		err := auth.CheckPlainHTTP(tc.addr, tc.tokens, tc.tls, tc.insecure)
		if (err != nil) != tc.refused {
			t.Errorf("CheckPlainHTTP(%q, %d tokens, tls %v, insecure %v) = %v, want refused %v", tc.addr, tc.tokens.Len(), tc.tls, tc.insecure, err, tc.refused)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, auth.ErrPlainHTTP) {
			t.Errorf("the refusal is not ErrPlainHTTP: %v", err)
		}
		for _, want := range []string{tc.addr, "-tls-cert", "-tls-key", "-insecure-plain-http", auth.EnvInsecurePlainHTTP} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not name %q: %v", want, err)
			}
		}
	}
}

// Settings.CheckListen refuses what either rule refuses: no tokens beyond
// loopback, and tokens in clear beyond loopback.
func TestSettingsCheckListen(t *testing.T) {
	path := tokensFile(t, threeTokens)
	tokens, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		settings auth.Settings
		tokens   *auth.Tokens
		addr     string
		want     string // "" when accepted
	}{
		{"tokens on loopback", auth.Settings{TokensFile: path}, tokens, "127.0.0.1:0", ""},
		{"tokens in clear beyond loopback", auth.Settings{TokensFile: path}, tokens, "0.0.0.0:9103", "-insecure-plain-http"},
		{"tokens over TLS", auth.Settings{TokensFile: path, TLSCert: "c.pem", TLSKey: "k.pem"}, tokens, "0.0.0.0:9103", ""},
		{"tokens in clear, told the network is trusted", auth.Settings{TokensFile: path, InsecurePlainHTTP: true}, tokens, "0.0.0.0:9103", ""},
		{"no tokens beyond loopback", auth.Settings{InsecurePlainHTTP: true}, nil, "0.0.0.0:9103", "-insecure-no-auth"},
		{"no tokens, told to accept anyone", auth.Settings{InsecureNoAuth: true}, nil, "0.0.0.0:9103", ""},
	} {
		err := tc.settings.CheckListen(tc.addr, tc.tokens)
		if tc.want == "" && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want a refusal naming %s", tc.name, err, tc.want)
		}
	}
}

// A client sends a token over plain HTTP to loopback only, unless told
// that the network is trusted; over HTTPS, or without a token, anywhere.
func TestCheckSend(t *testing.T) {
	const secret = "sk_0123456789abcdef0123"
	for _, tc := range []struct {
		url      string
		token    string
		insecure bool
		refused  bool
	}{
		{"http://127.0.0.1:9103", secret, false, false},
		{"http://127.9.9.9:9103", secret, false, false},
		{"http://localhost:9103", secret, false, false},
		{"http://[::1]:9103", secret, false, false},
		{"http://localhost", secret, false, false},
		{"http://10.0.0.5:9103", secret, false, true},
		{"http://projector-index:9103", secret, false, true},
		{"http://[::ffff:10.0.0.5]:9103", secret, false, true},
		{"http://0.0.0.0:9103", secret, false, true},
		{"http://10.0.0.5:9103", "", false, false},
		{"http://10.0.0.5:9103", secret, true, false},
		{"https://10.0.0.5:9103", secret, false, false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		err = auth.CheckSend(u, tc.token, tc.insecure)
		if (err != nil) != tc.refused {
			t.Errorf("CheckSend(%s, token %q, insecure %v) = %v, want refused %v", tc.url, tc.token, tc.insecure, err, tc.refused)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, auth.ErrPlainHTTP) {
			t.Errorf("the refusal is not ErrPlainHTTP: %v", err)
		}
		for _, want := range []string{u.Host, "https://" + u.Host, "-tls-ca", "-insecure-plain-http", auth.EnvInsecurePlainHTTP} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal does not name %q: %v", want, err)
			}
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the refusal holds the token: %v", err)
		}
	}
}

func TestBindFlagsInsecurePlainHTTP(t *testing.T) {
	t.Setenv(auth.EnvInsecurePlainHTTP, "true")
	f := config.NewFlags("svc")
	settings := auth.BindFlags(f)
	if err := f.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if s := settings(); !s.InsecurePlainHTTP || s.InsecureNoAuth {
		t.Fatalf("settings %+v, want InsecurePlainHTTP alone", s)
	}
	f = config.NewFlags("svc")
	settings = auth.BindFlags(f)
	if err := f.Parse([]string{"-insecure-plain-http=false"}); err != nil {
		t.Fatal(err)
	}
	if s := settings(); s.InsecurePlainHTTP {
		t.Fatalf("the flag does not override the environment: %+v", s)
	}
}
