package relay

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/clock"
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/pkg/contract"
)

// Config of a [Relay]. Zero fields take the defaults documented on them.
type Config struct {
	PostgresURL string // a normal DSN; the replication connection is derived from it
	Slot        string // replication slot; default "converge_relay"
	Publication string // default "converge_outbox"

	// Window bounds the publishes awaiting a JetStream acknowledgement;
	// memory stays flat however large the backlog. Default 4096.
	Window int
	// WindowBytes bounds the payload bytes of those publishes, so memory
	// stays flat for large documents too. Default 32 MiB.
	WindowBytes int
	// AckTimeout is how long a publish may wait for its acknowledgement
	// before the session ends and resumes from the confirmed position (the
	// message or its acknowledgement was lost: a NATS restart, a stream
	// leader change on a cluster). Default 5s.
	AckTimeout time.Duration
	// StatusInterval is how often the confirmed position is reported to
	// Postgres, well within wal_sender_timeout. Default 1s.
	StatusInterval time.Duration
	// HeartbeatInterval is how often a non-transactional logical message is
	// emitted so that the slot advances on a quiet outbox. 0: 10s; <0: off.
	HeartbeatInterval time.Duration
	// LagCheckInterval is how often slot lag is measured. Default 5s.
	LagCheckInterval time.Duration
	// LagAlarmBytes logs an alarm at every check while the slot's lag is
	// above it. Default 1 GiB.
	LagAlarmBytes int64
	// StandbyRetry is how often a standby relay retries the slot, and the
	// delay before reconnecting after an error. Default 2s.
	StandbyRetry time.Duration
	// ShutdownTimeout bounds the wait for outstanding acknowledgements on
	// shutdown. Default 30s.
	ShutdownTimeout time.Duration

	Stream StreamConfig
	// Effects, when enabled, publishes every event to the effects' stream
	// too (CONVERGE_EVENTS), which keeps each one until the notifier
	// handled it; see [EffectsConfig].
	Effects EffectsConfig

	// Clock is the wall clock of the times written for others (the
	// position and catch-up records, marks, the status sent to Postgres)
	// and of the commit-to-acknowledgement metric; nil: clock.Wall().
	Clock clock.Clock
}

// Default values of [Config]: a zero field takes its default, and the
// field's flag (see [Flags]), where it has one, defaults to it too.
const (
	DefaultSlot              = "converge_relay"
	DefaultPublication       = "converge_outbox"
	DefaultWindow            = 4096
	DefaultWindowBytes       = 32 << 20
	DefaultAckTimeout        = 5 * time.Second
	DefaultStatusInterval    = time.Second
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultLagCheckInterval  = 5 * time.Second
	DefaultLagAlarmBytes     = 1 << 30
	DefaultStandbyRetry      = 2 * time.Second
	DefaultShutdownTimeout   = 30 * time.Second
)

// DefaultEffectsMaxAge is the effects' stream's default age limit: the
// notifier's default window (notifier.DefaultWindow), beyond which it
// would not notify an event anyway.
const DefaultEffectsMaxAge = 7 * 24 * time.Hour

// DefaultEffectsMaxBytes is the effects' stream's default size bound:
// unlimited.
const DefaultEffectsMaxBytes = -1

// EffectsConfig is the effects' stream, contract.EventsStream: every
// event, in commit order, on converge.events.<token>, for the consumers
// that must see each one. Its retention is a work queue: an event stays
// until its one consumer (the notifier) acknowledged it, or until MaxAge or
// MaxBytes removes it, which that consumer then reports as missed. The
// relay publishes each event to both streams and confirms a transaction
// only once both acknowledged all its events.
type EffectsConfig struct {
	Enabled bool
	Name    string // default "CONVERGE_EVENTS"
	// MaxAge removes an event not acknowledged this long after it was
	// stored; it should be the notifier's window. Default 7 days.
	MaxAge time.Duration
	// MaxBytes bounds the stream's size (the oldest events are removed
	// first); -1 or 0: unlimited (a notifier that is down for long then
	// holds a window's events on disk).
	MaxBytes int64
	// Replicas; default the documents' stream's.
	Replicas int
	// Partitions, when above 1, splits the effects by document partition
	// (contract.Partition): each event goes to the work queue of its
	// partition, contract.EventsPartitionStream, and no longer to Name.
	// It is no setting of the relay: the operator makes the partitions'
	// streams (`converge streams apply -effects -effects-partitions N`),
	// and the relay reads their number from them at each session.
	Partitions int
}

