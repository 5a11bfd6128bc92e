package service_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
	"github.com/converge-sync/converge/internal/notifier"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/service"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/writer"
)

// command runs one service's command line as its binary would, with a
// context that is already canceled: a command line that parses and
// validates stops at once, cleanly.
type command func(ctx context.Context, args []string) error

func commands() map[string]command {
	return map[string]command{
		"writer": func(ctx context.Context, args []string) error {
			return service.Command(ctx, "writer", args, writer.Flags, writer.Run)
		},
		"relay": func(ctx context.Context, args []string) error {
			return service.Command(ctx, "relay", args, relay.Flags, relay.Run)
		},
		"projector-index": func(ctx context.Context, args []string) error {
			return service.Command(ctx, "projector-index", args, indexprojector.ServiceFlags, indexprojector.Run)
		},
		"projector-graph": func(ctx context.Context, args []string) error {
			return service.Command(ctx, "projector-graph", args, graphprojector.ServiceFlags, graphprojector.Run)
		},
		"notifier": func(ctx context.Context, args []string) error {
			return service.Command(ctx, "notifier", args, notifier.ServiceFlags, notifier.Run)
		},
	}
}

func clearEnv(t *testing.T) {
	for _, env := range []string{config.EnvPostgresURL, config.EnvNATSURL, notifier.EnvWebhookURLs, notifier.EnvWebhookSecret} {
		t.Setenv(env, "")
	}
}

// Every service refuses a command line that lacks what it needs with a
// usage error (exit 2) naming the flag, and answers -h with flag.ErrHelp
// (exit 0).
func TestEveryServiceNamesWhatItLacks(t *testing.T) {
	clearEnv(t)
	want := map[string]string{
		"writer":          "-postgres-url",
		"relay":           "-postgres-url",
		"projector-index": "-nats-url",
		"projector-graph": "-nats-url",
		"notifier":        "-nats-url",
	}
	for name, run := range commands() {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), nil)
			if err == nil || !strings.Contains(err.Error(), want[name]) {
				t.Fatalf("without settings: %v, want an error naming %s", err, want[name])
			}
			var out bytes.Buffer
			if code := service.ExitCode(name, err, &out); code != 2 || !strings.HasPrefix(out.String(), name+": ") {
				t.Fatalf("exit %d, printed %q: want 2 and the error prefixed by the command", code, out.String())
			}
			err = run(context.Background(), []string{"-no-such-flag"})
			if code := service.ExitCode(name, err, &bytes.Buffer{}); code != 2 {
				t.Fatalf("an unknown flag: exit %d (%v), want 2", code, err)
			}
			err = run(context.Background(), []string{"-h"})
			if !errors.Is(err, flag.ErrHelp) || service.ExitCode(name, err, &bytes.Buffer{}) != 0 {
				t.Fatalf("-h: %v", err)
			}
		})
	}
}

func TestNotifierNeedsWebhooks(t *testing.T) {
	clearEnv(t)
	t.Setenv(config.EnvNATSURL, "nats://127.0.0.1:1")
	t.Setenv(notifier.EnvWebhookSecret, "s")
	err := commands()["notifier"](context.Background(), []string{"-metrics-addr", ""})
	if err == nil || !strings.Contains(err.Error(), notifier.EnvWebhookURLs) || !service.IsUsage(err) {
		t.Fatalf("without webhook URLs: %v", err)
	}
}

// A service whose connection fails says which, and is a failure (exit 1),
// not a usage error.
func TestUnreachableNATSIsAFailure(t *testing.T) {
	clearEnv(t)
	err := commands()["projector-graph"](context.Background(), []string{"-nats-url", "nats://127.0.0.1:1", "-data-dir", t.TempDir(), "-metrics-addr", ""})
	if err == nil || !strings.Contains(err.Error(), "connect nats") || service.IsUsage(err) {
		t.Fatalf("unreachable NATS: %v", err)
	}
	if code := service.ExitCode("projector-graph", err, &bytes.Buffer{}); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
}

// Run of a projector on a real NATS server stops cleanly when its context
// ends, and a stop while starting is not a failure either.
func TestRunStopsCleanly(t *testing.T) {
	clearEnv(t)
	n := testenv.StartNATS(t)
	args := []string{"-nats-url", n.URL, "-data-dir", t.TempDir(), "-metrics-addr", ""}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := commands()["projector-graph"](canceled, args); err != nil {
		t.Fatalf("stopped before it started: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := commands()["projector-graph"](ctx, args); err != nil {
		t.Fatalf("stopped after running: %v", err)
	}
}

// Dial names the connection that failed when no server listens, and
// opens NATS, named after the client, and its JetStream context when one
// does.
func TestDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	log := slog.New(slog.DiscardHandler)
	if _, _, err := service.Dial(context.Background(), service.Conns{NATSURL: "nats://" + closed}, log); err == nil || !strings.Contains(err.Error(), "connect nats") {
		t.Fatalf("Dial of %s, where nothing listens: %v, want a connect nats error", closed, err)
	}
	n := testenv.StartNATS(t)
	deps, closeDeps, err := service.Dial(context.Background(), service.Conns{Client: "converge-test", NATSURL: n.URL}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeDeps()
	if deps.Postgres != nil || deps.Registry == nil || deps.NATS.Opts.Name != "converge-test" {
		t.Fatalf("Dial of NATS alone: pool %v, registry %v, connection named %q", deps.Postgres, deps.Registry, deps.NATS.Opts.Name)
	}
	js, err := deps.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("JetStream over the connection: %v", err)
	}
}

type noConns struct{}

func (noConns) Validate() error            { return nil }
func (noConns) Connections() service.Conns { return service.Conns{} }

// A stop is no failure, but what fails on the way out is: Run returns it.
func TestRunReturnsWhatFailsOnTheWayOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	log := slog.New(slog.DiscardHandler)
	if err := service.Run(ctx, noConns{}, log, func(ctx context.Context, _ noConns, _ service.Deps) error {
		return fmt.Errorf("serve: %w", ctx.Err())
	}); err != nil {
		t.Fatalf("a stop: %v", err)
	}
	cutOff := errors.New("requests cut off: the grace ran out")
	if err := service.Run(ctx, noConns{}, log, func(context.Context, noConns, service.Deps) error { return cutOff }); !errors.Is(err, cutOff) {
		t.Fatalf("a failure while stopping: %v", err)
	}
}

// Hand-made Deps without a registry or a logger get their own.
func TestDepsWithDefaults(t *testing.T) {
	d := service.Deps{}.WithDefaults()
	if d.Registry == nil || d.Log == nil {
		t.Fatalf("defaults: %+v", d)
	}
}
