package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/auth"
	"github.com/converge-sync/converge/internal/deadletter"
	"github.com/converge-sync/converge/internal/httpjson"
	"github.com/converge-sync/converge/internal/pipeline"
	"github.com/converge-sync/converge/internal/rebuild"
	"github.com/converge-sync/converge/internal/telemetry"
	"github.com/converge-sync/converge/internal/verify"
	"github.com/converge-sync/converge/internal/writer"
	"github.com/converge-sync/converge/pkg/contract"
)

// Reading is what the console read at one moment: GET
// /v1/console/reading.
type Reading struct {
	At time.Time `json:"at"`
	// Stages are the picture's boxes, left to right by Column.
	Stages    []Stage                   `json:"stages"`
	Slot      pipeline.SlotStatus       `json:"slot"`
	Outbox    pipeline.OutboxStatus     `json:"outbox"`
	Inbox     pipeline.InboxStatus      `json:"inbox"`
	Streams   []pipeline.StreamStatus   `json:"streams"`
	Consumers []pipeline.ConsumerStatus `json:"consumers"`
	// Holders are who holds each store's lease and each partition.
	Holders []Holder `json:"holders"`
	// Agreement is the continuous verifier's status, nil without one.
	Agreement   *verify.WatchStatus `json:"agreement,omitempty"`
	DeadLetters DeadLetters         `json:"dead_letters"`
	Rebuilds    []Rebuild           `json:"rebuilds"`
	// Errors are what could not be read this time, each "what: why".
	Errors []string `json:"errors"`
}

// Stage is one box of the pipeline's picture.
type Stage struct {
	// ID is "<kind>:<name>"; Kind is writer, slot, relay, stream,
	// consumer or store.
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Column int    `json:"column"`
	// Lag is what the stage has still to pass on, in LagUnit (events,
	// bytes of WAL); nil when it has no such measure.
	Lag     *float64 `json:"lag,omitempty"`
	LagUnit string   `json:"lag_unit,omitempty"`
	// Rate is what it passed on per second since the previous reading,
	// in RateUnit; nil on the first reading or when it could not be read.
	Rate     *float64 `json:"rate,omitempty"`
	RateUnit string   `json:"rate_unit"`
	// State is ok, behind (a lag), standby, differs (a store with named
	// differences), dead_letters or down (not read).
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
	// Feeds are the IDs of the stages it passes its output to.
	Feeds []string `json:"feeds,omitempty"`
}

// Holder is who holds a lease: a store's single writer, or a partition.
type Holder struct {
	Lease  string `json:"lease"`
	Kind   string `json:"kind"`             // store or partition
	Holder string `json:"holder"`           // "" when nobody does
	Source string `json:"source,omitempty"` // where it was read
}

// DeadLetters are the dead letters' summary and the oldest of each
// consumer's.
type DeadLetters struct {
	deadletter.Summary
	Pages []deadletter.Page `json:"pages"`
}

// Rebuild is a projector's rebuild in progress (or its last one), as the
// projector reports it, or as the rebuilds' bucket holds it when the
// projector could not be asked.
type Rebuild struct {
	Projector string          `json:"projector"`
	Status    *rebuild.Status `json:"status,omitempty"`
	State     *rebuild.State  `json:"state,omitempty"`
	// Fraction is how much of the stream the rebuild has applied.
	Fraction float64 `json:"fraction"`
}

// rates keeps each counter's recent values, to make rates of the next.
type rates map[string][]sample

type sample struct {
	v  float64
	at time.Time
}

// rateWindow is the span a rate is measured over at least, when readings
// come faster: counters move in bursts (a batch, a transaction), which a
// shorter span would show as zeros between spikes.
const rateWindow = 2 * time.Second

