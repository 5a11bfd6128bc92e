package indexprojector_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/index"
	"github.com/converge-sync/converge/internal/index/qdranttest"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/testenv"
)

// storeConfig parses args, with env set first, as projector-index does.
func storeConfig(t *testing.T, env map[string]string, args ...string) *indexprojector.Config {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	f := config.NewFlags("projector-index")
	get := indexprojector.Flags(f)
	if err := f.Parse(args); err != nil {
		t.Fatal(err)
	}
	return get()
}

// TestQdrantCARefusesWhatHoldsNoCertificate checks that -qdrant-ca (and
// CONVERGE_QDRANT_CA) fails at start, naming the flag and its variable,
// for a file that is missing, one that holds no PEM certificate, and a
// plain http:// address, which it would contradict.
func TestQdrantCARefusesWhatHoldsNoCertificate(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := testenv.NewCertificates(t)
	for _, c := range []struct {
		what string
		env  map[string]string
		args []string
		says string
	}{
		{"a missing file", nil, []string{"-qdrant-url", "127.0.0.1:6334", "-qdrant-ca", filepath.Join(dir, "missing.pem")}, "no such file"},
		{"a missing file in the variable", map[string]string{indexprojector.EnvQdrantCA: filepath.Join(dir, "missing.pem")},
			[]string{"-qdrant-url", "127.0.0.1:6334"}, "no such file"},
		// What a file may hold is telemetry.TrustCAFile's (TestTrustCAFile).
		{"a file without PEM", nil, []string{"-qdrant-url", "127.0.0.1:6334", "-qdrant-ca", notPEM}, "holds no PEM certificate"},
		{"a plain http:// address", nil, []string{"-qdrant-url", "http://127.0.0.1:6334", "-qdrant-ca", certs.CAFile}, "plain http://"},
	} {
		t.Run(c.what, func(t *testing.T) {
			cfg := storeConfig(t, c.env, c.args...)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), "-qdrant-ca ("+indexprojector.EnvQdrantCA+")") || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Validate: %v; want an error naming -qdrant-ca (%s) and saying %q", err, indexprojector.EnvQdrantCA, c.says)
			}
			if err := (indexprojector.ServiceConfig{Store: *cfg}).Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("the projector's Validate: %v; want it to say %q", err, c.says)
			}
			if _, err := indexprojector.NewStores(context.Background(), cfg, index.Options{}, nil); err == nil {
				t.Fatal("NewStores accepted the configuration")
			}
		})
	}
	if err := storeConfig(t, nil, "-qdrant-url", "127.0.0.1:6334", "-qdrant-ca", certs.CAFile).Validate(); err != nil {
		t.Errorf("Validate with the CA: %v", err)
	}
}

// TestQdrantCAImpliesTLS connects to a Qdrant (the model) behind a TLS
// front: with -qdrant-ca alone (no -qdrant-tls, an address without a
// scheme) the stores connect over TLS and trust that CA; without it the
// plain connection fails, and with another CA the certificate is refused.
func TestQdrantCAImpliesTLS(t *testing.T) {
	certs, other := testenv.NewCertificates(t), testenv.NewCertificates(t)
	srv := qdranttest.Start(t)
	front := testenv.GRPCTLSFront(t, certs, srv.Addr())
	open := func(ca string) error {
		cfg := storeConfig(t, map[string]string{indexprojector.EnvQdrantCA: ca},
			"-qdrant-url", front, "-qdrant-collection", "chunks", "-data-dir", t.TempDir())
		s, err := indexprojector.NewStores(context.Background(), cfg, index.Options{}, nil)
		if err != nil {
			return err
		}
		defer s.Close()
		_, err = s.Live(context.Background())
		return err
	}
	if err := open(certs.CAFile); err != nil {
		t.Fatalf("with CONVERGE_QDRANT_CA of the front's CA: %v", err)
	}
	if err := open(""); err == nil {
		t.Error("without a CA (plain gRPC) the TLS front was reached")
	}
	if err := open(other.CAFile); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("with another CA: %v; want a certificate error", err)
	}
}
