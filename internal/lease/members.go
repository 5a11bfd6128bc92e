package lease

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/internal/sharedkv"
)

// Members are the live instances of one service that share its
// partitions: each announces itself in the leases' bucket under
// <name>.members.<id> every TTL/3, and each partition is wanted by the
// one live member that rendezvous hashing gives it ([Owner]). A member is
// live while its key changes: one whose key a reader has seen unchanged
// for a whole TTL (on the reader's own clock, the rule of the leases) is
// gone, and so is one whose key was deleted (a clean stop). Membership
// only says who should hold what: the partitions' leases, taken only
// when wanted ([Config.Want]), keep one writer per partition whatever two
// members believe for a moment.
type Members struct {
	kv       jetstream.KeyValue
	name     string
	id       string
	holder   string
	ttl      time.Duration
	log      *slog.Logger
	mu       sync.Mutex
	seen     map[string]memberSeen // by id
	live     []string              // sorted ids
	changed  chan struct{}         // closed and replaced when live changes
	joined   chan struct{}         // closed once the first watch caught up
	parts    []string              // the partitions the members share
	assigned map[string]string     // Assign(live, parts), or all to claimer, made anew when either changes
	claiming bool                  // this instance claims every partition (Claim)
	claimer  string                // the live member every partition goes to; "" when none claims
}

type memberSeen struct {
	rev    uint64
	at     time.Time // when this reader saw rev first (monotonic)
	claims bool      // its value claims every partition
}

// memberValue is a member's key's value.
type memberValue struct {
	Holder  string    `json:"holder"`
	Renewed time.Time `json:"renewed"`
	// ClaimsAll is set by a member that needs to hold every partition
	// for a while (a rebuild's coordinator, see [Members.Claim]).
	ClaimsAll bool `json:"claims_all,omitempty"`
}

// MemberID is the id of the instance called holder among its service's
// members: a key-safe digest of the name, the same across its restarts.
func MemberID(holder string) string {
	h := sha256.Sum256([]byte(holder))
	return hex.EncodeToString(h[:8])
}

// membersPrefix is the keys' prefix of name's members.
func membersPrefix(name string) string { return name + ".members." }

// OpenMembers opens the members of the service called name, sharing
// parts (the names of the partitions' leases), this instance being holder
// (the same as its leases'); Run announces it.
func OpenMembers(ctx context.Context, js jetstream.JetStream, name, holder string, parts []string, ttl time.Duration, replicas int, log *slog.Logger) (*Members, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	kv, _, err := sharedkv.Open(ctx, js, BucketConfig(max(replicas, 1)))
	if err != nil {
		return nil, fmt.Errorf("lease: members of %s: %w", name, err)
	}
	m := &Members{kv: kv, name: name, id: MemberID(holder), holder: holder, ttl: ttl, log: log.With("members", name), parts: slices.Clone(parts),
		seen: map[string]memberSeen{}, changed: make(chan struct{}), joined: make(chan struct{})}
	m.live = []string{m.id}
	m.assigned = Assign(m.live, m.parts)
	return m, nil
}

// ID is this instance's member id.
func (m *Members) ID() string { return m.id }

// Live returns the ids of the live members, this one included, sorted.
func (m *Members) Live() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.live)
}

// Changed returns a channel closed at the next change of the live
// members.
func (m *Members) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Joined is closed once this instance has announced itself and read the
// members already there.
func (m *Members) Joined() <-chan struct{} { return m.joined }

// Claim has every partition go to this instance (on) while it is live,
// or ends its claim: the others hand theirs over as they read it, as they
// do to a member that joins. Where two live members claim, the one of the
// smaller id wins. A claim ends with its member: one that dies gives its
// partitions back to the others' assignment.
func (m *Members) Claim(ctx context.Context, on bool) {
	m.mu.Lock()
	m.claiming = on
	m.mu.Unlock()
	m.announce(ctx)
	m.update()
}

// Claimer is the live member every partition goes to, "" when none
// claims them.
func (m *Members) Claimer() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.claimer
}

// Wants reports whether this instance is the live member that should hold
// the partition called part, one of the parts the members were opened
// with.
func (m *Members) Wants(part string) bool {
	select {
	case <-m.joined:
	default:
		return false // the others are not known yet
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.assigned[part] == m.id
}

// Assign gives each of parts to one of the live members: rendezvous
// hashing with bounded loads. Each partition ranks the members by their
// hash with it. Taken in a fixed order, each partition goes to the first
// member of its ranking that holds fewer than the partitions over the
// members (rounded down); the ones left, one each, to the first of their
// ranking without one more. So every member holds its share or one more,
// every member computes the same assignment from the same live set, and a
// member joining or leaving moves few partitions besides those it takes or
// had.
func Assign(live, parts []string) map[string]string {
	got := make(map[string]string, len(parts))
	if len(live) == 0 {
		return got
	}
	floor := len(parts) / len(live)
	held := map[string]int{}
	extra := map[string]bool{}
	var left []string
	ordered := slices.Sorted(slices.Values(parts))
	for _, part := range ordered {
		if id := firstRanked(live, part, func(id string) bool { return held[id] < floor }); id != "" {
			got[part] = id
			held[id]++
			continue
		}
		left = append(left, part)
	}
	for _, part := range left {
		id := firstRanked(live, part, func(id string) bool { return !extra[id] })
		got[part] = id
		extra[id] = true
	}
	return got
}

// firstRanked is the member of live, ranked by its hash with part, that
// comes first among those ok takes ("" when none).
func firstRanked(live []string, part string, ok func(id string) bool) string {
	var best string
	var bestH uint64
	for _, id := range live {
		if !ok(id) {
			continue
		}
		sum := sha256.Sum256([]byte(id + "\x00" + part))
		if h := binary.BigEndian.Uint64(sum[:8]); best == "" || h > bestH || (h == bestH && id > best) {
			best, bestH = id, h
		}
	}
	return best
}

// Run announces this instance every TTL/3 and follows the others until
// ctx ends, then deletes its key, so that the others take its partitions
// at once.
func (m *Members) Run(ctx context.Context) error {
	key := membersPrefix(m.name) + m.id
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := m.kv.Delete(dctx, key); err != nil {
			m.log.Warn("leaving the members failed; the others see this instance gone a TTL from now", "err", err)
		}
	}()
	announce := func() { m.announce(ctx) }
	announce()
	go m.follow(ctx)
	t := time.NewTicker(m.ttl / 3)
	defer t.Stop()
	check := time.NewTicker(m.ttl / 6)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			announce()
		case <-check.C:
			m.update()
		}
	}
}

