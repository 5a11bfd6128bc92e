package projector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/projector"
	"github.com/converge-sync/converge/internal/testenv"
)

// A removals' stream deleted and made again while a runtime reads it starts
// its sequences again: the runtime reads the new one from its start, and
// its position (GapRecord.RemovalsNext) follows the new stream's records,
// instead of passing over them until they reach the old position.
func TestRemovalsStreamMadeAgainIsReadFromItsStart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const removals, subject = "TEST_REMOVALS", "test.removals"
	makeStream := func(records int) {
		t.Helper()
		if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: removals, Subjects: []string{subject}}); err != nil {
			t.Fatal(err)
		}
		// Records of another consumer's removals: read, and accounted
		// for by nobody here.
		for i := range records {
			rec := fmt.Sprintf(`{"stream":"OTHER","consumer":"other","stream_seq":%d,"reason":"Message deleted by stream limits"}`, i+1)
			if _, err := e.js.Publish(ctx, subject, []byte(rec)); err != nil {
				t.Fatal(err)
			}
		}
	}
	makeStream(5)
	r, err := projector.New(e.js, newMemStore(), projector.Config{Name: "effects", EveryEvent: true, Removals: removals, BatchSize: 4}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	background(t, r)
	key := 0
	publishUntil := func(what string, cond func() bool) {
		t.Helper()
		// Batches drive the reads of the removals' stream.
		testenv.Eventually(t, what, 20*time.Second, func() bool {
			key++
			e.publish(t, upsert(fmt.Sprintf("doc-%d", key), 1))
			return cond()
		})
	}
	publishUntil("the runtime to start past the 5 records", func() bool { return r.LastGap().RemovalsNext == 6 })

	if err := e.js.DeleteStream(ctx, removals); err != nil {
		t.Fatal(err)
	}
	makeStream(2)
	publishUntil("the runtime to read the new stream's 2 records", func() bool { return r.LastGap().RemovalsNext == 3 })
}
