package sqlite

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the writer's Prometheus instruments; a nil *metrics records
// nothing.
type metrics struct {
	batches prometheus.Histogram
	latency prometheus.Histogram
	txns    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "store_commit_batches",
			Help:    "Batches committed per SQLite transaction (group commit size).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "store_commit_seconds",
			Help:    "Duration of one group-commit transaction including fsync.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		txns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "store_commit_transactions_total",
			Help: "Committed group-commit transactions.",
		}),
	}
	for _, c := range []prometheus.Collector{m.batches, m.latency, m.txns} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("store: metrics already registered (one Store per Registerer): %w", err)
			}
			return nil, fmt.Errorf("store: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) observe(batches int, d time.Duration) {
	if m == nil {
		return
	}
	m.batches.Observe(float64(batches))
	m.latency.Observe(d.Seconds())
	m.txns.Inc()
}
