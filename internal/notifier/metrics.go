package notifier

import "github.com/prometheus/client_golang/prometheus"

// Metrics of a notifier, labelled by target: its public name, the webhook
// URL's scheme and host (see targetNames).
type Metrics struct {
	Sent           *prometheus.CounterVec // effects answered 2xx
	Retried        *prometheus.CounterVec // failed attempts that will be retried
	Deduplicated   *prometheus.CounterVec // effects found already sent
	DeadLettered   *prometheus.CounterVec // effects given up after MaxAttempts
	TakenOver      *prometheus.CounterVec // stale claims taken over (a crashed sender's)
	Skipped        *prometheus.CounterVec // events not notified, by reason
	RequestSeconds *prometheus.HistogramVec
	InFlight       *prometheus.GaugeVec
}

// NewMetrics creates a notifier's metrics and registers them with reg
// (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_notifier_" + name, Help: help}, []string{label})
	}
	m := &Metrics{
		Sent:         counter("sent_total", "Notifications answered 2xx, by target.", "target"),
		Retried:      counter("retried_total", "Failed attempts (non-2xx, timeout, no connection) that will be retried with backoff, by target.", "target"),
		Deduplicated: counter("deduplicated_total", "Notifications not sent because the dedup store holds them as sent (redeliveries, replays), by target.", "target"),
		DeadLettered: counter("dead_lettered_total", "Notifications given up after the most attempts; their event goes to converge.dlq.<name>, by target.", "target"),
		TakenOver:    counter("claims_taken_over_total", "Claims older than the claim timeout taken over (a sender crashed after claiming), by target.", "target"),
		Skipped: counter("skipped_total", "Events not notified, by reason: beyond_window (committed longer than the window ago), "+
			"reemission (a repair of the projections).", "reason"),
		RequestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "converge_notifier_request_seconds",
			Help: "Latency of one webhook request, answered or not, by target.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"target"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_notifier_requests_in_flight",
			Help: "Webhook requests in flight, by target (at most the concurrency)."}, []string{"target"}),
	}
	if reg != nil {
		reg.MustRegister(m.Sent, m.Retried, m.Deduplicated, m.DeadLettered, m.TakenOver, m.Skipped, m.RequestSeconds, m.InFlight)
	}
	return m
}
