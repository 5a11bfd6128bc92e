package projector

import "github.com/prometheus/client_golang/prometheus"

// Metrics of a projector runtime. Several projectors in one process (the
// dev mode) each register theirs with a constant "projector" label.
type Metrics struct {
	Events          *prometheus.CounterVec // by result: applied, skipped, superseded
	DeadLetters     *prometheus.CounterVec // by code
	Retries         prometheus.Counter
	BatchSeconds    prometheus.Histogram
	CommitToApplied prometheus.Histogram
	Pending         prometheus.Gauge
	// Missed counts the events never delivered (Config.EveryEvent): purged
	// by the stream's limits (per-subject history, age, size) before the runtime read them.
	Missed prometheus.Counter
	// Fenced counts events not written because another instance holds the
	// store's lease; Standby is 1 while this instance waits for it, and
	// Takeovers counts the terms this instance began.
	Fenced    prometheus.Counter
	Standby   prometheus.Gauge
	Takeovers prometheus.Counter
}

// latencyBuckets are the bounds (seconds) of the commit -> applied
// histogram: a few milliseconds apart around the tens of milliseconds where
// a latency objective sits (50 ms is a bound, so the share of events
// within it is counted, not interpolated), then coarser up to the minutes
// a replay or a rebuild of old events takes.
var latencyBuckets = []float64{
	0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04,
	0.045, 0.05, 0.06, 0.07, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 2, 5, 10, 30, 60, 120, 300,
}

// NewMetrics creates a projector's metrics and registers them with reg
// (nil: unregistered), labelled with the projector's name.
func NewMetrics(reg prometheus.Registerer, name ...string) *Metrics {
	labels := prometheus.Labels{}
	if len(name) > 0 {
		labels["projector"] = name[0]
	}
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_projector_events_total", ConstLabels: labels,
			Help: "Events processed, by result: applied (rate: applied/s), skipped (the store held that version or a newer one), superseded (a newer version was in the same batch)."},
			[]string{"result"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_projector_dead_letters_total", ConstLabels: labels,
			Help: "Messages dead-lettered to converge.dlq.<projector>, by code."}, []string{"code"}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_projector_retries_total", ConstLabels: labels,
			Help: "Batches retried after a transient store error."}),
		BatchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "converge_projector_batch_seconds", ConstLabels: labels,
			Help: "Time to apply and acknowledge one batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}),
		CommitToApplied: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "converge_projector_commit_to_applied_seconds", ConstLabels: labels,
			Help: "From the event's Postgres commit to its store write.", Buckets: latencyBuckets}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_projector_consumer_pending", ConstLabels: labels,
			Help: "Messages of the stream not yet acknowledged by this projector (consumer lag)."}),
		Missed: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_projector_missed_events_total", ConstLabels: labels,
			Help: "Events this projector never received (it needs every event): stream sequences the stream's limits (per-subject history, age, size) removed before it read them."}),
		Fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_projector_fenced_events_total", ConstLabels: labels,
			Help: "Events neither written nor acknowledged because another instance took the store's lease (this one was paused or cut off)."}),
		Standby: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_projector_standby", ConstLabels: labels,
			Help: "1 while this instance stands by: another holds the store's lease."}),
		Takeovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "converge_projector_lease_terms_total", ConstLabels: labels,
			Help: "Times this instance took the store's lease (its first start included)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Events, m.DeadLetters, m.Retries, m.BatchSeconds, m.CommitToApplied, m.Pending, m.Missed,
			m.Fenced, m.Standby, m.Takeovers)
	}
	return m
}