// announce writes this instance's key: it is live, and claims or not.
func (m *Members) announce(ctx context.Context) {
	m.mu.Lock()
	v := memberValue{Holder: m.holder, Renewed: time.Now().UTC(), ClaimsAll: m.claiming}
	m.mu.Unlock()
	b, _ := json.Marshal(v)
	actx, cancel := context.WithTimeout(ctx, m.ttl/3)
	defer cancel()
	if _, err := m.kv.Put(actx, membersPrefix(m.name)+m.id, b); err != nil && ctx.Err() == nil {
		m.log.Warn("announcing this instance failed; trying again", "err", err)
	}
}

// follow watches the members' keys, starting again when the watch ends.
func (m *Members) follow(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := m.kv.Watch(ctx, membersPrefix(m.name)+"*")
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("watching the members failed; trying again", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.ttl / 6):
			}
			continue
		}
		m.watch(ctx, w)
		_ = w.Stop()
	}
}

func (m *Members) watch(ctx context.Context, w jetstream.KeyWatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // the values there when the watch began are in
				m.update()
				m.mu.Lock()
				select {
				case <-m.joined:
				default:
					close(m.joined)
				}
				m.mu.Unlock()
				continue
			}
			id := strings.TrimPrefix(e.Key(), membersPrefix(m.name))
			m.mu.Lock()
			if e.Operation() == jetstream.KeyValuePut {
				if s, ok := m.seen[id]; !ok || s.rev != e.Revision() {
					// A value that cannot be read claims nothing.
					var v memberValue
					_ = json.Unmarshal(e.Value(), &v)
					m.seen[id] = memberSeen{rev: e.Revision(), at: time.Now(), claims: v.ClaimsAll}
				}
			} else {
				delete(m.seen, id)
			}
			m.mu.Unlock()
			m.update()
		}
	}
}

// update recomputes the live members and the claimer, telling Changed's
// readers of a change.
func (m *Members) update() {
	m.mu.Lock()
	defer m.mu.Unlock()
	live := []string{m.id}
	claimer := ""
	if m.claiming {
		claimer = m.id
	}
	for id, s := range m.seen {
		if id != m.id && time.Since(s.at) < m.ttl {
			live = append(live, id)
			if s.claims && (claimer == "" || id < claimer) {
				claimer = id
			}
		}
	}
	slices.Sort(live)
	if slices.Equal(live, m.live) && claimer == m.claimer {
		return
	}
	m.log.Info("members changed", "live", len(live), "was", len(m.live), "claimer", claimer)
	m.live, m.claimer = live, claimer
	m.assigned = Assign(live, m.parts)
	if claimer != "" {
		for part := range m.assigned {
			m.assigned[part] = claimer
		}
	}
	close(m.changed)
	m.changed = make(chan struct{})
}

// The mark of a service moved to partitions: the key <name>.partitioned
// in the leases' bucket. Its partitions' instances write it before they
// wait for the store's one writer to stop (its lease, <name>, released or
// expired); that writer, and any instance started without partitions,
// reads it after taking the lease, and while holding it, and stops.

// partitionedKey is the key of name's mark.
func partitionedKey(name string) string { return name + ".partitioned" }

type partitionedValue struct {
	Partitions int       `json:"partitions"`
	Since      time.Time `json:"since"`
}

// MarkPartitioned records that the service of this lease now writes in n
// partitions.
func (l *Lease) MarkPartitioned(ctx context.Context, n int) error {
	b, _ := json.Marshal(partitionedValue{Partitions: n, Since: l.cfg.Clock.Now().UTC()})
	if _, err := l.kv.Put(ctx, partitionedKey(l.cfg.Name), b); err != nil {
		return fmt.Errorf("lease: marking %s partitioned: %w", l.cfg.Name, err)
	}
	return nil
}

// Partitioned reads the mark of [Lease.MarkPartitioned]: the number of
// partitions, 0 when the service is not partitioned.
func (l *Lease) Partitioned(ctx context.Context) (int, error) {
	e, err := l.kv.Get(ctx, partitionedKey(l.cfg.Name))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return 0, nil
	case err != nil:
		return 0, err
	}
	var v partitionedValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return 0, fmt.Errorf("lease: %s: unreadable value: %w", partitionedKey(l.cfg.Name), err)
	}
	return v.Partitions, nil
}
