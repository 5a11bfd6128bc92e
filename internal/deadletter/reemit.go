package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// Path is how [Queue.Redrive] puts a dead letter back.
type Path string

const (
	// Republish publishes the dead letter's message again to its original
	// subject: the path of the writer's ingest dead letters
	// (converge.ingest.>), where producers publish too.
	Republish Path = "republished"
	// Reemit asks the writer to re-emit the dead letter's document: the
	// writer writes the event of the document's current version to the
	// outbox again, and the relay, the only publisher of CONVERGE_DOCS,
	// publishes it. The path of the dead letters of CONVERGE_DOCS's
	// consumers (converge.docs.>: the projectors, their rebuilds, and
	// converge.part.>: their partitions) and of CONVERGE_EVENTS's
	// (converge.events.>: the notifier, and converge.effects.>: its
	// partitions).
	Reemit Path = "re-emitted"
)

// effectsPartition is the partition of a subject of the effects'
// partitions, "converge.effects.<p>.<token>".
func effectsPartition(subject string) (int, bool) {
	rest := strings.TrimPrefix(subject, contract.EffectsSubjectPrefix)
	num, token, ok := strings.Cut(rest, ".")
	p, err := strconv.Atoi(num)
	if !ok || err != nil || p < 0 || p >= contract.MaxPartitions || token == "" || strings.Contains(token, ".") {
		return 0, false
	}
	return p, true
}

// PathOf returns the path of a dead letter whose original subject is
// subject, in stream (its [HeaderStream], "" when it has none): the stream
// of the subject decides. A subject of neither converge.docs.> nor
// converge.ingest.> nor converge.events.>, or a document subject from
// another stream than its own, has no path.
func PathOf(subject, stream string) (Path, error) {
	switch {
	case subject == "":
		return "", fmt.Errorf("no %s header: its original subject is unknown", HeaderSubject)
	case strings.HasPrefix(subject, contract.DocsSubjectPrefix):
		if stream != "" && stream != contract.DocsStream {
			return "", fmt.Errorf("its subject %s is one of %s, not of the stream %s it names", subject, contract.DocsStream, stream)
		}
		return Reemit, nil
	case strings.HasPrefix(subject, contract.PartsSubjectPrefix):
		if stream != "" && stream != contract.PartsStream {
			return "", fmt.Errorf("its subject %s is one of %s, not of the stream %s it names", subject, contract.PartsStream, stream)
		}
		return Reemit, nil
	case strings.HasPrefix(subject, contract.EventsSubjectPrefix):
		if stream != "" && stream != contract.EventsStream {
			return "", fmt.Errorf("its subject %s is one of %s, not of the stream %s it names", subject, contract.EventsStream, stream)
		}
		return Reemit, nil
	case strings.HasPrefix(subject, contract.EffectsSubjectPrefix):
		part, ok := effectsPartition(subject)
		if !ok {
			return "", fmt.Errorf("its subject %s names no partition of the effects", subject)
		}
		if want := contract.EventsPartitionStream(part); stream != "" && stream != want {
			return "", fmt.Errorf("its subject %s is one of %s, not of the stream %s it names", subject, want, stream)
		}
		return Reemit, nil
	case strings.HasPrefix(subject, contract.IngestSubjectPrefix):
		return Republish, nil
	default:
		return "", fmt.Errorf("its subject %s (stream %s) is neither a document's (%s>, %s>, %s> or %s>) nor an ingest one (%s>)",
			subject, orDash(stream), contract.DocsSubjectPrefix, contract.PartsSubjectPrefix, contract.EventsSubjectPrefix, contract.EffectsSubjectPrefix, contract.IngestSubjectPrefix)
	}
}

// Reemitter re-emits documents by key: the writer's client
// (writer.Client.ReemitKeys, adapted by `converge dlq`). A key it answers
// in Reemitted has its current version's event committed to the outbox;
// a key in NotFound has no document. On an error the answer holds the keys
// re-emitted before it. A request refused because a document's stored rows
// do not reproduce its event (nothing of it is re-emitted) is an error
// that matches [ErrNotReproducible].
type Reemitter interface {
	ReemitKeys(ctx context.Context, keys []string) (Reemission, error)
}

// Reemission is the answer of a [Reemitter].
type Reemission struct {
	Reemitted []ReemittedKey
	NotFound  []string
}

