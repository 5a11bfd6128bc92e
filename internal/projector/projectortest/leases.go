package projectortest

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/lease"
)

// LeaseHolder is who holds the lease called key in the leases' bucket
// (a partition's, a rebuilds' coordinator's): "" when nobody does, or
// when it cannot be read.
func LeaseHolder(ctx context.Context, js jetstream.JetStream, key string) string {
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		return ""
	}
	v, _, _, err := lease.Read(ctx, kv, key)
	if err != nil {
		return ""
	}
	return v.Holder
}
