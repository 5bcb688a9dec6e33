package retention

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the event log's Prometheus metrics (draft section 4.1:
// "Expose metrics on storage savings and client serial number
// distribution"). A nil *Metrics records nothing.
type Metrics struct {
	RetainedBytes   prometheus.Gauge
	RetainedEvents  prometheus.Gauge
	BytesSaved      prometheus.Gauge
	SnapshotBytes   prometheus.Gauge
	TrackedClients  prometheus.Gauge
	ActiveClients   prometheus.Gauge
	LetGoClients    prometheus.Gauge
	ClientLag       prometheus.Histogram
	PrunedEvents    *prometheus.CounterVec
	PrunedBytes     *prometheus.CounterVec
	OutdatedCursor  prometheus.Counter
	ConsumerTooSlow prometheus.Counter
	Subscribers     prometheus.Gauge
	Appended        prometheus.Counter
}

// NewMetrics creates and registers the metrics on reg (nil: unregistered but
// usable).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "pipestream", "eventlog"
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &Metrics{
		RetainedBytes:  g("retained_bytes", "Bytes of events retained in the log."),
		RetainedEvents: g("retained_events", "Events retained in the log."),
		BytesSaved:     g("bytes_saved", "Retained bytes a size-only (RFC 8182) policy would keep minus what this policy keeps."),
		SnapshotBytes:  g("snapshot_bytes", "Size of a full snapshot, the cap on retained bytes."),
		TrackedClients: g("tracked_clients", "Anonymized clients in the retention tracker."),
		ActiveClients:  g("active_clients", "Tracked clients that counted in the last retention pass."),
		LetGoClients:   g("cost_model_let_go_clients", "Active clients the cost model did not count in the last retention pass: their delta cost more than the snapshot fallback it was expected to save."),
		ClientLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "client_lag_events",
			Help:    "Latest seq minus each active client's position, sampled at every retention pass.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 12),
		}),
		PrunedEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "pruned_events_total",
			Help: "Events pruned, by the rule that set the boundary."}, []string{"reason"}),
		PrunedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "pruned_bytes_total",
			Help: "Bytes pruned, by the rule that set the boundary."}, []string{"reason"}),
		OutdatedCursor:  c("outdated_cursor_total", "Subscriptions whose cursor was older than the window (snapshot fallback)."),
		ConsumerTooSlow: c("consumer_too_slow_total", "Subscriptions closed with ConsumerTooSlow."),
		Subscribers:     g("subscribers", "Open subscriptions."),
		Appended:        c("appended_events_total", "Events appended to the log."),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.RetainedBytes, m.RetainedEvents, m.BytesSaved, m.SnapshotBytes,
			m.TrackedClients, m.ActiveClients, m.LetGoClients, m.ClientLag, m.PrunedEvents, m.PrunedBytes, m.OutdatedCursor,
			m.ConsumerTooSlow, m.Subscribers, m.Appended} {
			// A second Log on the same registry (tests) keeps its metrics
			// unregistered rather than failing.
			_ = reg.Register(col)
		}
	}
	return m
}