// rate is the per-second change of the counter key over the last
// rateWindow (or since the previous call, if that is longer ago); nil on
// the first call, or after the counter went back (a restart).
func (r rates) rate(key string, v float64, at time.Time) *float64 {
	past := r[key]
	if n := len(past); n > 0 && v < past[n-1].v {
		past = nil // reset
	}
	// Keep the samples within the window, and the last one before it.
	for len(past) > 1 && at.Sub(past[1].at) >= rateWindow {
		past = past[1:]
	}
	r[key] = append(past, sample{v, at})
	if len(past) == 0 {
		return nil
	}
	dt := at.Sub(past[0].at).Seconds()
	if dt <= 0 {
		return nil
	}
	x := (v - past[0].v) / dt
	return &x
}

func ptr(v float64) *float64 { return &v }

// read reads the whole pipeline; what cannot be read is named in Errors.
func (c *Console) read(ctx context.Context) Reading {
	ctx, cancel := context.WithTimeout(ctx, max(5*time.Second, 2*c.cfg.Interval))
	defer cancel()
	now := time.Now()
	r := Reading{At: now.UTC(), Stages: []Stage{}, Streams: []pipeline.StreamStatus{}, Consumers: []pipeline.ConsumerStatus{},
		Holders: []Holder{}, Rebuilds: []Rebuild{}, Errors: []string{}}
	fail := func(what string, err error) { r.Errors = append(r.Errors, what+": "+err.Error()) }
	var err error
	if r.Slot, err = pipeline.ReadSlot(ctx, c.cfg.DB, c.cfg.Slot); err != nil {
		fail("slot", err)
	}
	if r.Outbox, err = pipeline.ReadOutbox(ctx, c.cfg.DB); err != nil {
		fail("outbox", err)
	}
	if r.Inbox, err = pipeline.ReadInbox(ctx, c.cfg.DB); err != nil {
		fail("inbox", err)
	}
	js := c.cfg.JS
	streams, consumed := pipeline.Deployment(ctx, js, writer.IngestStream, writer.IngestDLQName)
	if r.Streams, err = pipeline.ReadStreams(ctx, js, streams...); err != nil {
		fail("streams", err)
	}
	if r.Consumers, err = pipeline.ReadConsumers(ctx, js, consumed...); err != nil {
		fail("consumers", err)
	}
	if r.Streams == nil {
		r.Streams = []pipeline.StreamStatus{}
	}
	if r.Consumers == nil {
		r.Consumers = []pipeline.ConsumerStatus{}
	}
	r.DeadLetters = c.readDeadLetters(ctx, fail)
	if c.cfg.Verify != "" {
		var st verify.WatchStatus
		if err := c.getJSON(ctx, c.cfg.Verify, "/v1/verify/status", &st); err != nil {
			fail("verify -watch", err)
		} else {
			r.Agreement = &st
		}
	}
	metrics := map[string]*telemetry.Metrics{}
	for _, s := range c.services() {
		m, err := c.scrape(ctx, s.Addr)
		if err != nil {
			fail(s.Name+" metrics", err)
			continue
		}
		metrics[s.Name] = &m
	}
	r.Rebuilds = c.readRebuilds(ctx, fail)
	r.Stages = c.stages(&r, metrics, now)
	r.Holders = holders(r.Consumers, c.cfg.Projectors, metrics)
	return r
}

// services are the services whose /metrics are read.
func (c *Console) services() []Service {
	var out []Service
	for _, s := range append([]Service{{"writer", c.cfg.Writer}, {"relay", c.cfg.Relay}}, c.cfg.Projectors...) {
		if s.Addr != "" {
			out = append(out, s)
		}
	}
	return out
}

func (c *Console) readDeadLetters(ctx context.Context, fail func(string, error)) DeadLetters {
	out := DeadLetters{Summary: deadletter.Summary{Stream: deadletter.Stream, Consumers: []deadletter.ConsumerSummary{}}, Pages: []deadletter.Page{}}
	q, err := deadletter.Open(ctx, c.cfg.JS)
	if err != nil {
		fail("dead letters", err)
		return out
	}
	sum, err := q.Summarize(ctx, 10*c.cfg.DeadLetterLimit)
	if err != nil {
		fail("dead letters", err)
		return out
	}
	out.Summary = sum
	for _, cs := range sum.Consumers {
		p, err := q.Read(ctx, cs.Consumer, c.cfg.DeadLetterLimit)
		var unknown *deadletter.UnknownConsumerError
		if errors.As(err, &unknown) {
			continue // redriven meanwhile
		}
		if err != nil {
			fail("dead letters of "+cs.Consumer, err)
			continue
		}
		out.Pages = append(out.Pages, p)
	}
	return out
}

