package relay

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the relay.
type Metrics struct {
	Published  prometheus.Counter
	Duplicates prometheus.Counter
	// EffectsPublished and EffectsDuplicates are the same of the effects'
	// stream (EffectsConfig).
	EffectsPublished  prometheus.Counter
	EffectsDuplicates prometheus.Counter
	// Skipped counts the events a session did not publish again because
	// the recorded position shows them stored (see PositionBucket).
	Skipped prometheus.Counter
	// CatchUp counts the outbox rows a catch-up handled (see catchup.go),
	// by outcome: stored, duplicate (the duplicate window dropped it), or
	// held (the stream held it or a later event of its document).
	CatchUp *prometheus.CounterVec
	// Gated is 1 while Postgres has synchronous standbys, so that a
	// transaction is published once visible; GateWait is how long
	// transactions waited for that.
	Gated    prometheus.Gauge
	GateWait prometheus.Histogram
	// Refused counts the publishes the documents' stream refused because
	// its last sequence was not the one they expected (see
	// publisher.chained).
	Refused      prometheus.Counter
	Reemissions  prometheus.Counter
	Transactions prometheus.Counter
	PublishTime  prometheus.Histogram
	CommitToAck  prometheus.Histogram
	InFlight     prometheus.Gauge
	ConfirmedLSN prometheus.Gauge
	SlotLagBytes prometheus.Gauge
	Active       prometheus.Gauge
	// PublishFailing is 1 while publishing fails (Relay.Publishing).
	PublishFailing prometheus.Gauge
	SessionErrors  *prometheus.CounterVec
}

// NewMetrics creates the relay's metrics and registers them with reg (nil:
// unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := prometheus.ExponentialBuckets(0.00005, 2, 20)
	m := &Metrics{
		Published: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_events_published_total",
			Help: "Events acknowledged by JetStream (rate: events/s)."}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_duplicates_total",
			Help: "Republished events JetStream dropped as duplicates (after a restart)."}),
		EffectsPublished: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_effects_published_total",
			Help: "Events acknowledged by the effects' stream (CONVERGE_EVENTS), when the relay publishes to it."}),
		EffectsDuplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_effects_duplicates_total",
			Help: "Republished events the effects' stream dropped as duplicates."}),
		CatchUp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_relay_catchup_events_total",
			Help: "Outbox rows a catch-up handled before streaming from a slot it could not trust (a failover, a slot made by someone else), by outcome: stored, duplicate (the stream's duplicate window dropped it), or held (the stream held it or a later event of its document)."},
			[]string{"outcome"}),
		Gated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_synchronous_gate",
			Help: "1 while Postgres has synchronous standbys: a transaction is published only once visible, which is once they confirmed its commit."}),
		GateWait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "converge_relay_synchronous_wait_seconds",
			Help: "How long decoded transactions waited to become visible (their commit confirmed by the synchronous standbys) before being published.", Buckets: latency}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_skipped_total",
			Help: "Events a rewound slot resent that the relay did not publish again: its recorded position shows them stored (after a Postgres restart)."}),
		Refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_out_of_order_refused_total",
			Help: "Publishes the documents' stream refused because its last sequence was not the one they expected: an earlier publish was lost (a stream leader's loss), or another publisher wrote to the stream; the next session publishes them again in commit order."}),
		Reemissions: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_reemissions_total",
			Help: "Re-emitted events (converge backfill, verify --repair) acknowledged by JetStream; also counted in events_published_total."}),
		Transactions: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_relay_transactions_total",
			Help: "Transactions whose every event was acknowledged and whose end LSN was confirmed."}),
		PublishTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "converge_relay_publish_seconds",
			Help: "From publish to JetStream acknowledgement.", Buckets: latency}),
		CommitToAck: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "converge_relay_commit_to_ack_seconds",
			Help: "From the Postgres commit to the JetStream acknowledgement.", Buckets: latency}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_inflight",
			Help: "Publishes awaiting acknowledgement."}),
		ConfirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_confirmed_lsn",
			Help: "The LSN last confirmed to Postgres, as a number."}),
		SlotLagBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_slot_lag_bytes",
			Help: "WAL between the server's current position and the slot's confirmed position."}),
		Active: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_active",
			Help: "1 while this relay holds the slot, 0 while it waits as a standby."}),
		PublishFailing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_relay_publish_failing",
			Help: "1 while the relay's sessions fail to publish and no event was stored since the first failure (see /readyz for the error)."}),
		SessionErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_relay_session_errors_total",
			Help: "Replication sessions that failed to start or ended with an error, by cause (postgres, publish)."}, []string{"cause"}),
	}
	if reg != nil {
		reg.MustRegister(m.CatchUp, m.Published, m.Duplicates, m.EffectsPublished, m.EffectsDuplicates, m.Skipped, m.Refused, m.Reemissions, m.Transactions, m.PublishTime, m.CommitToAck, m.InFlight,
			m.ConfirmedLSN, m.SlotLagBytes, m.Active, m.PublishFailing, m.SessionErrors, m.Gated, m.GateWait)
	}
	return m
}
