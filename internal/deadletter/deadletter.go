// Package deadletter is where every converge consumer puts a message it can
// never process: the stream CONVERGE_DLQ on converge.dlq.<consumer>, with
// the reason in headers, so that a poison message never blocks a stream and
// never vanishes.
//
// [Publish] stores a dead letter; the consumer acknowledges the original
// only after JetStream acknowledged the dead letter, so a crash between the
// two redelivers the original, whose dead letter is stored once (its
// Nats-Msg-Id is derived from it).
//
// A [Queue] reads them for an operator ([Queue.Summarize], [Queue.Read],
// [Queue.Scan]) and puts them back ([Queue.Redrive]) by the path of their
// original subject ([PathOf]): an ingest dead letter (converge.ingest.>)
// is republished to its subject; a document dead letter (converge.docs.>,
// the projectors', their rebuilds' and the notifier's) is re-emitted by the
// writer through the outbox ([Reemitter]), since the relay alone publishes
// to CONVERGE_DOCS. Either way the write comes first and the delete from
// CONVERGE_DLQ only after its acknowledgement (JetStream's, or the
// writer's). A crash between the two leaves both: a rerun stores a
// republish once within the duplicate window, and re-emits a document
// again, which every consumer applies idempotently.
package deadletter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/sharedkv"
	"github.com/converge-sync/converge/pkg/contract"
)

// Stream keeps the dead letters of every consumer.
const Stream = "CONVERGE_DLQ"

// Headers of a dead letter, besides the original message's own headers.
const (
	HeaderReason  = "Converge-Dlq-Reason"   // why, in words (at most 1 KiB)
	HeaderCode    = "Converge-Dlq-Code"     // why, as a stable code
	HeaderSubject = "Converge-Dlq-Subject"  // the original subject
	HeaderStream  = "Converge-Dlq-Stream"   // the original stream
	HeaderSeq     = "Converge-Dlq-Sequence" // the original stream sequence
)

// EnsureStream creates the dead-letter stream unless it exists. It never
// updates an existing one: every consumer ensures it, and none may change
// the retention the others rely on (the operator does, with [ApplyStream],
// and NATS permits nothing else). Since any of them may have made it, an
// existing stream with settings by which dead letters would vanish or be
// refused (a MaxAge, a bound, another retention) is an error
// ([sharedkv.Losses]): a poison message must never vanish.
func EnsureStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	want := streamConfig(replicas)
	_, err := js.CreateStream(ctx, want)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("ensure stream %s: %w", Stream, err)
	}
	s, err := js.Stream(ctx, Stream)
	if err != nil {
		return fmt.Errorf("ensure stream %s: %w", Stream, err)
	}
	if err := sharedkv.Losses(s.CachedInfo().Config, want); err != nil {
		return fmt.Errorf("dead letters: %w", err)
	}
	return nil
}

// ApplyStream creates the dead-letter stream or updates it to its
// settings: the operator's step (converge streams apply).
func ApplyStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if _, err := js.CreateOrUpdateStream(ctx, streamConfig(replicas)); err != nil {
		return fmt.Errorf("apply stream %s: %w", Stream, err)
	}
	return nil
}

func streamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "dead letters of every converge consumer, with the reason in headers",
		Subjects:    []string{contract.DLQSubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, config.DefaultReplicas),
	}
}

// New builds the dead letter of m for consumer (its subject is
// converge.dlq.<consumer>): m's data and headers, and the reason. Its
// Nats-Msg-Id is derived from the original's stream sequence and data, so
// the same message dead-lettered twice (a redelivery after a crash) is
// stored once.
func New(consumer string, m jetstream.Msg, code string, reason error) *nats.Msg {
	dl := nats.NewMsg(contract.DLQSubject(consumer))
	dl.Data = m.Data()
	for k, vs := range m.Headers() {
		// Nats-* headers are directives to the server (message id, expected
		// stream or sequence) that would make the dead letter's own publish
		// fail or be dropped; they are not part of the message.
		if strings.HasPrefix(k, "Nats-") {
			continue
		}
		for _, v := range vs {
			dl.Header.Add(k, v)
		}
	}
	dl.Header.Set(HeaderReason, truncate(reason.Error(), 1024))
	dl.Header.Set(HeaderCode, code)
	dl.Header.Set(HeaderSubject, m.Subject())
	if meta, err := m.Metadata(); err == nil {
		dl.Header.Set(HeaderStream, meta.Stream)
		dl.Header.Set(HeaderSeq, strconv.FormatUint(meta.Sequence.Stream, 10))
		// The data's hash keeps a recreated stream, whose sequences
		// restart, from colliding with older dead letters.
		sum := sha256.Sum256(m.Data())
		dl.Header.Set(nats.MsgIdHdr, consumer+"-dlq-"+strconv.FormatUint(meta.Sequence.Stream, 10)+"-"+hex.EncodeToString(sum[:8]))
	}
	return dl
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}

// Publish stores m's dead letter (see New) and waits for JetStream's
// acknowledgement. If it cannot be stored, m is negatively acknowledged
// with retryDelay, so that it is redelivered rather than lost, and the
// error is returned; acknowledging m after a success is the caller's.
func Publish(ctx context.Context, js jetstream.JetStream, consumer string, m jetstream.Msg, code string, reason error, retryDelay time.Duration) error {
	if _, err := js.PublishMsg(ctx, New(consumer, m, code, reason)); err != nil {
		_ = m.NakWithDelay(retryDelay)
		return fmt.Errorf("dead letter of %s: %w", m.Subject(), err)
	}
	return nil
}
