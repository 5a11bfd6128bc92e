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
// the operator, brings it to [StreamConfig]. A bucket whose settings would
// remove what its users keep (a MaxAge expires a lease while its holder
// writes, and another instance takes it) is refused ([Losses]): every user
// may create a shared stream, so one of them could have made it so first.
package sharedkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/config"
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
		Replicas:          max(cfg.Replicas, config.DefaultReplicas),
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
		if err := Losses(info.CachedInfo().Config, StreamConfig(cfg)); err != nil {
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

// Losses reports the settings of an existing shared stream, have, by which
// the server would remove or refuse what its users store, where want (the
// stream converge makes) keeps everything: a MaxAge, a bound on messages
// or bytes, fewer values per subject, a retention that deletes what is
// acknowledged or unwatched, a smaller largest message, subjects that do
// not include want's, or a sealed stream. It names each and the command that
// sets the stream's settings; nil when there is none.
func Losses(have, want jetstream.StreamConfig) error {
	var bad []string
	if have.MaxAge > 0 && (want.MaxAge == 0 || have.MaxAge < want.MaxAge) {
		bad = append(bad, fmt.Sprintf("MaxAge %v", have.MaxAge))
	}
	if have.MaxMsgs > 0 && (want.MaxMsgs <= 0 || have.MaxMsgs < want.MaxMsgs) {
		bad = append(bad, fmt.Sprintf("MaxMsgs %d", have.MaxMsgs))
	}
	if have.MaxBytes > 0 && (want.MaxBytes <= 0 || have.MaxBytes < want.MaxBytes) {
		bad = append(bad, fmt.Sprintf("MaxBytes %d", have.MaxBytes))
	}
	if have.MaxMsgsPerSubject > 0 && (want.MaxMsgsPerSubject <= 0 || have.MaxMsgsPerSubject < want.MaxMsgsPerSubject) {
		bad = append(bad, fmt.Sprintf("MaxMsgsPerSubject %d", have.MaxMsgsPerSubject))
	}
	if have.MaxMsgSize > 0 && (want.MaxMsgSize <= 0 || have.MaxMsgSize < want.MaxMsgSize) {
		bad = append(bad, fmt.Sprintf("MaxMsgSize %d", have.MaxMsgSize))
	}
	if have.Retention != want.Retention {
		bad = append(bad, "retention "+have.Retention.String())
	}
	for _, s := range want.Subjects {
		if !slices.Contains(have.Subjects, s) {
			bad = append(bad, fmt.Sprintf("subjects %q (without %q)", have.Subjects, s))
			break
		}
	}
	if have.Sealed {
		bad = append(bad, "sealed")
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("stream %s exists with %s, by which the server would remove or refuse what converge keeps there; "+
		"it was not made by converge: the operator's `converge streams apply` sets its settings", have.Name, strings.Join(bad, ", "))
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

// GetJSON reads key's value from kv, any bucket, into v; found is false
// when there is no such key.
func GetJSON(ctx context.Context, kv jetstream.KeyValue, key string, v any) (found bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s of bucket %s: %w", key, kv.Bucket(), err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return false, fmt.Errorf("%s of bucket %s is not valid: %w", key, kv.Bucket(), err)
	}
	return true, nil
}