// readRebuilds asks each projector for its rebuild, and reads the
// rebuilds' bucket for those it could not ask.
func (c *Console) readRebuilds(ctx context.Context, fail func(string, error)) []Rebuild {
	out := []Rebuild{}
	asked := map[string]bool{}
	for _, p := range c.cfg.Projectors {
		if p.Addr == "" {
			continue
		}
		rc := &rebuild.Client{Addr: p.Addr, HTTP: c.cfg.HTTP, Token: c.cfg.Token, InsecurePlainHTTP: c.cfg.InsecurePlainHTTP}
		st, err := rc.Status(ctx)
		if err != nil {
			fail(p.Name+" rebuild status", err)
			continue
		}
		asked[st.Projector] = true
		if st.Phase == rebuild.PhaseIdle || st.Phase == rebuild.PhaseStarting {
			continue
		}
		rb := Rebuild{Projector: st.Projector, Status: &st}
		if st.StreamLastSeq > 0 {
			rb.Fraction = min(1, float64(st.AppliedSeq)/float64(st.StreamLastSeq))
		}
		if st.Phase == rebuild.PhaseDone {
			rb.Fraction = 1
		}
		out = append(out, rb)
	}
	states, err := rebuild.InProgress(ctx, c.cfg.JS)
	if err != nil {
		fail("rebuilds", err)
	}
	for _, s := range states {
		if !asked[s.Projector] {
			out = append(out, Rebuild{Projector: s.Projector, State: &s})
		}
	}
	return out
}

// getJSON GETs path at addr, sending the token.
func (c *Console) getJSON(ctx context.Context, addr, path string, out any) error {
	u, err := auth.Endpoint{Addr: addr, Token: c.cfg.Token, InsecurePlainHTTP: c.cfg.InsecurePlainHTTP}.URL(path, nil)
	if err != nil {
		return err
	}
	return httpjson.Get(ctx, c.cfg.HTTP, u, c.cfg.Token, 8<<20, out)
}

// scrape reads the /metrics of the service at addr (open to all: no
// token).
func (c *Console) scrape(ctx context.Context, addr string) (telemetry.Metrics, error) {
	u, err := auth.Endpoint{Addr: addr, InsecurePlainHTTP: c.cfg.InsecurePlainHTTP}.URL("/metrics", nil)
	if err != nil {
		return telemetry.Metrics{}, err
	}
	return telemetry.ScrapeWith(ctx, c.cfg.HTTP, u)
}

