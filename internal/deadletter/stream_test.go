package deadletter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/testenv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Every consumer may create the dead letters' stream, so one of them may
// have made it first with settings by which dead letters vanish (a MaxAge)
// or are refused (a bound with DiscardNew). EnsureStream refuses such a
// stream, naming each setting and the operator's command, so that no
// consumer starts dead-lettering into it; after `converge streams apply`
// (ApplyStream) it is accepted.
func TestEnsureStreamRefusesAStreamThatLosesDeadLetters(t *testing.T) {
	js, err := jetstream.New(testenv.StartNATS(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deadletter.Stream, Subjects: []string{contract.DLQSubjectPrefix + ">"},
		MaxAge: time.Second, MaxMsgs: 10, Discard: jetstream.DiscardNew}); err != nil {
		t.Fatal(err)
	}
	err = deadletter.EnsureStream(ctx, js, 1)
	for _, want := range []string{deadletter.Stream, "MaxAge 1s", "MaxMsgs 10", "converge streams apply"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ensure over a stream with a MaxAge and a MaxMsgs: %v; want an error naming %q", err, want)
		}
	}
	if err := deadletter.ApplyStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if err := deadletter.EnsureStream(ctx, js, 1); err != nil {
		t.Fatalf("ensure after apply: %v", err)
	}
}
