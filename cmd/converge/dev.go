package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/natsauth"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/writer"
)

// devFlags binds the flags dev and demo share: where the pipeline keeps
// its state, which Postgres and NATS it uses, and the services' addresses.
// Every other setting of each service is read as that service's binary
// reads it: from its variables and the configuration file's section of
// the service (see stack.Config), -config naming the file.
func devFlags(f *config.Flags, defaults stack.Config) func() (stack.Config, error) {
	dataDir := f.String("data-dir", "", defaults.DataDir, "keep all state (Postgres, NATS, index, graph) here; empty: a temporary directory removed at exit")
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "use this Postgres (an administrator's URL) instead of a throwaway cluster")
	natsURL := f.String("nats-url", config.EnvNATSURL, "", "use this NATS server instead of an embedded one")
	httpAddr := f.String("http-addr", config.EnvHTTPAddr, defaults.HTTPAddr, "the writer's API")
	writerAddr := f.String("writer-metrics-addr", "", defaults.WriterAddr, "the writer's /metrics")
	relayAddr := f.String("relay-metrics-addr", "", defaults.RelayAddr, "the relay's /metrics")
	indexAddr := f.String("index-addr", envIndexAddr, defaults.IndexAddr, "the index projector's /metrics, search and verify")
	graphAddr := f.String("graph-addr", envGraphAddr, defaults.GraphAddr, "the graph projector's /metrics, graph and verify")
	notifierAddr := f.String("notifier-metrics-addr", "", defaults.NotifierAddr, "the notifier's /metrics (it runs when webhook URLs are set)")
	level := f.String("log-level", config.EnvLogLevel, "warn", "debug, info, warn or error")
	return func() (stack.Config, error) {
		c := defaults
		c.DataDir, c.PostgresURL, c.NATSURL, c.HTTPAddr = *dataDir, *pg, *natsURL, *httpAddr
		c.WriterAddr, c.RelayAddr, c.IndexAddr, c.GraphAddr, c.NotifierAddr = *writerAddr, *relayAddr, *indexAddr, *graphAddr, *notifierAddr
		c.ConfigFile = f.Lookup("config").Value.String()
		c.Log = config.NewLogger(os.Stderr, *level)
		c.LogOut = os.Stderr
		return c, nil
	}
}

var devDefaults = stack.Config{HTTPAddr: writer.DefaultHTTPAddr, WriterAddr: writer.DefaultMetricsAddr, RelayAddr: relay.DefaultMetricsAddr,
	IndexAddr: indexprojector.DefaultMetricsAddr, GraphAddr: graphprojector.DefaultMetricsAddr, NotifierAddr: notifier.DefaultMetricsAddr}

// dev runs the whole pipeline in this process until interrupted.
func dev(ctx context.Context, args []string, out io.Writer) error {
	f := config.NewFlags("converge dev")
	flags := devFlags(f, devDefaults)
	if err := f.Parse(args); err != nil {
		return err
	}
	cfg, err := flags()
	if err != nil {
		return err
	}
	// One process: every service's spans under the service name
	// converge-dev, told apart by their instrumentation scope.
	stopTracing, err := telemetry.StartTracing(ctx, "converge-dev", cfg.Log)
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(flush)
	}()
	fmt.Fprintln(out, "starting the pipeline (Postgres, NATS, writer, relay, index and graph projectors)...")
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		return err
	}
	notifies := "off (set CONVERGE_WEBHOOK_URLS and CONVERGE_WEBHOOK_SECRET to run it)"
	if s.Notifier != nil {
		notifies = fmt.Sprintf("posts to %d webhook URL(s); metrics on %s", len(s.Notifier.URLs), s.NotifierAddr)
	}
	pgWhere := redactURL(s.PostgresURL)
	if s.Cluster != nil {
		pgWhere += " (throwaway cluster)"
	}
	natsWho := "each service as its own user"
	operator := fmt.Sprintf("export %s=%s %s=%s", auth.EnvToken+"_FILE", s.OperatorTokenFile,
		config.EnvPostgresURL+"_FILE", s.ReaderURLFile)
	if s.OperatorNATSPasswordFile != "" {
		operator += fmt.Sprintf("\n                 export %s=%s %s=%s", natsauth.EnvUser, s.OperatorNATS.User,
			natsauth.EnvPassword+"_FILE", s.OperatorNATSPasswordFile)
	} else {
		natsWho = "given: its users are its operator's"
	}
	fmt.Fprintf(out, `
converge dev is running:
  writer API     %s      (PUT /v1/documents/{key}, POST /v1/documents:batch)
                 with the write token: curl -H "Authorization: Bearer $(cat %s)" ...
  postgres       %s
  roles          writer as %s, relay as %s; schema migrated as %s
  nats           %s (%s)
  index          %s (search: converge search "text")
  graph          %s (converge graph KEY)
  notifier       %s
  tokens         %s (operator: admin,read; writer-client: write)
  as operator    %s
                 then converge search, graph, verify, rebuild, backfill, status, replay and dlq work here
  verify         converge verify            (Postgres as %s, through %s_FILE)
  rebuild        converge rebuild index
  status         converge status -nats-url %s
  data           %s
Ctrl-C stops everything.
`, s.APIURL, s.WriterTokenFile, pgWhere, roles.Writer, roles.Relay, roles.Owner, s.NATSURL, natsWho, s.Index.Describe(), s.Graph.Describe(), notifies,
		s.TokensFile, operator, roles.Reader, config.EnvPostgresURL, s.NATSURL, s.DataDir)
	select {
	case <-ctx.Done():
	case <-s.Done():
	}
	fmt.Fprintln(out, "stopping...")
	return s.Stop()
}

// redactURL is u with its password, if any, shown as xxxxx: the banner
// names where Postgres is, never its credentials.
func redactURL(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(a Postgres URL that does not parse)"
	}
	return parsed.Redacted()
}
