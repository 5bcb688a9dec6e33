package bridge

import "github.com/prometheus/client_golang/prometheus"

// metrics of the bridge (registered on Options.Registerer when set).
type metrics struct {
	running        prometheus.Gauge
	finished       *prometheus.CounterVec
	entityStatus   *prometheus.CounterVec
	bytesIn        prometheus.Counter
	bytesOut       prometheus.Counter
	retries        prometheus.Counter
	reconnects     prometheus.Counter
	claims         *prometheus.CounterVec
	digestMismatch prometheus.Counter
	resultParts    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pipestream_bridge_documents_active",
			Help: "Documents accepted and not yet terminal (PENDING or RUNNING)."}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_documents_finished_total",
			Help: "Documents that reached a terminal state, by state."}, []string{"state"}),
		entityStatus: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_entity_status_total",
			Help: "STATUS frames received from the peer, by entity status."}, []string{"status"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_bytes_in_total",
			Help: "Document content bytes accepted."}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_bytes_out_total",
			Help: "Result bytes received from the peer."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_dispatch_retries_total",
			Help: "Documents re-dispatched after a session loss, GOAWAY or send failure."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_session_connects_total",
			Help: "Peer sessions established (the first connect and every reconnect)."}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_claims_total",
			Help: "Claim check events, by action (issued, redeemed, expired, rejected)."}, []string{"action"}),
		digestMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_scope_digest_mismatch_total",
			Help: "SCOPE_DIGEST frames whose Merkle root differed from the recomputed one."}),
		resultParts: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_result_parts_total",
			Help: "Parts of streamed results appended (docs/profile.md 4.3.1)."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.running, m.finished, m.entityStatus, m.bytesIn, m.bytesOut,
			m.retries, m.reconnects, m.claims, m.digestMismatch, m.resultParts} {
			_ = reg.Register(c)
		}
	}
	return m
}
