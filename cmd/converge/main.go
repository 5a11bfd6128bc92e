// Command converge is the operator's tool: schema migrations, status,
// verification and repair, backfill, replay, dead letters, and the
// pipeline on embedded defaults (dev, demo).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/version"
	"github.com/converge-sync/converge/internal/writer"
)

const usage = `converge: operate a converge pipeline

Usage:
  converge migrate up        apply pending schema migrations (a no-op when current) and
                             create the relay's replication slot if missing
  converge migrate status    show the applied and the newest schema version
  converge roles apply [--print] -postgres-url ADMIN_URL [-database converge]
                             create or correct converge's Postgres roles (converge_owner, converge_writer,
                             converge_relay, converge_reader) and their privileges, as an administrator;
                             passwords from CONVERGE_{OWNER,WRITER,RELAY,READER}_PASSWORD(_FILE);
                             --print shows the statements (no passwords) and applies nothing
  converge streams apply [-nats-url URL] [-stream-history N] [-effects] [-partitions N] [...]
                             create converge's streams and shared buckets, or bring them to the
                             relay's stream settings (the relay's flags and environment), as the
                             operator: the services create them when absent and never change them;
                             -partitions N adds the partitioned stream of projectors run in N partitions
  converge status [--json]   the relay's slot (state, confirmed LSN, lag), the outbox and the streams
  converge search TEXT [-k N] [--json] [-after KEY@VERSION [-wait 5s]]
                             the index's chunks nearest to TEXT, asked of the index projector
                             (-index-addr, env CONVERGE_PROJECTOR_INDEX_ADDR, default 127.0.0.1:9103)
  converge verify [--json] [-stores index,graph] [--repair [-writer-url URL] [-repair-timeout 2m]]
                             prove that the index and the graph agree with Postgres, document by
                             document (bucket digests; exit 0 only when every store agrees); with
                             --repair, re-emit every document Postgres can repair through the writer
                             and wait until the stores agree; -watch verifies continuously at a set
                             pace, with metrics and /v1/verify/status (docs/verification.md)
  converge backfill --keys k1,k2,... | --all [-after KEY] [-limit N] [-writer-url URL] [--json]
                             re-emit documents through the writer (-writer-url, env CONVERGE_WRITER_URL,
                             default http://127.0.0.1:8080): their current version's event is relayed
                             again and every projection rewrites it
  converge replay PROJECTOR --from-seq N | --from-time T [-partitions N [-partition P]]
                             move a projector's consumer back (each of its partitions' consumers);
                             it receives every event from there again and skips what its store holds
  converge rebuild index|graph [--json] [-no-verify] [-timeout D]
                             rebuild a projection from the stream's start while live traffic
                             continues (the index and the embedded graph blue/green, with an atomic
                             switch; Neo4j in place after a wipe), asked of its projector; resumed
                             if the projector restarts; then verify the rebuilt store
  converge dlq list|show|redrive
                             dead letters of each consumer: list them, show one consumer's, and
                             send them back to their stream once the cause is fixed (converge dlq help)
  converge console [-addr 127.0.0.1:9107]
                             the operator's web page: the pipeline's picture with lag and rate at
                             every stage, each store's agreement, dead letters (redriven by an admin
                             token), leases, partitions and rebuilds, live (docs/console.md)
  converge graph KEY [--json] [-after KEY@VERSION [-wait 5s]]
                             the document as the graph holds it: node, chunks, links out and in, tags,
                             asked of the graph projector (-graph-addr, env CONVERGE_PROJECTOR_GRAPH_ADDR,
                             default 127.0.0.1:9104)
  converge dev               the whole pipeline in this process on embedded defaults (a throwaway
                             PostgreSQL, an embedded NATS, the embedded index and graph; the
                             notifier when CONVERGE_WEBHOOK_URLS is set), until Ctrl-C
  converge demo [-docs N]    dev, plus a sample corpus, a redelivery, a killed and restarted projector,
                             a search and a graph query, a rebuild of the index, verify, ending in
                             a convergence report
  converge projector-index | projector-graph | notifier
                             run a projector or the notifier (the same as the binaries of those names)
  converge source apply|sql|status
                             map tables a team already has to documents (the configuration file's
                             sources section): triggers hand changed rows over, the writer applies
                             them (converge source help, docs/sources.md)
  converge config check FILE check a deployment's configuration file: each setting one of the
                             flags of the commands reading its section (docs/configuration.md)
  converge config docs       every command's settings, flags, variables and defaults, in Markdown
  converge version [--json]  the build: module version, commit, Go version (every binary: -version)

Every command reads the deployment's configuration file named by -config (env CONVERGE_CONFIG):
flags win over variables, variables over the file. Every command that reads Postgres takes -postgres-url (env CONVERGE_POSTGRES_URL);
status, replay and dlq also -nats-url (env CONVERGE_NATS_URL). The commands that call a
service's API send the token of CONVERGE_TOKEN (or CONVERGE_TOKEN_FILE), reach https://
addresses trusting the CAs of -tls-ca (env CONVERGE_TLS_CA; default: the system's roots),
and refuse to send the token over plain http:// beyond loopback unless -insecure-plain-http
(env CONVERGE_INSECURE_PLAIN_HTTP). "converge COMMAND -h" lists a command's flags.
`

func main() {
	ctx, stop := service.SignalContext()
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	service.Exit("converge", err)
}

func run(ctx context.Context, args []string, out io.Writer) error {
	return trustHint(dispatch(ctx, args, out))
}