// TuneGC sets the collector for a relay process: the relay's garbage is
// short-lived (one message per event), so collecting less often saves CPU,
// while the soft memory limit keeps the heap bounded. percent <= 0 and
// limitBytes <= 0 leave the runtime's settings alone.
func TuneGC(percent int, limitBytes int64) {
	if percent > 0 {
		debug.SetGCPercent(percent)
	}
	if limitBytes > 0 {
		debug.SetMemoryLimit(limitBytes)
	}
}

// StreamConfig is the CONVERGE_DOCS stream the relay ensures.
type StreamConfig struct {
	Name     string                // default "CONVERGE_DOCS"
	Storage  jetstream.StorageType // default file
	Replicas int                   // default 1
	// Duplicates is the duplicate window: a republished event within it is
	// dropped. It must exceed the longest relay outage plus its catch-up.
	// Default 10m.
	Duplicates time.Duration
	// MaxMsgsPerSubject is the history kept per document; the newest
	// versions are kept, so replaying from the start rebuilds every
	// projection. Default 4; -1: unlimited.
	MaxMsgsPerSubject int64
	// MaxAge drops messages older than this; 0 keeps them (recommended: a
	// replay must find every document's latest event).
	MaxAge time.Duration
}

// Default values of [StreamConfig], which the flags of the relay and of
// `converge streams apply` take too (see [StreamFlags]); -replicas is
// config's one replica count, whose default is the same.
const (
	DefaultStreamReplicas          = config.DefaultReplicas
	DefaultStreamDuplicates        = 10 * time.Minute
	DefaultStreamMaxMsgsPerSubject = 4
)

func (c *Config) setDefaults() {
	if c.Clock == nil {
		c.Clock = clock.Wall()
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot
	}
	if c.Publication == "" {
		c.Publication = DefaultPublication
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.WindowBytes <= 0 {
		c.WindowBytes = DefaultWindowBytes
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.LagCheckInterval <= 0 {
		c.LagCheckInterval = DefaultLagCheckInterval
	}
	if c.LagAlarmBytes <= 0 {
		c.LagAlarmBytes = DefaultLagAlarmBytes
	}
	if c.StandbyRetry <= 0 {
		c.StandbyRetry = DefaultStandbyRetry
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	c.Stream.setDefaults()
	if c.Effects.Name == "" {
		c.Effects.Name = contract.EventsStream
	}
	if c.Effects.MaxAge <= 0 {
		c.Effects.MaxAge = DefaultEffectsMaxAge
	}
	if c.Effects.MaxBytes <= 0 {
		c.Effects.MaxBytes = DefaultEffectsMaxBytes
	}
	if c.Effects.Replicas <= 0 {
		c.Effects.Replicas = c.Stream.Replicas
	}
}

func (s *StreamConfig) setDefaults() {
	if s.Name == "" {
		s.Name = contract.DocsStream
	}
	if s.Replicas <= 0 {
		s.Replicas = DefaultStreamReplicas
	}
	if s.Duplicates <= 0 {
		s.Duplicates = DefaultStreamDuplicates
	}
	if s.MaxMsgsPerSubject == 0 {
		s.MaxMsgsPerSubject = DefaultStreamMaxMsgsPerSubject
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c.setDefaults()
	if c.PostgresURL == "" {
		return errors.New("relay: a Postgres URL is required")
	}
	if !validIdent(c.Slot) {
		return fmt.Errorf("relay: slot name %q must be lowercase letters, digits and underscores", c.Slot)
	}
	if !validIdent(c.Publication) {
		return fmt.Errorf("relay: publication name %q must be lowercase letters, digits and underscores", c.Publication)
	}
	if c.Stream.Storage != jetstream.FileStorage && c.Stream.Storage != jetstream.MemoryStorage {
		return fmt.Errorf("relay: unknown stream storage %v", c.Stream.Storage)
	}
	if c.Effects.Enabled && c.Window < 2 {
		return fmt.Errorf("relay: a window of %d publishes cannot hold an event's two (the effects' stream is on): give it at least 2", c.Window)
	}
	if c.Effects.Enabled && c.Effects.Name == c.Stream.Name {
		return fmt.Errorf("relay: the effects' stream needs a name of its own, not %q", c.Stream.Name)
	}
	return nil
}

func validIdent(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}
