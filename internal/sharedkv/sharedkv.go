// Package sharedkv opens the key-value buckets that several services share
// (the leases', the rebuilds'), each of which holds one key of its own.
//
// A bucket made by jetstream's CreateKeyValue allows roll-ups: a publish to
// any one key with the header Nats-Rollup: all purges every other key of
// the bucket, and a grant of one key is enough to send it. A shared bucket
// is therefore made here as its stream, with the key-value layout and
// DenyPurge set, which makes the server refuse every roll-up and the purge
// API. Its users put, create, update and delete their keys; none purges a
// key (a key-value Purge is a roll-up), so nothing they do is lost.
//
// A service creates a shared bucket when it is absent and never updates it:
// none may change the retention the others rely on. A bucket that exists
// with other settings (made by an earlier version, which allowed roll-ups)
// is opened as it is, and [Open] says so; `converge streams apply`, run by
// the operator, brings it to [StreamConfig].
package sharedkv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config is a shared bucket's settings: those of jetstream.KeyValueConfig
// that converge uses.
type Config struct {
	Bucket      string
	Description string
	History     int // values kept per key; default 1
	Storage     jetstream.StorageType
	Replicas    int // default 1
}

// StreamConfig is the stream of bucket cfg: jetstream's key-value layout
// (the one jetstream.KeyValue opens) with roll-ups and purges refused.
func StreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              "KV_" + cfg.Bucket,
		Description:       cfg.Description,
		Subjects:          []string{"$KV." + cfg.Bucket + ".>"},
		MaxMsgsPerSubject: int64(max(cfg.History, 1)),
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           cfg.Storage,
		Replicas:          max(cfg.Replicas, 1),
		Discard:           jetstream.DiscardNew,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowRollup:       false,
	}
}

// Open creates bucket cfg when it does not exist, or opens it as it is.
// refusesRollups is false when the existing bucket allows roll-ups (made by
// an earlier version): the caller should say that `converge streams apply`
// closes it.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (kv jetstream.KeyValue, refusesRollups bool, err error) {
	s, err := js.CreateStream(ctx, StreamConfig(cfg))
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Exists, with other settings than these (the same ones are no
		// error). Opening reads its info, which tells.
		if kv, err = js.KeyValue(ctx, cfg.Bucket); err != nil {
			return nil, false, fmt.Errorf("sharedkv: open bucket %s: %w", cfg.Bucket, err)
		}
		info, err := js.Stream(ctx, "KV_"+cfg.Bucket)
		if err != nil {
			return nil, false, fmt.Errorf("sharedkv: bucket %s: %w", cfg.Bucket, err)
		}
		return kv, refuses(info.CachedInfo().Config), nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("sharedkv: create bucket %s: %w", cfg.Bucket, err)
	}
	kv, err = js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, false, fmt.Errorf("sharedkv: open bucket %s: %w", cfg.Bucket, err)
	}
	return kv, refuses(s.CachedInfo().Config), nil
}

// refuses reports whether the server refuses roll-ups on a stream of
// config c (it allows them only with AllowRollup and without DenyPurge).
func refuses(c jetstream.StreamConfig) bool { return !c.AllowRollup || c.DenyPurge }

// Apply creates bucket cfg or updates it to [StreamConfig]: the operator's
// step, never a service's.
func Apply(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if _, err := js.CreateOrUpdateStream(ctx, StreamConfig(cfg)); err != nil {
		return fmt.Errorf("sharedkv: apply bucket %s: %w", cfg.Bucket, err)
	}
	return nil
}