func dispatch(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(out, usage)
		return nil
	}
	switch args[0] {
	case "version", "-version", "--version":
		return versionCmd(args[1:], out)
	case "status":
		return status(ctx, args[1:], out)
	case "search":
		return search(ctx, args[1:], out)
	case "graph":
		return graphDoc(ctx, args[1:], out)
	case "verify":
		return verifyCmd(ctx, args[1:], out)
	case "backfill":
		return backfill(ctx, args[1:], out)
	case "replay":
		return replay(ctx, args[1:], out)
	case "rebuild":
		return rebuildCmd(ctx, args[1:], out)
	case "dlq":
		return dlqCmd(ctx, args[1:], out)
	case "console":
		return consoleCmd(ctx, args[1:], out)
	case "dev":
		return dev(ctx, args[1:], out)
	case "demo":
		return demo(ctx, args[1:], out)
	case "notifier":
		return service.Command(ctx, "notifier", args[1:], notifier.ServiceFlags, notifier.Run)
	case "projector-index":
		return service.Command(ctx, "projector-index", args[1:], indexprojector.ServiceFlags, indexprojector.Run)
	case "projector-graph":
		return service.Command(ctx, "projector-graph", args[1:], graphprojector.ServiceFlags, graphprojector.Run)
	case "streams":
		return streamsCmd(ctx, args[1:], out)
	case "config":
		return configCmd(args[1:], out)
	case "roles":
		return rolesCmd(ctx, args[1:], out)
	case "source":
		return sourceCmd(ctx, args[1:], out)
	case "migrate":
		if len(args) < 2 {
			return fmt.Errorf("migrate needs a subcommand: up or status\n\n%s", usage)
		}
		return migrate(ctx, args[1], args[2:], out)
	default:
		return fmt.Errorf("unknown command %q\n\n%s", args[0], usage)
	}
}

func migrate(ctx context.Context, sub string, args []string, out io.Writer) error {
	f := config.NewFlags("converge migrate " + sub)
	pg := f.String("postgres-url", config.EnvPostgresURL, "", "Postgres URL")
	slot := f.String("slot", "CONVERGE_RELAY_SLOT", relay.DefaultSlot, "the relay's replication slot, created by up so that no event written before the relay's first start is missed (empty: don't create)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if err := config.Require(*pg, "postgres-url", config.EnvPostgresURL); err != nil {
		return err
	}
	switch sub {
	case "up":
		st, err := schema.Up(ctx, *pg)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "schema at version %d (newest %d)\n", st.Version, st.Latest)
		if *slot == "" {
			return nil
		}
		created, err := schema.EnsureSlot(ctx, *pg, *slot)
		if err != nil {
			return err
		}
		if created {
			fmt.Fprintf(out, "replication slot %s created: every event from now on will be relayed (the slot retains WAL until a relay consumes it)\n", *slot)
		} else {
			fmt.Fprintf(out, "replication slot %s exists\n", *slot)
		}
		return nil
	case "status":
		st, err := schema.Inspect(ctx, *pg)
		if err != nil {
			return err
		}
		state := "current"
		switch {
		case st.Dirty:
			state = "DIRTY: a migration was interrupted; `converge migrate up` (or a writer started with -migrate) settles it and goes on"
		case st.Version < st.Latest:
			state = "behind: run `converge migrate up`"
		}
		fmt.Fprintf(out, "schema at version %d, newest %d: %s\n", st.Version, st.Latest, state)
		if !st.Current() {
			return errors.New("schema is not current")
		}
		return nil
	default:
		return fmt.Errorf("unknown migrate subcommand %q: use up or status", sub)
	}
}

// apiAccess is how a command reaches the services' HTTP APIs: the bearer
// token it sends, the CA of their https:// addresses (-tls-ca) and whether
// the token may go over plain HTTP beyond loopback (-insecure-plain-http).
type apiAccess struct {
	auth.ClientSettings
	token string
}

// bindAPIAccess binds -tls-ca and -insecure-plain-http; the returned
// function, called after parsing, reads the token from token.
func bindAPIAccess(f *config.Flags, token tokenSource) func() (apiAccess, error) {
	settings := auth.BindClientFlags(f)
	return func() (apiAccess, error) {
		tok, err := token()
		return apiAccess{ClientSettings: settings(), token: tok}, err
	}
}

// httpClient is a client with the timeout that trusts -tls-ca.
func (a apiAccess) httpClient(timeout time.Duration) (*http.Client, error) {
	hc, err := a.HTTPClient(timeout)
	if err != nil {
		return nil, service.Usage("%v", err)
	}
	return hc, nil
}

// writer is the client of the writer at base (-writer-url), sending the
// token; a token that would go over plain HTTP beyond loopback is refused
// here, before any request.
func (a apiAccess) writer(base string) (*writer.Client, error) {
	hc, err := a.httpClient(5 * time.Minute)
	if err != nil {
		return nil, err
	}
	c, err := writer.NewClient(base, hc)
	if err != nil {
		return nil, service.Usage("-writer-url must be http://host:port or https://..., got %q", base)
	}
	u, err := auth.BaseURL(c.URL())
	if err != nil {
		return nil, service.Usage("-writer-url: %v", err)
	}
	if err := auth.CheckSend(u, a.token, a.InsecurePlainHTTP); err != nil {
		return nil, err
	}
	c.Token = a.token
	return c, nil
}

// versionCmd prints the build of this binary (internal/version).
func versionCmd(args []string, out io.Writer) error {
	f := config.NewFlags("converge version")
	asJSON := f.Bool("json", "", false, "machine-readable output")
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return service.Usage("version takes no arguments, got %q", f.Args())
	}
	if *asJSON {
		return writeJSON(out, version.Get())
	}
	_, err := fmt.Fprintln(out, version.Get())
	return err
}
