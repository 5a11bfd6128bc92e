package auth_test

import (
	"testing"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
)

func TestBindFlags(t *testing.T) {
	path := tokensFile(t, threeTokens)
	t.Setenv(auth.EnvTokensFile, path)
	t.Setenv("CONVERGE_TLS_CERT", "/etc/tls/cert.pem")
	f := config.NewFlags("svc")
	settings := auth.BindFlags(f)
	if err := f.Parse([]string{"-tls-key", "/etc/tls/key.pem", "-insecure-no-auth"}); err != nil {
		t.Fatal(err)
	}
	s := settings()
	if s != (auth.Settings{TokensFile: path, TLSCert: "/etc/tls/cert.pem", TLSKey: "/etc/tls/key.pem", InsecureNoAuth: true}) {
		t.Fatalf("settings %+v", s)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if tokens, err := s.Tokens(); err != nil || tokens.Len() != 3 {
		t.Fatalf("tokens: %d, %v", tokens.Len(), err)
	}
	if tokens, err := (auth.Settings{}).Tokens(); tokens != nil || err != nil {
		t.Fatalf("no tokens file: %v, %v", tokens, err)
	}
	if err := (auth.Settings{TLSKey: "k"}).Validate(); err == nil {
		t.Fatal("a key without its certificate is valid")
	}
}
