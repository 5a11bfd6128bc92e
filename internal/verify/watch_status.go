package verify

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/converge-sync/converge/internal/httpjson"
)

// NamedDifference is a difference the [Watcher] named: found by two
// comparisons in a row, each made once the store's projection had passed
// the position Postgres was read at, Postgres's document unchanged
// between them.
type NamedDifference struct {
	Store   string    `json:"store"`
	Key     string    `json:"key"`
	Bucket  int       `json:"bucket"`
	Problem string    `json:"problem"`
	Detail  string    `json:"detail"`
	NamedAt time.Time `json:"named_at"`
	// LastSeen is the Postgres read of the last comparison that found it.
	LastSeen   time.Time `json:"last_seen"`
	Repairable bool      `json:"repairable"`
	// Reemitted is when it was re-emitted through the writer (repairs on).
	Reemitted *time.Time `json:"reemitted,omitempty"`
	// Unrepairable says why a re-emission cannot repair it (repairs on).
	Unrepairable string `json:"unrepairable,omitempty"`
	// RepairError is why its re-emission failed.
	RepairError string `json:"repair_error,omitempty"`
}

// WatchStatus is what the [Watcher] knows: GET /v1/verify/status.
type WatchStatus struct {
	Buckets int          `json:"buckets"`
	Step    int          `json:"step"`
	Pass    string       `json:"pass"` // how long a walk over every bucket takes at least
	Repair  bool         `json:"repair"`
	Started time.Time    `json:"started"`
	Stores  []StoreProof `json:"stores"`
}

// StoreProof is how much of a store is proven in agreement, and what
// differs.
type StoreProof struct {
	Store string `json:"store"`
	Kind  Kind   `json:"kind"`
	// BucketsAgreeing of Buckets were proven in agreement at their last
	// comparison; ProvenFraction is their share.
	BucketsAgreeing int     `json:"buckets_agreeing"`
	ProvenFraction  float64 `json:"proven_fraction"`
	// ProvenDocuments are Postgres's documents in those buckets.
	ProvenDocuments int `json:"proven_documents"`
	// ProvenSince: every agreeing bucket was proven at or after it.
	ProvenSince *time.Time `json:"proven_since,omitempty"`
	// LastFullPass ended the last walk in which every bucket was compared.
	LastFullPass *time.Time `json:"last_full_pass,omitempty"`
	FullPasses   int        `json:"full_passes"`
	// UnsettledBuckets differed at their last comparison with a
	// difference not named yet.
	UnsettledBuckets []int `json:"unsettled_buckets"`
	// Differences are the differences named, in key order, at most
	// [MaxStatusDifferences] of DifferencesNamed.
	Differences      []NamedDifference `json:"differences"`
	DifferencesNamed int               `json:"differences_named"`
}

// MaxStatusDifferences bounds the differences a [StoreProof] lists: a
// store emptied by accident differs on every document, which its log
// names one by one.
const MaxStatusDifferences = 1000

// Status is what w knows now.
func (w *Watcher) Status() WatchStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := WatchStatus{Buckets: w.cfg.Buckets, Step: w.cfg.Step, Pass: w.cfg.Pass.String(), Repair: w.cfg.Reemitter != nil, Started: w.started,
		Stores: []StoreProof{}}
	for _, p := range w.stores {
		out.Stores = append(out.Stores, w.proof(p.Side.Name()))
	}
	return out
}

// proof is store's proof; w.mu is held.
func (w *Watcher) proof(store string) StoreProof {
	st := w.state[store]
	pr := StoreProof{Store: store, Kind: st.kind, FullPasses: st.passes, UnsettledBuckets: []int{}, Differences: []NamedDifference{}}
	var since time.Time
	for _, b := range st.buckets {
		if !b.agrees {
			continue
		}
		pr.BucketsAgreeing++
		pr.ProvenDocuments += b.docs
		if since.IsZero() || b.provenAt.Before(since) {
			since = b.provenAt
		}
	}
	pr.ProvenFraction = float64(pr.BucketsAgreeing) / float64(len(st.buckets))
	if !since.IsZero() {
		pr.ProvenSince = &since
	}
	if !st.lastFullPass.IsZero() {
		t := st.lastFullPass
		pr.LastFullPass = &t
	}
	for b := range st.unsettled {
		pr.UnsettledBuckets = append(pr.UnsettledBuckets, b)
	}
	slices.Sort(pr.UnsettledBuckets)
	for _, d := range st.named {
		pr.Differences = append(pr.Differences, *d)
	}
	slices.SortFunc(pr.Differences, func(a, b NamedDifference) int { return strings.Compare(a.Key, b.Key) })
	pr.DifferencesNamed = len(pr.Differences)
	pr.Differences = pr.Differences[:min(len(pr.Differences), MaxStatusDifferences)]
	return pr
}

// publish sets store's gauges from its state.
func (w *Watcher) publish(store string) {
	m := w.cfg.Metrics
	if m == nil {
		return
	}
	w.mu.Lock()
	pr := w.proof(store)
	w.mu.Unlock()
	m.Buckets.WithLabelValues(store).Set(float64(w.cfg.Buckets))
	m.Agreeing.WithLabelValues(store).Set(float64(pr.BucketsAgreeing))
	m.ProvenFraction.WithLabelValues(store).Set(pr.ProvenFraction)
	m.ProvenDocuments.WithLabelValues(store).Set(float64(pr.ProvenDocuments))
	m.OldestProof.WithLabelValues(store).Set(unixSeconds(pr.ProvenSince))
	m.LastFullPass.WithLabelValues(store).Set(unixSeconds(pr.LastFullPass))
	m.Differences.WithLabelValues(store).Set(float64(pr.DifferencesNamed))
	m.Unsettled.WithLabelValues(store).Set(float64(len(pr.UnsettledBuckets)))
}

func unixSeconds(t *time.Time) float64 {
	if t == nil {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// StatusHandler serves GET /v1/verify/status: w's [WatchStatus] as JSON.
func (w *Watcher) StatusHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		httpjson.Write(rw, http.StatusOK, w.Status())
	})
}
