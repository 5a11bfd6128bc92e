package graphprojector_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/testenv"
)

// storeConfig parses args, with env set first, as projector-graph does.
func storeConfig(t *testing.T, env map[string]string, args ...string) *graphprojector.Config {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	f := config.NewFlags("projector-graph")
	get := graphprojector.Flags(f)
	if err := f.Parse(args); err != nil {
		t.Fatal(err)
	}
	return get()
}

// TestNeo4jCARefusesWhatCannotVerify checks that -neo4j-ca (and
// CONVERGE_NEO4J_CA) fails at start, naming the flag and its variable,
// for a file that is missing, one that holds no PEM certificate, and a
// URL whose scheme would ignore it: bolt:// has no TLS, bolt+ssc://
// verifies no certificate.
func TestNeo4jCARefusesWhatCannotVerify(t *testing.T) {
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
		{"a missing file", nil, []string{"-neo4j-url", "bolt+s://127.0.0.1:7687", "-neo4j-ca", filepath.Join(dir, "missing.pem")}, "no such file"},
		{"a missing file in the variable", map[string]string{graphprojector.EnvNeo4jCA: filepath.Join(dir, "missing.pem")},
			[]string{"-neo4j-url", "neo4j+s://127.0.0.1:7687"}, "no such file"},
		// What a file may hold is telemetry.TrustCAFile's (TestTrustCAFile).
		{"a file without PEM", nil, []string{"-neo4j-url", "bolt+s://127.0.0.1:7687", "-neo4j-ca", notPEM}, "holds no PEM certificate"},
		{"a bolt:// URL", nil, []string{"-neo4j-url", "bolt://127.0.0.1:7687", "-neo4j-ca", certs.CAFile}, "bolt+s:// or neo4j+s://"},
		{"a bolt+ssc:// URL", nil, []string{"-neo4j-url", "bolt+ssc://127.0.0.1:7687", "-neo4j-ca", certs.CAFile}, "bolt+s:// or neo4j+s://"},
	} {
		t.Run(c.what, func(t *testing.T) {
			cfg := storeConfig(t, c.env, c.args...)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), "-neo4j-ca ("+graphprojector.EnvNeo4jCA+")") || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Validate: %v; want an error naming -neo4j-ca (%s) and saying %q", err, graphprojector.EnvNeo4jCA, c.says)
			}
			if err := (graphprojector.ServiceConfig{Store: *cfg}).Validate(); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("the projector's Validate: %v; want it to say %q", err, c.says)
			}
			if _, err := graphprojector.NewStores(cfg, nil).Open(context.Background(), "neo4j"); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("Open: %v; want it to say %q", err, c.says)
			}
		})
	}
	for _, url := range []string{"bolt+s://127.0.0.1:7687", "neo4j+s://127.0.0.1:7687"} {
		if err := storeConfig(t, nil, "-neo4j-url", url, "-neo4j-ca", certs.CAFile).Validate(); err != nil {
			t.Errorf("Validate with the CA and %s: %v", url, err)
		}
	}
}

// TestNeo4jCAIsTrusted opens the test Neo4j server's database over its
// Bolt TLS: with -neo4j-ca of the server's CA it connects, with another
// CA (CONVERGE_NEO4J_CA) the server's certificate is refused.
func TestNeo4jCAIsTrusted(t *testing.T) {
	n := testenv.LeaseNeo4j(t)
	if n.CA == "" {
		t.Fatalf("the test Neo4j server at %s offers no Bolt TLS", n.URL)
	}
	other := testenv.NewCertificates(t)
	open := func(env map[string]string, args ...string) error {
		cfg := storeConfig(t, env, append([]string{"-neo4j-url", n.TLSURL(), "-neo4j-user", n.User, "-neo4j-password", n.Password}, args...)...)
		g, err := graphprojector.NewStores(cfg, nil).Open(context.Background(), "neo4j")
		if err != nil || g.Close == nil {
			return err
		}
		return g.Close()
	}
	if err := open(nil, "-neo4j-ca", n.CA); err != nil {
		t.Fatalf("with -neo4j-ca of the server's CA: %v", err)
	}
	if err := open(map[string]string{graphprojector.EnvNeo4jCA: other.CAFile}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("with another CA: %v; want the server's certificate refused", err)
	}
}
