package sharedkv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/internal/testenv"
)

// A bucket Open creates is a key-value bucket to jetstream (create,
// update, put, delete, get) that refuses a roll-up; one an earlier version
// made with CreateKeyValue is opened as it is and said to allow roll-ups,
// until Apply closes them.
func TestSharedBucketRefusesRollups(t *testing.T) {
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := sharedkv.Config{Bucket: "SHARED", Storage: jetstream.FileStorage}
	kv, refuses, err := sharedkv.Open(ctx, js, cfg)
	if err != nil || !refuses {
		t.Fatalf("open: refuses roll-ups %v, %v", refuses, err)
	}
	if _, refuses, err := sharedkv.Open(ctx, js, cfg); err != nil || !refuses {
		t.Fatalf("open again: refuses roll-ups %v, %v", refuses, err)
	}
	rev, err := kv.Create(ctx, "a", []byte("1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, "a", []byte("2"), rev); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "b", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "b", []byte("again")); err != nil {
		t.Fatalf("create after a delete: %v", err)
	}
	if rollup(t, js, "SHARED", "b") == nil {
		t.Fatal("a roll-up was stored")
	}
	if e, err := kv.Get(ctx, "a"); err != nil || string(e.Value()) != "2" {
		t.Fatalf("a after the roll-up: %v, %v", e, err)
	}

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "OLD"}); err != nil {
		t.Fatal(err)
	}
	if _, refuses, err := sharedkv.Open(ctx, js, sharedkv.Config{Bucket: "OLD"}); err != nil || refuses {
		t.Fatalf("open a bucket made by CreateKeyValue: refuses roll-ups %v, %v", refuses, err)
	}
	if err := sharedkv.Apply(ctx, js, sharedkv.Config{Bucket: "OLD"}); err != nil {
		t.Fatal(err)
	}
	if _, refuses, err := sharedkv.Open(ctx, js, sharedkv.Config{Bucket: "OLD"}); err != nil || !refuses {
		t.Fatalf("open after Apply: refuses roll-ups %v, %v", refuses, err)
	}
	if rollup(t, js, "OLD", "x") == nil {
		t.Fatal("a roll-up was stored after Apply")
	}
}

// rollup publishes Nats-Rollup: all to key of bucket and returns the
// server's refusal.
func rollup(t *testing.T, js jetstream.JetStream, bucket, key string) error {
	t.Helper()
	m := nats.NewMsg("$KV." + bucket + "." + key)
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	_, err := js.PublishMsg(context.Background(), m)
	return err
}

// Every user of a shared bucket may create it, so one of them may have made
// it first with settings by which the server removes keys: a MaxAge would
// expire a lease while its holder writes, and another instance would take
// it. Open refuses such a bucket, naming each setting and the operator's
// command, until Apply sets its settings.
func TestABucketThatWouldLoseKeysIsRefused(t *testing.T) {
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := sharedkv.Config{Bucket: "LEASES", Storage: jetstream.FileStorage}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "LEASES", TTL: time.Second, MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, _, err = sharedkv.Open(ctx, js, cfg)
	for _, want := range []string{"MaxAge 1s", "MaxBytes 1048576", "converge streams apply"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("open a bucket with a MaxAge and a MaxBytes: %v; want an error naming %q", err, want)
		}
	}
	if err := sharedkv.Apply(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if _, refuses, err := sharedkv.Open(ctx, js, cfg); err != nil || !refuses {
		t.Fatalf("open after apply: refuses roll-ups %v, %v", refuses, err)
	}
}

func TestLosses(t *testing.T) {
	want := sharedkv.StreamConfig(sharedkv.Config{Bucket: "B"})
	same := want
	same.Replicas, same.Description, same.AllowRollup = 3, "other", true
	if err := sharedkv.Losses(same, want); err != nil {
		t.Errorf("other replicas, description and roll-ups: %v", err)
	}
	for name, change := range map[string]func(c *jetstream.StreamConfig){
		"MaxAge":     func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour },
		"MaxMsgs":    func(c *jetstream.StreamConfig) { c.MaxMsgs = 5 },
		"MaxBytes":   func(c *jetstream.StreamConfig) { c.MaxBytes = 5 },
		"MaxMsgSize": func(c *jetstream.StreamConfig) { c.MaxMsgSize = 5 },
		"retention":  func(c *jetstream.StreamConfig) { c.Retention = jetstream.InterestPolicy },
		"subjects":   func(c *jetstream.StreamConfig) { c.Subjects = []string{"$KV.B.a"} },
		"sealed":     func(c *jetstream.StreamConfig) { c.Sealed = true },
		// Fewer values per key than the bucket's history (5 below).
		"MaxMsgsPerSubject": func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 2 },
	} {
		have, w := want, want
		change(&have)
		if name == "MaxMsgsPerSubject" {
			w.MaxMsgsPerSubject = 5
		}
		if err := sharedkv.Losses(have, w); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v; want an error naming it", name, err)
		}
	}
}