// lsnBytes is a WAL position ("16/B374D848") as a byte offset.
func lsnBytes(lsn string) (float64, bool) {
	hi, lo, ok := strings.Cut(lsn, "/")
	if !ok {
		return 0, false
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return float64(h<<32 | l), true
}

// storeOf is the store a consumer writes: its name up to a "-rebuild" or
// a partition's "-pNN" ("index-p03" writes "index").
func storeOf(consumer string) string {
	name, _, _ := strings.Cut(consumer, "-rebuild")
	if i := strings.LastIndex(name, "-p"); i > 0 {
		if _, err := strconv.Atoi(name[i+2:]); err == nil {
			name = name[:i]
		}
	}
	return name
}

// slotBehind is the WAL a slot retains past its confirmed position above
// which its stage is drawn behind: an idle slot retains a few records.
const slotBehind = 1 << 20

// stages draws the reading as the picture's boxes.
func (c *Console) stages(r *Reading, metrics map[string]*telemetry.Metrics, now time.Time) []Stage {
	var out []Stage
	counter := func(service, name string, labels telemetry.Labels) *float64 {
		m := metrics[service]
		if m == nil {
			return nil
		}
		return c.rates.rate(service+"/"+name, m.Sum(name, labels), now)
	}
	state := func(service string) string {
		if _, ok := metrics[service]; !ok {
			return "down"
		}
		return "ok"
	}
	streams := map[string]pipeline.StreamStatus{}
	for _, s := range r.Streams {
		if s.Exists {
			streams[s.Name] = s
		}
	}

	// Producers' documents: the ingest consumer is the writer's.
	writerID := "writer:writer"
	for _, cs := range r.Consumers {
		if cs.Stream != writer.IngestStream {
			continue
		}
		out = append(out, c.consumerStage(cs, 0, now, []string{writerID}))
	}
	if c.cfg.Writer != "" {
		out = append(out, Stage{ID: writerID, Kind: "writer", Name: "writer", Column: 1, RateUnit: "documents/s",
			Rate: counter("writer", "converge_writer_documents_total", telemetry.Labels{"result": "applied"}), State: state("writer"),
			Detail: fmt.Sprintf("inbox %d pending, %d refused", r.Inbox.Pending, r.Inbox.Refused), Feeds: []string{"slot:" + r.Slot.Name}})
	}
	slot := Stage{ID: "slot:" + r.Slot.Name, Kind: "slot", Name: "slot " + r.Slot.Name, Column: 2, Lag: ptr(float64(r.Slot.LagBytes)), LagUnit: "bytes",
		RateUnit: "bytes/s", State: "ok", Detail: fmt.Sprintf("outbox %d rows; confirmed %s", r.Outbox.Rows, r.Slot.ConfirmedLSN), Feeds: []string{"relay:relay"}}
	if pos, ok := lsnBytes(r.Slot.ConfirmedLSN); ok {
		slot.Rate = c.rates.rate("slot", pos, now)
	}
	switch {
	case !r.Slot.Exists:
		slot.State, slot.Detail = "down", "missing: the relay creates it on its first start"
	case r.Slot.LagBytes > slotBehind:
		slot.State = "behind"
	}
	out = append(out, slot)
	// The streams the relay fills (the server copying the documents' one
	// into its partitions), in the order read.
	var fed []string
	for _, s := range r.Streams {
		if _, ok := streams[s.Name]; ok && (s.Name == contract.DocsStream || s.Name == contract.EventsStream || pipeline.Partitioned(s.Name)) {
			fed = append(fed, s.Name)
		}
	}
	relayFeeds := []string{}
	for _, name := range fed {
		relayFeeds = append(relayFeeds, "stream:"+name)
	}
	if c.cfg.Relay != "" {
		rl := Stage{ID: "relay:relay", Kind: "relay", Name: "relay", Column: 3, RateUnit: "events/s",
			Rate: counter("relay", "converge_relay_events_published_total", nil), State: state("relay"), Feeds: relayFeeds}
		if m := metrics["relay"]; m != nil {
			if v, err := m.Value("converge_relay_active", nil); err == nil && v == 0 {
				rl.State, rl.Detail = "standby", "standing by: another relay holds the slot"
			}
		}
		out = append(out, rl)
	} else {
		slot.Feeds = relayFeeds
		out[len(out)-1] = slot
	}
	consumersOf := map[string][]string{}
	for _, name := range fed {
		s := streams[name]
		st := Stage{ID: "stream:" + name, Kind: "stream", Name: name, Column: 4, RateUnit: "messages/s", State: "ok",
			Rate:   c.rates.rate("stream/"+name, float64(s.LastSeq), now),
			Detail: fmt.Sprintf("%d messages, seq %d..%d, %d consumers", s.Messages, s.FirstSeq, s.LastSeq, s.Consumers)}
		for _, cs := range r.Consumers {
			if cs.Stream == name {
				st.Feeds = append(st.Feeds, "consumer:"+cs.Stream+"/"+cs.Name)
			}
		}
		out = append(out, st)
	}
	stores := map[string]bool{}
	for _, p := range c.cfg.Projectors {
		stores[p.Name] = true
	}
	if r.Agreement != nil {
		for _, p := range r.Agreement.Stores {
			stores[p.Store] = true
		}
	}
	lagOf := map[string]float64{}
	for _, cs := range r.Consumers {
		if cs.Stream == writer.IngestStream {
			continue
		}
		var feeds []string
		if store := storeOf(cs.Name); stores[store] {
			feeds = []string{"store:" + store}
			if !strings.Contains(cs.Name, "-rebuild") {
				lagOf[store] += float64(cs.Pending) + float64(cs.AckPending)
			}
		}
		out = append(out, c.consumerStage(cs, 5, now, feeds))
		consumersOf[storeOf(cs.Name)] = append(consumersOf[storeOf(cs.Name)], cs.Name)
	}
	for _, store := range slices.Sorted(func(yield func(string) bool) {
		for s := range stores {
			if !yield(s) {
				return
			}
		}
	}) {
		st := Stage{ID: "store:" + store, Kind: "store", Name: store, Column: 6, RateUnit: "events/s", State: "ok", LagUnit: "events"}
		if lag, ok := lagOf[store]; ok {
			st.Lag = ptr(lag)
			if lag > 0 {
				st.State = "behind"
			}
		}
		if metrics[store] != nil {
			st.Rate = counter(store, "converge_projector_events_total", telemetry.Labels{"result": "applied"})
		} else if slices.ContainsFunc(c.cfg.Projectors, func(p Service) bool { return p.Name == store && p.Addr != "" }) {
			st.State = "down"
		}
		if r.Agreement != nil {
			for _, p := range r.Agreement.Stores {
				if p.Store != store {
					continue
				}
				st.Detail = fmt.Sprintf("%.0f%% proven in agreement (%d documents)", 100*p.ProvenFraction, p.ProvenDocuments)
				if p.DifferencesNamed > 0 {
					st.State = "differs"
					st.Detail += fmt.Sprintf(", %d differences", p.DifferencesNamed)
				}
			}
		}
		out = append(out, st)
	}
	return out
}

// consumerStage is a consumer's box: its lag is what it has not
// acknowledged, its rate its acknowledgement floor's progress.
func (c *Console) consumerStage(cs pipeline.ConsumerStatus, column int, now time.Time, feeds []string) Stage {
	st := Stage{ID: "consumer:" + cs.Stream + "/" + cs.Name, Kind: "consumer", Name: cs.Name, Column: column,
		Lag: ptr(float64(cs.Pending) + float64(cs.AckPending)), LagUnit: "events", RateUnit: "events/s", State: "ok",
		Rate:  c.rates.rate("consumer/"+cs.Stream+"/"+cs.Name, float64(cs.AckFloorSeq), now),
		Feeds: feeds, Detail: "of " + cs.Stream}
	if *st.Lag > 0 {
		st.State = "behind"
	}
	if cs.DeadLetters > 0 {
		st.State = "dead_letters"
		st.Detail += fmt.Sprintf("; %d dead letters", cs.DeadLetters)
	}
	if cs.Holder != "" {
		st.Detail += "; held by " + cs.Holder
	}
	return st
}

// holders are the partitions' holders (read from their leases, as
// converge status reads them) and, for each projector the console reads,
// whether the instance at its address writes its store or stands by.
func holders(consumers []pipeline.ConsumerStatus, projectors []Service, metrics map[string]*telemetry.Metrics) []Holder {
	out := []Holder{}
	for _, p := range projectors {
		m := metrics[p.Name]
		if m == nil {
			continue
		}
		h := Holder{Lease: p.Name, Kind: "store", Source: "converge_projector_standby of " + p.Addr}
		if v, err := m.Value("converge_projector_standby", nil); err == nil && v == 0 {
			h.Holder = "the instance at " + p.Addr
		} else if err == nil {
			h.Holder = "another instance (the one at " + p.Addr + " stands by)"
		} else {
			continue // partitioned: its partitions are below
		}
		out = append(out, h)
	}
	for _, cs := range consumers {
		if pipeline.Partitioned(cs.Stream) {
			out = append(out, Holder{Lease: cs.Name, Kind: "partition", Holder: cs.Holder, Source: "lease bucket"})
		}
	}
	return out
}
