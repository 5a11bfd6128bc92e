package rebuild

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Register exports the manager's rebuilds on reg, labelled with the
// projector's name: whether one is in progress, the events it has still
// to apply (read from its consumer at each scrape), and how many finished
// since the process started.
func (m *Manager) Register(reg prometheus.Registerer) error {
	labels := prometheus.Labels{"projector": m.name}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "converge_rebuild_in_progress", ConstLabels: labels,
			Help: "1 while a rebuild of this projection runs (filling, switching or retrying a step), else 0."},
			func() float64 {
				m.mu.Lock()
				defer m.mu.Unlock()
				if m.active {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "converge_rebuild_pending_events", ConstLabels: labels,
			Help: "Events the rebuild in progress has still to apply (its consumer's pending and unacknowledged); 0 without one."},
			func() float64 {
				m.mu.Lock()
				active := m.active
				m.mu.Unlock()
				if !active {
					return 0
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				return float64(m.Status(ctx).Pending)
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "converge_rebuilds_completed_total", ConstLabels: labels,
			Help: "Rebuilds of this projection finished (switched to, or filled in place) since the process started."},
			func() float64 {
				m.mu.Lock()
				defer m.mu.Unlock()
				return float64(m.status.Completed)
			}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
