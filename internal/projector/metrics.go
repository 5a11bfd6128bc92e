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
			Help: "From the event's Postgres commit to its store write.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20)}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_projector_consumer_pending", ConstLabels: labels,
			Help: "Messages of the stream not yet acknowledged by this projector (consumer lag)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Events, m.DeadLetters, m.Retries, m.BatchSeconds, m.CommitToApplied, m.Pending)
	}
	return m
}
