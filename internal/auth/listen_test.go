package auth_test

import (
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/auth"
)

func TestCheckListen(t *testing.T) {
	tokens, err := auth.Load(tokensFile(t, threeTokens))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr     string
		tokens   *auth.Tokens
		insecure bool
		refused  bool
	}{
		{"127.0.0.1:8080", nil, false, false},
		{"127.1.2.3:0", nil, false, false},
		{"[::1]:8080", nil, false, false},
		{"localhost:8080", nil, false, false},
		{"0.0.0.0:8080", nil, false, true},
		{":8080", nil, false, true},
		{"[::]:8080", nil, false, true},
		{"10.0.0.5:8080", nil, false, true},
		{"writer.internal:8080", nil, false, true},
		{"127.0.0.1", nil, false, true}, // no port: not an address to trust
		{"0.0.0.0:8080", &auth.Tokens{}, false, true},
		{"0.0.0.0:8080", tokens, false, false},
		{"0.0.0.0:8080", nil, true, false},
	} {
		err := auth.CheckListen(tc.addr, tc.tokens, tc.insecure)
		if (err != nil) != tc.refused {
			t.Errorf("CheckListen(%q, %d tokens, insecure %v) = %v, want refused %v", tc.addr, tc.tokens.Len(), tc.insecure, err, tc.refused)
		}
		if err != nil && (!strings.Contains(err.Error(), tc.addr) || !strings.Contains(err.Error(), "-insecure-no-auth") ||
			!strings.Contains(err.Error(), "-tokens-file")) {
			t.Errorf("the refusal does not name the address and the flags: %v", err)
		}
	}
}
