package relay_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/relay"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/migrations"
	"github.com/converge-sync/converge/pkg/contract"
)

// waitSlot waits until the relay holds its slot.
func (f *fixture) waitSlot(t *testing.T) {
	t.Helper()
	waitSlotActive(t, f.pool, "converge_relay")
}

// lastMsg is the last message on key's subject.
func lastMsg(t *testing.T, js jetstream.JetStream, key string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(context.Background(), contract.DocsStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), contract.Subject(key))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkOriginal checks that the last message of key is the original
// emission of its version: the event id as message id, no re-emission
// header. It returns the event.
func checkOriginal(t *testing.T, js jetstream.JetStream, key string, version int64) []byte {
	t.Helper()
	m := lastMsg(t, js, key)
	id := contract.EventID(key, version, contract.KindUpserted).String()
	if m.Header.Get(jetstream.MsgIDHeader) != id || m.Header.Get(contract.HeaderReemission) != "" {
		t.Fatalf("message %d: headers %v; want the original emission of %s v%d (%s)", m.Sequence, m.Header, key, version, id)
	}
	return m.Data
}

// checkReemission checks that the last message of key re-emits, as
// emission, the event whose original message carried original.
func checkReemission(t *testing.T, js jetstream.JetStream, key string, version, emission int64, original []byte) {
	t.Helper()
	m := lastMsg(t, js, key)
	seq := m.Sequence
	e := strconv.FormatInt(emission, 10)
	id := contract.EventID(key, version, contract.KindUpserted).String() + "." + e
	if m.Header.Get(jetstream.MsgIDHeader) != id || m.Header.Get(contract.HeaderReemission) != e {
		t.Fatalf("message %d: headers %v; want the re-emission %s of %s v%d", seq, m.Header, e, key, version)
	}
	if _, err := time.Parse(time.RFC3339Nano, m.Header.Get(contract.HeaderCommitTime)); err != nil {
		t.Fatalf("message %d: commit time header: %v", seq, err)
	}
	if string(m.Data) != string(original) {
		t.Fatalf("message %d: the re-emitted event differs from the original:\n%s\n%s", seq, m.Data, original)
	}
}

// A re-emitted event is published under "<event id>.<emission>" with the
// re-emission header, so the duplicate window does not drop it, and carries
// the original's bytes; later original emissions carry no such header.
func TestReemissionIsPublishedUnderItsOwnID(t *testing.T) {
	f := newFixture(t)
	f.startRelay(t, relay.Config{})
	f.waitSlot(t)
	f.write(t, 0, 3, 1)
	testenv.Eventually(t, "3 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 3 })
	originals := map[string][]byte{}
	for _, key := range []string{"doc-0", "doc-1", "doc-2"} {
		originals[key] = checkOriginal(t, f.js, key, 1)
	}

	got, err := f.store.Reemit(context.Background(), []string{"doc-2", "doc-0"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the 2 re-emissions", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 5 })
	for _, r := range got.Reemitted {
		checkReemission(t, f.js, r.Key, 1, r.Emission, originals[r.Key])
	}
	// Re-emitting the same version again publishes it again.
	again, err := f.store.Reemit(context.Background(), []string{"doc-0"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the second re-emission", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 6 })
	checkReemission(t, f.js, "doc-0", 1, again.Reemitted[0].Emission, originals["doc-0"])
	// A later original emission carries no re-emission header.
	f.write(t, 0, 1, 2)
	testenv.Eventually(t, "a new version", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 7 })
	checkOriginal(t, f.js, "doc-0", 2)
}

// The relay keeps working on the schema of version 1 (an outbox without
// the emission column), and takes the column on when the migration adds it
// while it runs.
func TestRelayWorksOnSchemaVersion1AndAcrossTheMigration(t *testing.T) {
	ctx := context.Background()
	f := newFixtureOn(t, pg.NewDatabase(t))
	applyMigration(t, f, "000001_init.up.sql")
	// The writer's store needs documents.meta_text (version 3), which
	// leaves the outbox as version 1 has it.
	applyMigration(t, f, "000003_meta_text.up.sql")
	f.startRelay(t, relay.Config{})
	f.waitSlot(t)
	f.write(t, 0, 20, 1)
	testenv.Eventually(t, "20 events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 20 })
	original := checkOriginal(t, f.js, "doc-19", 1)

	applyMigration(t, f, "000002_reemission.up.sql")
	f.write(t, 20, 25, 1)
	testenv.Eventually(t, "5 more events", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 25 })
	checkOriginal(t, f.js, "doc-24", 1)
	got, err := f.store.Reemit(ctx, []string{"doc-19"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the re-emission", 20*time.Second, func() bool { return streamMsgs(t, f.js) == 26 })
	checkReemission(t, f.js, "doc-19", 1, got.Reemitted[0].Emission, original)
}

// applyMigration runs one embedded migration file on the fixture's
// database, as golang-migrate would.
func applyMigration(t *testing.T, f *fixture, name string) {
	t.Helper()
	sql, err := migrations.FS.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(context.Background(), string(sql)); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
