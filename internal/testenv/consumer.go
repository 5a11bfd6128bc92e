package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// WaitConsumer polls the info of the durable consumer on stream every
// 20 ms until cond holds for it, and returns that info; it fails the test
// after timeout, naming what it waited for and the last info read. A
// consumer that does not exist yet is waited for too.
//
// It is how a test proves that something had its chance to happen: "the
// poison was delivered four times" (Delivered.Consumer counts redeliveries
// too), "everything up to stream sequence n is acknowledged" (AckFloor).
func WaitConsumer(t testing.TB, js jetstream.JetStream, stream, consumer, what string, timeout time.Duration,
	cond func(*jetstream.ConsumerInfo) bool) *jetstream.ConsumerInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		info, err := consumerInfo(js, stream, consumer)
		if err == nil && cond(info) {
			return info
		}
		if time.Now().After(deadline) {
			last := fmt.Sprint(err)
			if err == nil {
				last = fmt.Sprintf("delivered %d (stream seq %d), ack floor %d, %d pending, %d awaiting an ack, %d redelivered",
					info.Delivered.Consumer, info.Delivered.Stream, info.AckFloor.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered)
			}
			t.Fatalf("timed out after %v waiting for consumer %s on %s: %s; last: %s", timeout, consumer, stream, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func consumerInfo(js jetstream.JetStream, stream, consumer string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}
