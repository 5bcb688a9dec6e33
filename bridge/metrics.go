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
	connects       *prometheus.CounterVec
	aborted        *prometheus.CounterVec
	claims         *prometheus.CounterVec
	digestMismatch prometheus.Counter
	resultParts    prometheus.Counter
	inlineResults  prometheus.Counter
	resultsRefused *prometheus.CounterVec
	ridingCreates  *prometheus.CounterVec
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
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_session_connects_total",
			Help: "Peer sessions established (the first connect and every reconnect), by peer address."}, []string{"peer"}),
		aborted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_peer_attempts_aborted_total",
			Help: "Dispatch attempts on the peer that ended without an outcome (session lost, GOAWAY before fully sent, send failure); the document is re-dispatched, to any peer."}, []string{"peer"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_claims_total",
			Help: "Claim check events, by action (issued, redeemed, expired, rejected, cancelled with its document, peer_unavailable)."}, []string{"action"}),
		digestMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_scope_digest_mismatch_total",
			Help: "SCOPE_DIGEST frames whose Merkle root differed from the recomputed one."}),
		resultParts: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_result_parts_total",
			Help: "Parts of streamed results appended (docs/profile.md 4.3.1)."}),
		inlineResults: prometheus.NewCounter(prometheus.CounterOpts{Name: "pipestream_bridge_inline_results_total",
			Help: "Results taken inline from a COMPLETE status instead of a result stream (docs/profile.md 4.3.2)."}),
		resultsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_results_refused_total",
			Help: "Entities a peer sent that the gateway did not take as a result (docs/profile.md 9.4), by reason: unmatched (names no live entity of the session), duplicate (a second result for one entity), ambiguous (an entity-id only, from a peer that numbers its own entities), form (not a profile result)."},
			[]string{"reason"}),
		ridingCreates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pipestream_bridge_riding_creates_total",
			Help: "Small documents dispatched before their creation committed (--create-hold), by how the creation committed: finished (with the terminal state and result, one commit), unfinished (the hold ran out first), dropped (the client left or the commit failed)."},
			[]string{"outcome"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.running, m.finished, m.entityStatus, m.bytesIn, m.bytesOut,
			m.retries, m.connects, m.aborted, m.claims, m.digestMismatch, m.resultParts, m.inlineResults, m.resultsRefused, m.ridingCreates} {
			_ = reg.Register(c)
		}
	}
	return m
}

// registerPeers registers the per-peer gauges (label peer: its address),
// read from the bridge's state at scrape time: whether the peer takes work,
// its documents in flight and its negotiated window.
func (m *metrics) registerPeers(b *Bridge, reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	for _, pc := range b.peers {
		labels := prometheus.Labels{"peer": pc.addr}
		read := func(f func(PeerStatus) float64) func() float64 {
			return func() float64 {
				b.mu.Lock()
				defer b.mu.Unlock()
				return f(pc.statusLocked())
			}
		}
		for _, g := range []prometheus.Collector{
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pipestream_bridge_peer_up", ConstLabels: labels,
				Help: "1 when the peer takes work (a session is up, or a draft-04 peer answered), else 0."},
				read(func(p PeerStatus) float64 { return b2f(p.State == "connected" || p.State == "idle") })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pipestream_bridge_peer_documents_in_flight", ConstLabels: labels,
				Help: "Documents whose current dispatch attempt runs on the peer's active session."},
				read(func(p PeerStatus) float64 { return float64(p.InFlight) })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pipestream_bridge_peer_window", ConstLabels: labels,
				Help: "The window (in-flight entities) negotiated on the peer's active session; 0 when none is up."},
				read(func(p PeerStatus) float64 { return float64(p.Window) })),
		} {
			_ = reg.Register(g)
		}
	}
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