// ReemittedKey is one document whose current version's event is in the
// outbox again.
type ReemittedKey struct {
	Key      string
	Version  int64 // the document's current version, which was re-emitted
	EventID  uuid.UUID
	Emission int64 // the re-emission's number (contract.HeaderReemission)
}

// reemitBatch bounds the keys of one request of a redrive, so that the
// dead letters of a large redrive are deleted as it goes.
const reemitBatch = 500

// documentKey is the key of the document dead letter p describes, from
// its event or, for data that is not a valid event, from a lenient decode;
// either way only if the key's subject is the dead letter's original one.
func documentKey(subject string, p Payload) (string, error) {
	if p.Key == "" {
		return "", errors.New("its data names no document key (not an event); re-emit the document with converge backfill --keys, or replay the consumer")
	}
	if err := contract.ValidateKey(p.Key); err != nil {
		return "", fmt.Errorf("its data names the key %q, which is not valid: %w", p.Key, err)
	}
	if !keySubject(subject, p.Key) {
		return "", fmt.Errorf("its data names the key %q, whose subject is not its original %s", p.Key, subject)
	}
	return p.Key, nil
}

// keySubject reports whether subject is the subject of key's events in
// the documents' stream, or in a partition of the partitioned stream.
func keySubject(subject, key string) bool {
	if contract.Subject(key) == subject {
		return true
	}
	rest, ok := strings.CutPrefix(subject, contract.PartsSubjectPrefix)
	if !ok {
		return false
	}
	part, token, ok := strings.Cut(rest, ".")
	n, err := strconv.Atoi(part)
	return ok && err == nil && n >= 0 && n < contract.MaxPartitions && token == contract.SubjectToken(key)
}

// reemit asks w to re-emit the documents of batch (document dead letters,
// each with its Key), then deletes each dead letter whose key w
// acknowledged, and reports every dead letter w answered, redriven or
// kept. It returns how many it deleted.
//
// The writer refuses a whole request for one document it cannot
// reproduce: the keys are then re-emitted one at a time, so that the
// refusal names its key and keeps only that key's dead letters.
func (q *Queue) reemit(ctx context.Context, w Reemitter, batch []Redriven, report func(Redriven)) (int, error) {
	keys := make([]string, 0, len(batch))
	seen := map[string]bool{}
	for _, d := range batch {
		if !seen[d.Key] {
			seen[d.Key] = true
			keys = append(keys, d.Key)
		}
	}
	kept := map[string]string{}
	res, err := w.ReemitKeys(ctx, keys)
	if errors.Is(err, ErrNotReproducible) {
		res, err = Reemission{}, nil
		for _, k := range keys {
			one, kerr := w.ReemitKeys(ctx, []string{k})
			if errors.Is(kerr, ErrNotReproducible) {
				kept[k] = "the writer cannot re-emit it: " + kerr.Error()
				continue
			}
			res.Reemitted = append(res.Reemitted, one.Reemitted...)
			res.NotFound = append(res.NotFound, one.NotFound...)
			if kerr != nil {
				err = kerr
				break
			}
		}
	}
	acked := map[string]ReemittedKey{}
	for _, d := range res.Reemitted {
		acked[d.Key] = d
	}
	for _, k := range res.NotFound {
		kept[k] = "the writer has no document " + strconv.Quote(k) + " (not found in Postgres): nothing to re-emit"
	}
	var n int
	for _, d := range batch {
		if a, ok := acked[d.Key]; ok {
			// Only now, with the re-emission committed to the outbox, may
			// the dead letter go.
			if derr := q.s.DeleteMsg(ctx, d.Seq); derr != nil && !errors.Is(derr, jetstream.ErrMsgNotFound) {
				return n, fmt.Errorf("#%d: %q version %d was re-emitted (emission %d) but the dead letter was not deleted from %s: %w; a rerun re-emits it again, which every consumer applies idempotently",
					d.Seq, a.Key, a.Version, a.Emission, Stream, derr)
			}
			d.Version, d.EventID, d.Emission = a.Version, a.EventID, a.Emission
			n++
			report(d)
			continue
		}
		if reason, ok := kept[d.Key]; ok {
			d.Kept = reason
			report(d)
			continue
		}
		if err == nil {
			d.Kept = "the writer's answer does not name " + strconv.Quote(d.Key)
			report(d)
		}
		// Otherwise the request of its key was not answered: the dead
		// letter stays, and the error says why.
	}
	if err != nil {
		return n, fmt.Errorf("re-emit through the writer: %w", err)
	}
	return n, nil
}
