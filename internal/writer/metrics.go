package writer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/converge-sync/converge/internal/docstore"
)

// Metrics of the writer. Register them once with a registry from main.
type Metrics struct {
	Requests     *prometheus.CounterVec   // by route and HTTP status
	Documents    *prometheus.CounterVec   // by source and result
	TxSeconds    *prometheus.HistogramVec // one write statement or transaction, by path
	Retries      prometheus.Counter
	DeadLetter   *prometheus.CounterVec // ingest messages dead-lettered, by code
	OutboxPruned prometheus.Counter
	InboxRefused *prometheus.CounterVec // handed-over documents refused, by code
	// InboxSourceUnreadable is 1 for a source whose view could not be
	// read at its last attempt (its rows left pending), by source.
	InboxSourceUnreadable *prometheus.GaugeVec
}

// NewMetrics creates the writer's metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converge_writer_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		Documents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converge_writer_documents_total", Help: "Document writes by source (http, batch, ingest, inbox) and result (applied, unchanged, stale, conflict, invalid); re-emissions as source reemit, result reemitted or not_found.",
		}, []string{"source", "result"}),
		TxSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "converge_writer_tx_seconds", Help: "Latency of one write transaction, by path (single, batch, ingest, inbox, reemit).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"path"}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converge_writer_retries_total", Help: "Write statements retried after a serialization failure, deadlock or safe-to-retry connection error.",
		}),
		DeadLetter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converge_writer_ingest_dead_letters_total", Help: "Ingest messages sent to the dead-letter subject, by error code.",
		}, []string{"code"}),
		OutboxPruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converge_writer_outbox_pruned_total", Help: "Outbox rows deleted by retention.",
		}),
		InboxRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converge_writer_inbox_refused_total",
			Help: "Documents handed over in converge_inbox that the writer refused (kept there with the code and message), by code.",
		}, []string{"code"}),
		InboxSourceUnreadable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "converge_writer_inbox_source_unreadable",
			Help: "1 when the source's view could not be read at its last attempt: its changed rows stay pending in converge_inbox until it can, by source.",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.Documents, m.TxSeconds, m.Retries, m.DeadLetter, m.OutboxPruned, m.InboxRefused, m.InboxSourceUnreadable)
	}
	return m
}

func (m *Metrics) count(source string, outs []docstore.Outcome) {
	for _, o := range outs {
		m.Documents.WithLabelValues(source, outcomeLabel(o)).Inc()
	}
}

func outcomeLabel(o docstore.Outcome) string {
	switch {
	case o.Err == nil:
		return string(o.Result)
	case isConflict(o.Err):
		return "conflict"
	default:
		return "invalid"
	}
}
