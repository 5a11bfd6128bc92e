package stack_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/stack"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	vpostgres "github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// startStack starts the whole pipeline on embedded defaults, quiet, on
// free addresses, stopped when the test ends. No data directory: the
// stack makes a temporary one, and the throwaway cluster one the server's
// OS user may enter.
func startStack(t *testing.T, ctx context.Context) *stack.Stack {
	t.Helper()
	cfg := stack.Config{Log: slog.New(slog.DiscardHandler), LogOut: io.Discard}
	for _, a := range []*string{&cfg.HTTPAddr, &cfg.WriterAddr, &cfg.RelayAddr, &cfg.IndexAddr, &cfg.GraphAddr, &cfg.NotifierAddr} {
		addr, err := stack.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		*a = addr
	}
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

// waitInboxDrained waits until converge_inbox is empty: every row handed
// over applied (a refused row stays, and fails the wait).
func waitInboxDrained(t *testing.T, ctx context.Context, pool *pgxpool.Pool, what string) {
	t.Helper()
	testenv.Eventually(t, what+": every handed-over row applied", 3*time.Minute, func() bool {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM converge_inbox`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
}

// waitAgrees waits until verify finds the index and the graph of s in
// agreement with Postgres (pool).
func waitAgrees(t *testing.T, ctx context.Context, s *stack.Stack, pool *pgxpool.Pool, what string) {
	t.Helper()
	testenv.Eventually(t, what+": verify agrees", 3*time.Minute, func() bool {
		res, err := verify.Run(ctx, &vpostgres.Postgres{Pool: pool}, []verify.Projection{
			{Kind: verify.Index, Side: &verify.Remote{Label: "index", Addr: s.IndexAddr, Token: s.OperatorToken}},
			{Kind: verify.Graph, Side: &verify.Remote{Label: "graph", Addr: s.GraphAddr, Token: s.OperatorToken}},
		}, verify.DefaultBuckets, nil)
		return err == nil && res.Agrees
	})
}

// waitStreamHoldsOutbox waits until the documents' stream holds as many
// messages as the outbox has rows (a count: what proves agreement is
// waitAgrees).
func waitStreamHoldsOutbox(t *testing.T, ctx context.Context, s *stack.Stack, pool *pgxpool.Pool) {
	t.Helper()
	opts, err := s.OperatorNATS.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.NATSURL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the stream to hold every event of the outbox", 3*time.Minute, func() bool {
		var outbox uint64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&outbox); err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs == outbox
	})
}
