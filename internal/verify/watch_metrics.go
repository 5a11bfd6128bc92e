package verify

import "github.com/prometheus/client_golang/prometheus"

// WatchMetrics are the continuous verifier's metrics, each by store
// ("index", "graph").
type WatchMetrics struct {
	Buckets         *prometheus.GaugeVec
	Agreeing        *prometheus.GaugeVec
	ProvenFraction  *prometheus.GaugeVec
	ProvenDocuments *prometheus.GaugeVec
	OldestProof     *prometheus.GaugeVec
	LastFullPass    *prometheus.GaugeVec
	Passes          *prometheus.CounterVec
	Differences     *prometheus.GaugeVec
	Unsettled       *prometheus.GaugeVec
	Named           *prometheus.CounterVec
	Compared        *prometheus.CounterVec
	Repairs         *prometheus.CounterVec
	Errors          *prometheus.CounterVec
	Behind          *prometheus.CounterVec
	ProjectionWait  *prometheus.HistogramVec
	PassTarget      prometheus.Gauge
}

// NewWatchMetrics registers the continuous verifier's metrics on reg (nil:
// none).
func NewWatchMetrics(reg prometheus.Registerer) *WatchMetrics {
	store := []string{"store"}
	m := &WatchMetrics{
		Buckets: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_buckets",
			Help: "Digest buckets the key space is walked in."}, store),
		Agreeing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_buckets_agreeing",
			Help: "Buckets whose last comparison proved the store in agreement with Postgres (equal digests, the store read after its projection passed the position Postgres was read at)."}, store),
		ProvenFraction: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_proven_fraction",
			Help: "converge_verify_buckets_agreeing / converge_verify_buckets: the part of the key space proven in agreement."}, store),
		ProvenDocuments: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_proven_documents",
			Help: "Postgres's documents in the buckets proven in agreement, as of each bucket's proof."}, store),
		OldestProof: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_oldest_proof_timestamp_seconds",
			Help: "The oldest Postgres read among the agreeing buckets' proofs: every agreeing bucket was proven at or after it (0: none)."}, store),
		LastFullPass: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_last_full_pass_timestamp_seconds",
			Help: "When the last walk over every bucket in which every bucket was compared ended (0: none yet)."}, store),
		Passes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_full_passes_total",
			Help: "Walks over every bucket in which every bucket was compared."}, store),
		Differences: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_differences",
			Help: "Documents named as differing (found by two comparisons in a row) and not found gone since."}, store),
		Unsettled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "converge_verify_unsettled_buckets",
			Help: "Buckets whose documents differed at their last comparison without every difference named yet (writes in flight, or a difference seen once)."}, store),
		Named: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_differences_named_total",
			Help: "Differences named (a document found differing by two comparisons in a row)."}, store),
		Compared: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_buckets_compared_total",
			Help: "Bucket digests compared, by result: agree or differ."}, []string{"store", "result"}),
		Repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_repairs_total",
			Help: "Repairs of differences named, by outcome: reemitted (the document re-emitted through the writer), repaired (the difference gone after it), unrepairable (a re-emission cannot repair it)."},
			[]string{"store", "outcome"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_errors_total",
			Help: "Steps that failed to read a side (Postgres, the store, or the pipeline's progress)."}, store),
		Behind: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converge_verify_projection_behind_total",
			Help: "Steps whose buckets stayed unproven because the projection did not pass the position Postgres was read at in time."}, store),
		ProjectionWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "converge_verify_projection_wait_seconds",
			Help:    "From a Postgres read to the projection having passed its position.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}, store),
		PassTarget: prometheus.NewGauge(prometheus.GaugeOpts{Name: "converge_verify_pass_target_seconds",
			Help: "How long a walk over every bucket is set to take (-watch-pass)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Buckets, m.Agreeing, m.ProvenFraction, m.ProvenDocuments, m.OldestProof, m.LastFullPass, m.Passes,
			m.Differences, m.Unsettled, m.Named, m.Compared, m.Repairs, m.Errors, m.Behind, m.ProjectionWait, m.PassTarget)
	}
	return m
}
