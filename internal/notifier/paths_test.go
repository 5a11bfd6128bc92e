package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/pkg/contract"
)

// newTestNotifier is a notifier on a fresh dedup store, and its one
// target's receiver.
func newTestNotifier(t *testing.T) (*Notifier, *receiver) {
	t.Helper()
	e := newEnv(t)
	rcv := newReceiver(t)
	n := e.newNotifier(testConfig(rcv.url("/hook")))
	return n, rcv
}

func (n *Notifier) state(t *testing.T, ev *contract.Event) (string, error) {
	t.Helper()
	entry, err := n.kv.Get(context.Background(), contract.EffectID(n.targets[0].effect, ev.ID).String())
	if err != nil {
		return "", err
	}
	var rec record
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return "", err
	}
	return rec.State, nil
}

// A record the notifier cannot read is a stale claim: taken over, sent.
func TestUnreadableRecordIsTakenOver(t *testing.T) {
	n, rcv := newTestNotifier(t)
	ev := upsert("doc", 1)
	key := contract.EffectID(n.targets[0].effect, ev.ID).String()
	if _, err := n.kv.Put(context.Background(), key, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if res := n.Apply(context.Background(), []*contract.Event{&ev}); res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("result: %+v", res[0])
	}
	if st, err := n.state(t, &ev); err != nil || st != stateSent || rcv.count("/hook") != 1 {
		t.Fatalf("state %q (%v), %d requests; want sent and 1", st, err, rcv.count("/hook"))
	}
}

// A dead record found on a redelivery (a crash after it was written, before
// the dead letter) dead-letters the event without sending, and is reset.
func TestDeadRecordDeadLettersAndResets(t *testing.T) {
	n, rcv := newTestNotifier(t)
	ev := upsert("doc", 1)
	j := &job{effect: contract.EffectID(n.targets[0].effect, ev.ID), target: n.targets[0], ev: &ev}
	rec := n.newRecord(j, stateDead, 3, time.Now())
	rec.Last = "HTTP 503"
	if _, err := n.kv.Put(context.Background(), j.effect.String(), rec.encode()); err != nil {
		t.Fatal(err)
	}
	res := n.Apply(context.Background(), []*contract.Event{&ev})
	var dl *projector.DeadLetterError
	if !errors.As(res[0].Err, &dl) || dl.Code != DeadLetterCode || !strings.Contains(dl.Error(), "HTTP 503") {
		t.Fatalf("result: %+v; want a dead letter", res[0])
	}
	if _, err := n.state(t, &ev); !errors.Is(err, jetstream.ErrKeyNotFound) || rcv.count("/hook") != 0 {
		t.Fatalf("record %v, %d requests; want reset and none", err, rcv.count("/hook"))
	}
}

// failMarkSent fails the first n updates to "sent".
type failMarkSent struct {
	jetstream.KeyValue
	n int
}

func (k *failMarkSent) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if k.n > 0 && bytes.Contains(value, []byte(`"state":"sent"`)) {
		k.n--
		return 0, errors.New("store down")
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// When the 2xx answer cannot be recorded, the retry records it without
// sending again.
func TestMarkSentFailureIsNotSentAgain(t *testing.T) {
	n, rcv := newTestNotifier(t)
	n.kv = &failMarkSent{KeyValue: n.kv, n: 1}
	ev := upsert("doc", 1)
	res := n.Apply(context.Background(), []*contract.Event{&ev})
	var rd *projector.RedeliverError
	var dl *projector.DeadLetterError
	if res[0].Err == nil || errors.As(res[0].Err, &rd) || errors.As(res[0].Err, &dl) || !strings.Contains(res[0].Err.Error(), "mark sent") {
		t.Fatalf("first result: %+v; want a store failure", res[0])
	}
	if res := n.Apply(context.Background(), []*contract.Event{&ev}); res[0].Err != nil || res[0].Outcome != projector.Applied {
		t.Fatalf("retry: %+v", res[0])
	}
	if st, err := n.state(t, &ev); err != nil || st != stateSent || rcv.count("/hook") != 1 || len(n.unmarked) != 0 {
		t.Fatalf("state %q (%v), %d requests, %d unmarked; want sent, 1, 0", st, err, rcv.count("/hook"), len(n.unmarked))
	}
}
