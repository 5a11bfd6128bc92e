package roles_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/docstore"
	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/roles"
	"github.com/converge-sync/converge/internal/schema"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/verify/postgres"
	"github.com/converge-sync/converge/pkg/contract"
)

// Each role does its job with what it is granted: the writer's store
// writes, upserts, withdraws, re-emits and prunes; the relay creates its
// slot and streams; verify's truth and status read; migrations and the
// slot of `converge migrate up` run as the owner.
func TestEachRoleDoesItsJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newRoled(t)

	created, err := schema.EnsureSlot(ctx, d.url(t, roles.Owner), "converge_owner_slot")
	if err != nil || !created {
		t.Fatalf("the owner creates the slot of migrate up: created %v, %v", created, err)
	}

	n := testenv.StartNATS(t)
	r, err := relay.New(n.Connect(t), relay.Config{PostgresURL: d.url(t, roles.Relay), Slot: "converge_relay",
		HeartbeatInterval: 100 * time.Millisecond, StandbyRetry: 100 * time.Millisecond,
		Stream: relay.StreamConfig{MaxMsgsPerSubject: -1}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := r.Run(runCtx); err != nil {
			t.Errorf("relay as %s: %v", roles.Relay, err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	testenv.Eventually(t, "the relay holds its slot", 30*time.Second, r.Active)

	w := d.pool(t, roles.Writer)
	store, err := docstore.New(w, docstore.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := schema.Check(ctx, w); err != nil || !st.Current() {
		t.Fatalf("the writer's readiness check: %+v %v", st, err)
	}
	for i := range 5 {
		doc := contract.Document{Key: fmt.Sprintf("doc-%d", i), Version: 1, Title: "t", Body: fmt.Sprintf("body %d", i),
			Links: []string{"doc-0"}, Tags: []string{"x"}}
		if out, err := store.Put(ctx, doc); err != nil || out.Result != docstore.Applied {
			t.Fatalf("put %s as %s: %+v %v", doc.Key, roles.Writer, out, err)
		}
	}
	if out, err := store.Withdraw(ctx, "doc-4", 2); err != nil || out.Result != docstore.Applied {
		t.Fatalf("withdraw as %s: %+v %v", roles.Writer, out, err)
	}
	if _, err := store.Reemit(ctx, []string{"doc-1"}); err != nil {
		t.Fatalf("re-emit as %s: %v", roles.Writer, err)
	}
	if _, err := store.PruneOutbox(ctx, time.Hour, 100); err != nil {
		t.Fatalf("prune the outbox as %s: %v", roles.Writer, err)
	}

	// 5 upserts, a withdrawal and a re-emission reach the stream.
	js, err := jetstream.New(n.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "7 events in the stream", 30*time.Second, func() bool {
		s, err := js.Stream(ctx, contract.DocsStream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 7
	})
	// The relay's heartbeat, over its ordinary connection.
	if _, err := d.connect(t, roles.Relay).Exec(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, relay.HeartbeatPrefix); err != nil {
		t.Errorf("heartbeat as %s: %v", roles.Relay, err)
	}

	reader := d.pool(t, roles.Reader)
	truth := &postgres.Postgres{Pool: reader}
	for _, kind := range []verify.Kind{verify.Index, verify.Graph} {
		digests, err := truth.Digests(ctx, kind, 4)
		if err != nil || len(digests) == 0 {
			t.Fatalf("verify's %s digests as %s: %v %v", kind, roles.Reader, digests, err)
		}
		docs, err := truth.Buckets(ctx, kind, 4, []int{0, 1, 2, 3})
		if err != nil {
			t.Fatalf("verify's %s buckets as %s: %v", kind, roles.Reader, err)
		}
		total := 0
		for _, b := range docs {
			total += len(b)
		}
		if total != 5 {
			t.Fatalf("verify's %s buckets as %s: %d documents, want 5", kind, roles.Reader, total)
		}
	}
	// What converge status reads.
	var active bool
	var lag, rows int64
	if err := reader.QueryRow(ctx, `SELECT active, coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = 'converge_relay' AND database = current_database()`).Scan(&active, &lag); err != nil || !active {
		t.Fatalf("status's slot as %s: active %v, %v", roles.Reader, active, err)
	}
	if err := reader.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		t.Fatalf("status's outbox as %s: %v", roles.Reader, err)
	}
	if st, err := schema.Inspect(ctx, d.url(t, roles.Reader)); err != nil || !st.Current() {
		t.Fatalf("migrate status as %s: %+v %v", roles.Reader, st, err)
	}
}
