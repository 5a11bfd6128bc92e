//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/converge-sync/converge/pkg/contract"
)

// outboxEvent is an outbox row.
type outboxEvent struct {
	ID       uuid.UUID
	Key      string
	Version  int64
	Withdraw bool
	Emission int64
}

// postgresState is what Postgres holds at the end.
type postgresState struct {
	docs   map[string]docRow
	events []outboxEvent
	byID   map[uuid.UUID]outboxEvent
}

type docRow struct {
	version int64
	deleted bool
}

func (p *pipeline) readPostgres(ctx context.Context) (*postgresState, error) {
	st := &postgresState{docs: map[string]docRow{}, byID: map[uuid.UUID]outboxEvent{}}
	rows, err := p.db.Query(ctx, `SELECT key, version, deleted FROM documents`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k string
		var d docRow
		if err := rows.Scan(&k, &d.version, &d.deleted); err != nil {
			return nil, err
		}
		st.docs[k] = d
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = p.db.Query(ctx, `SELECT event_id, key, version, kind, emission FROM outbox ORDER BY key, version`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var e outboxEvent
		var kind string
		if err := rows.Scan(&e.ID, &e.Key, &e.Version, &kind, &e.Emission); err != nil {
			return nil, err
		}
		e.Withdraw = kind == string(contract.KindWithdrawn)
		st.events = append(st.events, e)
		st.byID[e.ID] = e
	}
	return st, rows.Err()
}

// checkWrites: every write the writer acknowledged is in Postgres at its
// version or a newer one, and an applied write's event is in the outbox.
// It returns the problems (at most a few named) and their count.
func checkWrites(writes []write, st *postgresState) (problems []string, n int) {
	for _, w := range writes {
		d, ok := st.docs[w.Key]
		var problem string
		switch {
		case !ok:
			problem = "no document"
		case d.version < w.Version:
			problem = fmt.Sprintf("Postgres holds version %d", d.version)
		case d.version == w.Version && d.deleted != w.Withdraw:
			problem = fmt.Sprintf("Postgres holds it with deleted=%v", d.deleted)
		}
		if w.Result == "applied" {
			kind := contract.KindUpserted
			if w.Withdraw {
				kind = contract.KindWithdrawn
			}
			if _, ok := st.byID[contract.EventID(w.Key, w.Version, kind)]; !ok && problem == "" {
				problem = "applied, but its event is not in the outbox"
			}
		}
		if problem != "" {
			n++
			if len(problems) < 10 {
				problems = append(problems, fmt.Sprintf("%s v%d (withdraw %v, %s at %s): %s",
					w.Key, w.Version, w.Withdraw, w.Result, w.At.Format("15:04:05.000"), problem))
			}
		}
	}
	return problems, n
}

// verifyAgrees runs `converge verify` until it exits 0 or timeout passes,
// and returns how long that took from since, and the last output.
func (p *pipeline) verifyAgrees(ctx context.Context, since time.Time, timeout time.Duration) (time.Duration, string, error) {
	args := []string{"verify", "-index-addr", p.service("projector-index").addr, "-graph-addr", p.service("projector-graph").addr}
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		out, err := p.converge(cctx, p.operatorEnv(), args...)
		cancel()
		if err == nil {
			return time.Since(since), out, nil
		}
		if time.Now().After(deadline) {
			return time.Since(since), out, fmt.Errorf("converge verify did not exit 0 within %v: %w", timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// drained waits until every consumer of every stream but the buckets' and
// the dead letters' has nothing pending and nothing awaiting an
// acknowledgement, and the receiver has had nothing new for a second;
// it returns how long that took from since.
func (p *pipeline) drained(ctx context.Context, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	last, quiet := -1, time.Time{}
	for {
		idle, why := p.consumersIdle(ctx)
		if n := p.recv.count(); n != last {
			last, quiet = n, time.Now()
		}
		if idle && time.Since(quiet) > time.Second {
			return time.Since(since), nil
		}
		if time.Now().After(deadline) {
			return time.Since(since), fmt.Errorf("consumers not drained within %v: %s", timeout, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (p *pipeline) consumersIdle(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	names := p.js.StreamNames(ctx)
	for name := range names.Name() {
		if strings.HasPrefix(name, "KV_") || name == "CONVERGE_DLQ" || name == "CONVERGE_INGEST" {
			continue
		}
		s, err := p.js.Stream(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		cs := s.ListConsumers(ctx)
		for c := range cs.Info() {
			if c.Config.Durable == "" {
				continue // the suite's own readers, not a service's
			}
			if c.NumPending > 0 || c.NumAckPending > 0 {
				return false, fmt.Sprintf("%s/%s: %d pending, %d awaiting an ack", name, c.Name, c.NumPending, c.NumAckPending)
			}
		}
		if err := cs.Err(); err != nil {
			return false, err.Error()
		}
	}
	if err := names.Err(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// stored is one message of a stream.
type stored struct {
	Seq   uint64
	MsgID string
	At    time.Time
}

// readStream reads every message the stream stores.
func (p *pipeline) readStream(ctx context.Context, name string) ([]stored, error) {
	// On a cluster a server that restarted may not answer the JetStream
	// API for a moment after the faults ("no responders"): the check reads
	// again, from the start, for up to half a minute.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := p.readStreamOnce(ctx, name)
		noResponders := err != nil && (errors.Is(err, nats.ErrNoResponders) || strings.Contains(err.Error(), "no responders"))
		if !noResponders || time.Now().After(deadline) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(time.Second):
		}
	}
}

func (p *pipeline) readStreamOnce(ctx context.Context, name string) ([]stored, error) {
	info, err := p.streamInfo(ctx, name)
	if err != nil {
		return nil, err
	}
	if info.State.Msgs == 0 {
		return nil, nil
	}
	c, err := p.js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, err
	}
	var out []stored
	for uint64(len(out)) < info.State.Msgs {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return out, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return out, err
			}
			out = append(out, stored{Seq: md.Sequence.Stream, MsgID: m.Headers().Get(jetstream.MsgIDHeader), At: md.Timestamp})
			if md.Sequence.Stream >= info.State.LastSeq {
				return out, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoHeartbeat) {
			return out, err
		}
		if got == 0 {
			return out, fmt.Errorf("stream %s: read %d of %d messages, then nothing", name, len(out), info.State.Msgs)
		}
	}
	return out, nil
}

// streamReport is how the stream and the outbox compare.
type streamReport struct {
	Stored, Distinct int
	EverStored       uint64         // messages the stream stored over the run (its last sequence)
	Unread           uint64         // of those, purged before the tap read them
	Phantoms         int            // stored messages whose event is not in the outbox
	MissingNewest    int            // keys whose newest outbox event is not stored
	Gaps             int            // keys where a stored version has a newer outbox version not stored, unexplained
	GapsByDuplicate  int            // such keys where an older version was stored again (a duplicate) after newer ones
	MissingAll       int            // outbox events not stored (meaningful when history keeps all)
	Duplicates       int            // stored copies beyond the first of an event, over the run (the tap's)
	DuplicateEvents  int            // events stored more than once
	ByCause          map[string]int // duplicates by the fault that preceded them
	Examples         []string
}

// publishingFaults are the faults that can make the relay publish an
// event again: the active relay's death or pause, a Postgres crash (the
// slot rewinds to its last checkpoint), a NATS server restart. A
// standby publishes nothing.
var publishingFaults = []string{kindKillRelayA, kindPauseRelayA, kindCrashPostgres, kindKillNATS}

// compareStream compares the stream's messages with the outbox, event by
// event: every stored message is an outbox event; of each key, the stored
// events are the newest of the outbox with none skipped (the stream keeps
// a bounded history per subject), the newest always among them, and with
// keepsAll every outbox event is stored. Of what the tap read over the
// run (tapped), each stored copy beyond an event's first is attributed to the last fault that can make the relay
// publish again, before the copy was stored.
func compareStream(msgs, tapped []stored, st *postgresState, faults []*fault, keepsAll bool) streamReport {
	r := streamReport{Stored: len(msgs), ByCause: map[string]int{}}
	storedByKey := map[string]map[int64]bool{}
	distinct := map[string]bool{}
	for _, m := range msgs {
		distinct[m.MsgID] = true
		id, err := uuid.Parse(m.MsgID)
		e, ok := st.byID[id]
		if err != nil || !ok {
			r.Phantoms++
			if len(r.Examples) < 10 {
				r.Examples = append(r.Examples, fmt.Sprintf("stored seq %d, id %q: not an outbox event", m.Seq, m.MsgID))
			}
			continue
		}
		if storedByKey[e.Key] == nil {
			storedByKey[e.Key] = map[int64]bool{}
		}
		storedByKey[e.Key][e.Version] = true
	}
	r.Distinct = len(distinct)
	copies := map[string][]stored{}
	for _, m := range tapped {
		copies[m.MsgID] = append(copies[m.MsgID], m)
	}
	// Each key's stored messages in stream order: a version pushed out of
	// the bounded history by an older one stored again later (a duplicate
	// the restarted server's window forgot) is explained by that duplicate;
	// one pushed out by an older one stored late for the first time is an
	// event published out of commit order.
	storedMsgs := map[string][]string{}
	for _, m := range msgs {
		if id, err := uuid.Parse(m.MsgID); err == nil {
			if e, ok := st.byID[id]; ok {
				storedMsgs[e.Key] = append(storedMsgs[e.Key], m.MsgID)
			}
		}
	}
	for _, cs := range copies {
		if len(cs) < 2 {
			continue
		}
		r.DuplicateEvents++
		slices.SortFunc(cs, func(a, b stored) int { return int(a.Seq) - int(b.Seq) })
		for _, c := range cs[1:] {
			r.Duplicates++
			r.ByCause[cause(c.At, faults)]++
		}
	}
	byKey := map[string][]outboxEvent{}
	for _, e := range st.events {
		if e.Emission == 0 {
			byKey[e.Key] = append(byKey[e.Key], e)
		}
	}
	order := map[string][]string{} // each key's stored versions, in stream order
	for _, m := range msgs {
		if id, err := uuid.Parse(m.MsgID); err == nil {
			if e, ok := st.byID[id]; ok {
				order[e.Key] = append(order[e.Key], fmt.Sprint(e.Version))
			}
		}
	}
	for key, es := range byKey { // in version order (the query's)
		have := storedByKey[key]
		if !have[es[len(es)-1].Version] {
			r.MissingNewest++
			if len(r.Examples) < 10 {
				r.Examples = append(r.Examples, fmt.Sprintf("%s: newest version %d not stored", key, es[len(es)-1].Version))
			}
		}
		byDuplicate := false
		for _, id := range storedMsgs[key] {
			byDuplicate = byDuplicate || len(copies[id]) > 1
		}
		seen, gap := false, false
		for _, e := range es {
			if have[e.Version] {
				seen = true
			} else {
				r.MissingAll++
				if seen {
					gap = true
					if !byDuplicate && len(r.Examples) < 10 {
						r.Examples = append(r.Examples, fmt.Sprintf("%s: version %d not stored, an older one is (stored in stream order: %s)",
							key, e.Version, strings.Join(order[key], ", ")))
					}
				}
			}
		}
		switch {
		case gap && byDuplicate:
			r.GapsByDuplicate++
		case gap:
			r.Gaps++
		}
	}
	if !keepsAll {
		r.MissingAll = -1
	}
	return r
}

// cause is the last publishing fault that started before at ("no fault"
// when none did).
func cause(at time.Time, faults []*fault) string {
	for i := len(faults) - 1; i >= 0; i-- {
		if f := faults[i]; !f.Start.After(at) && (slices.Contains(publishingFaults, f.Kind) || f.Republishes) {
			return f.Kind
		}
	}
	return "no fault"
}

// effectReport is what the receiver saw against the outbox's events.
type effectReport struct {
	Events       int // original emissions in the outbox
	Requests     int
	Notified     int // events answered 2xx at least once
	Missing      int // events never answered 2xx
	Phantoms     int // requests for no outbox event
	WrongKeys    int // requests whose Idempotency-Key is not the effect's
	ManyKeys     int // events seen with more than one key
	Twice        int // effects answered 2xx more than once
	TwiceByCause map[string]int
	Invalid      int // requests not signed with the run's secret
	Examples     []string
}

// effectFaults are those that can make the notifier send an effect it
// already sent: its death, or NATS's, between the send and the mark.
var effectFaults = []string{kindKillNotifier, kindKillNATS}

func compareEffects(ds []delivery, st *postgresState, url string, faults []*fault) effectReport {
	r := effectReport{Requests: len(ds), TwiceByCause: map[string]int{}}
	keys := map[uuid.UUID]map[string]bool{}
	ok2xx := map[string][]time.Time{}
	for _, d := range ds {
		if !d.Valid {
			r.Invalid++
			continue
		}
		e, ok := st.byID[d.EventID]
		if !ok || e.Key != d.DocKey || e.Version != d.Version {
			r.Phantoms++
			continue
		}
		if d.Key != contract.EffectID("webhook:"+url, d.EventID).String() {
			r.WrongKeys++
		}
		if keys[d.EventID] == nil {
			keys[d.EventID] = map[string]bool{}
		}
		keys[d.EventID][d.Key] = true
		if d.Status >= 200 && d.Status < 300 {
			ok2xx[d.Key] = append(ok2xx[d.Key], d.At)
		}
	}
	for _, e := range st.events {
		if e.Emission != 0 {
			continue
		}
		r.Events++
		if len(keys[e.ID]) > 1 {
			r.ManyKeys++
		}
		if len(ok2xx[contract.EffectID("webhook:"+url, e.ID).String()]) > 0 {
			r.Notified++
		} else {
			r.Missing++
			if len(r.Examples) < 5 {
				r.Examples = append(r.Examples, fmt.Sprintf("%s v%d (%s) never notified", e.Key, e.Version, e.ID))
			}
		}
	}
	for key, ts := range ok2xx {
		if len(ts) < 2 {
			continue
		}
		r.Twice++
		c := effectCause(ts[0], ts[len(ts)-1], faults)
		r.TwiceByCause[c]++
		if c == "unexplained" && len(r.Examples) < 10 {
			r.Examples = append(r.Examples, fmt.Sprintf("effect %s answered 2xx at %s and %s", key, ts[0].Format("15:04:05.000"), ts[len(ts)-1].Format("15:04:05.000")))
		}
	}
	return r
}

// effectCause is the fault between two 2xx answers of one effect that
// can explain the second: the notifier's or NATS's death, a full NATS disk,
// a link to the receiver cut or frozen; "unexplained" otherwise. A fault
// explains the pair when it lasted into [first-1s, second]: a frozen link
// holds a request until it heals, and the receiver answers it then, after
// the notifier gave it up and before it sends it again.
func effectCause(first, second time.Time, faults []*fault) string {
	for _, f := range faults {
		if (slices.Contains(effectFaults, f.Kind) || f.Resends) && !f.End.Before(first.Add(-time.Second)) && !f.Start.After(second) {
			return f.Kind
		}
	}
	return "unexplained"
}

// deadLetters counts the messages of the dead letters' stream.
func (p *pipeline) deadLetters(ctx context.Context) uint64 {
	info, err := p.streamInfo(ctx, "CONVERGE_DLQ")
	if err != nil {
		return 0
	}
	return info.State.Msgs
}
