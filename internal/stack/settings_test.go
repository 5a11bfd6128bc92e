package stack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
)

// testStack is a stack whose infrastructure is only named, for settings.
func testStack(t *testing.T, cfg Config) *Stack {
	t.Helper()
	dir := t.TempDir()
	cfg.DataDir = dir
	cfg.HTTPAddr, cfg.WriterAddr, cfg.RelayAddr = "127.0.0.1:18080", "127.0.0.1:19101", "127.0.0.1:19102"
	cfg.IndexAddr, cfg.GraphAddr, cfg.NotifierAddr = "127.0.0.1:19103", "127.0.0.1:19104", "127.0.0.1:19105"
	s := &Stack{Config: cfg, NATSURL: "nats://127.0.0.1:4999",
		WriterURL: "postgres://converge_writer:w@127.0.0.1:5999/converge", RelayURL: "postgres://converge_relay:r@127.0.0.1:5999/converge",
		TokensFile: filepath.Join(dir, "tokens")}
	if err := s.makeNATSUsers(); err != nil {
		t.Fatal(err)
	}
	return s
}

// A stack's services read every setting the stack does not give them as
// their binaries read it: from their variables and from their sections of
// the configuration file; the stack gives each its connections,
// addresses, tokens and NATS user, and the relay leaves the process's
// collector alone. A setting honoured by a binary is honoured by `converge
// dev` and `demo`.
func TestServicesReadTheirSettingsAsTheirBinariesDo(t *testing.T) {
	// Variables of the operator's shell: dev's own Postgres URL (which
	// no projector may hold), the operator's NATS user, and services'
	// settings.
	t.Setenv(config.EnvPostgresURL, "postgres://admin:secret@127.0.0.1:5999/converge")
	t.Setenv(natsauth.EnvUser, "operator")
	t.Setenv(natsauth.EnvPassword, "the-operator's")
	t.Setenv("CONVERGE_EMBED_DIM", "64")
	t.Setenv("CONVERGE_QDRANT_TLS", "true")
	t.Setenv("CONVERGE_QDRANT_COLLECTION", "from_env") // beats the file's
	t.Setenv("CONVERGE_RELAY_GOGC", "50")
	t.Setenv("CONVERGE_WRITER_BATCH_SIZE", "77")
	for _, k := range []string{notifier.EnvWebhookURLs, notifier.EnvWebhookSecret, config.EnvConfig} {
		t.Setenv(k, "")
		os.Unsetenv(k) //nolint:errcheck // restored by t.Setenv
	}
	file := filepath.Join(t.TempDir(), "converge.yaml")
	if err := os.WriteFile(file, []byte(`
common:
  replicas: 3
relay:
  window: 8192
  stream-history: 9
projector-index:
  qdrant-collection: from_file
  qdrant-batch: 64
projector-graph:
  neo4j-batch: 33
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := testStack(t, Config{ConfigFile: file})
	svc, err := s.settings()
	if err != nil {
		t.Fatal(err)
	}

	w := svc.writer
	if w.PostgresURL != s.WriterURL || w.NATSURL != s.NATSURL || w.HTTPAddr != s.HTTPAddr || w.MetricsAddr != s.WriterAddr ||
		w.TokensFile != s.TokensFile || w.API.BatchSize != 77 {
		t.Errorf("writer: %+v", w)
	}
	if w.Ingest.Replicas != 3 {
		t.Errorf("writer: the ingest stream's replicas %d, want common's 3", w.Ingest.Replicas)
	}
	if w.NATSAuth.User != natsauth.UserWriter || w.NATSAuth.Password != s.natsPasswords[natsauth.UserWriter] {
		t.Errorf("writer's NATS user %q, its password given: %v", w.NATSAuth.User, w.NATSAuth.Password == s.natsPasswords[natsauth.UserWriter])
	}

	r := svc.relay
	if r.Relay.PostgresURL != s.RelayURL || r.MetricsAddr != s.RelayAddr || r.Relay.Window != 8192 ||
		r.Relay.Stream.MaxMsgsPerSubject != 9 || r.Relay.Stream.Replicas != 3 || r.Relay.Effects.Enabled {
		t.Errorf("relay: %+v", r.Relay)
	}
	if r.GOGC != 0 || r.MemoryLimit != 0 {
		t.Errorf("the relay tunes the stack's process's collector: GOGC %d, limit %d", r.GOGC, r.MemoryLimit)
	}
	if r.NATSAuth.User != natsauth.UserRelay {
		t.Errorf("relay's NATS user %q", r.NATSAuth.User)
	}

	ix := svc.index
	if ix.Store.Embed.Dimension != 64 || !ix.Store.QdrantTLS || ix.Store.QdrantCollection != "from_env" ||
		ix.Store.QdrantBatch != 64 || ix.Store.DataDir != s.DataDir {
		t.Errorf("index store: %+v", ix.Store)
	}
	if ix.Projector.MetricsAddr != s.IndexAddr || ix.Projector.Runtime.Name != "index" || ix.Projector.Runtime.Replicas != 3 ||
		ix.Projector.NATSAuth.User != natsauth.UserIndex || ix.Projector.Security.TokensFile != s.TokensFile {
		t.Errorf("index projector: %+v", ix.Projector)
	}
	if s.Index != &svc.index.Store && *s.Index != svc.index.Store {
		t.Errorf("Config.Index is not the index's settings")
	}
	g := svc.graph
	if g.Store.Neo4jBatch != 33 || g.Projector.MetricsAddr != s.GraphAddr || g.Projector.NATSAuth.User != natsauth.UserGraph {
		t.Errorf("graph: %+v", g)
	}
	if svc.notifier != nil || s.Notifier != nil {
		t.Error("a notifier runs without webhook URLs")
	}

	// A test's stores replace the stores' settings, in the stack's
	// directory.
	s = testStack(t, Config{Index: &indexprojector.Config{QdrantURL: "127.0.0.1:6334"}})
	if svc, err = s.settings(); err != nil {
		t.Fatal(err)
	}
	if svc.index.Store.QdrantURL != "127.0.0.1:6334" || svc.index.Store.DataDir != s.DataDir || svc.index.Store.QdrantCollection != "" {
		t.Errorf("given index: %+v", svc.index.Store)
	}
}

// The notifier runs when the environment or the configuration file names
// webhook URLs, with every other setting of its own read as its binary
// reads them; the relay then publishes the effects' stream.
func TestNotifierRunsWhereWebhooksAreConfigured(t *testing.T) {
	for _, k := range []string{notifier.EnvWebhookURLs, config.EnvConfig} {
		t.Setenv(k, "")
		os.Unsetenv(k) //nolint:errcheck // restored by t.Setenv
	}
	t.Setenv(notifier.EnvWebhookSecret, "shh")
	t.Setenv("CONVERGE_NOTIFIER_MAX_ATTEMPTS", "7")
	file := filepath.Join(t.TempDir(), "converge.yaml")
	if err := os.WriteFile(file, []byte("notifier:\n  webhook-urls: https://hooks.example.com/a\n  window: 2h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := testStack(t, Config{ConfigFile: file})
	svc, err := s.settings()
	if err != nil {
		t.Fatal(err)
	}
	n := svc.notifier
	if n == nil || s.Notifier == nil {
		t.Fatal("no notifier")
	}
	if strings.Join(n.Notifier.URLs, ",") != "https://hooks.example.com/a" || string(n.Notifier.Secret) != "shh" ||
		n.Notifier.Window != 2*time.Hour || n.Notifier.MaxAttempts != 7 || n.Projector.MetricsAddr != s.NotifierAddr ||
		n.Projector.NATSAuth.User != natsauth.UserNotifier {
		t.Errorf("notifier: %+v", n)
	}
	if !svc.relay.Relay.Effects.Enabled {
		t.Error("the relay does not publish the effects' stream for the notifier")
	}

	// A bad setting of a service is refused, naming the service.
	if err := os.WriteFile(file, []byte("notifier:\n  webhook-urls: https://hooks.example.com/a\n  window: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := testStack(t, Config{ConfigFile: file}).settings(); err == nil || !strings.Contains(err.Error(), "notifier") ||
		!strings.Contains(err.Error(), "window") {
		t.Fatalf("a bad window: %v", err)
	}
}
