package bridge

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// ProfileMode says whether documents use this project's profile toward the
// peer (docs/profile.md 1.1).
type ProfileMode int

const (
	// ProfileAuto uses the profile when the peer answers the discovery
	// member of CAPABILITIES (this project's peer does; a draft-04 peer
	// never gets it).
	ProfileAuto ProfileMode = iota
	// ProfileOn uses the profile whatever the peer answers (draft-02 only).
	ProfileOn
	// ProfileOff sends plain entities (docs/profile.md 9).
	ProfileOff
)

// ParseProfileMode parses "auto", "on" or "off".
func ParseProfileMode(s string) (ProfileMode, error) {
	switch s {
	case "auto":
		return ProfileAuto, nil
	case "on":
		return ProfileOn, nil
	case "off":
		return ProfileOff, nil
	}
	return 0, fmt.Errorf("unknown profile mode %q: use auto, on or off", s)
}

// ParseFraming parses "auto", "draft-02" or "draft-04".
func ParseFraming(s string) (quicpeer.Framing, error) {
	switch s {
	case "auto":
		return quicpeer.FramingAuto, nil
	case "draft-02":
		return quicpeer.FramingDraft02, nil
	case "draft-04":
		return quicpeer.FramingDraft04, nil
	}
	return 0, fmt.Errorf("unknown framing %q: use auto, draft-02 or draft-04", s)
}

// PeerStatus is the bridge's view of one of its peers (/healthz, the
// console).
type PeerStatus struct {
	Addr string `json:"addr"`
	// State: connected, connecting (dialing, no session yet, no failure),
	// idle (nothing dials it: a draft-04 peer gets a connection per
	// document, opened when one is queued), down (the last dial or session
	// failed: LastError says why).
	State     string `json:"state"`
	Framing   string `json:"framing"`
	Profile   bool   `json:"profile"`
	InFlight  int    `json:"inFlight"`
	Window    uint32 `json:"window"`
	LastError string `json:"lastError,omitempty"`
	// Since is when the last error happened (RFC 3339), if any.
	Since string `json:"since,omitempty"`
	// FramingWorked is the framing of the last session that carried work
	// (auto framing keeps using it); empty before one did.
	FramingWorked string `json:"framingWorked,omitempty"`
	// ShortSessions counts sessions that ended right after the handshake
	// (each counted as a failed dial, with backoff).
	ShortSessions int `json:"shortSessions,omitempty"`
}

// peerConn is one peer of the bridge: where it is, how to reach it, and
// what the bridge knows about it. Its own connection loop keeps one
// active session to it (conn.go). addr, idx and ep never change; every
// other field is guarded by Bridge.mu.
type peerConn struct {
	addr string
	idx  int // position in Bridge.peers
	ep   PeerEndpoint
	// tls verifies the peer: built from ep.CAPEM, rebuilt when ep.CAFile
	// holds other certificates (reloadCALocked).
	tls   *tls.Config
	caPEM []byte

	mode    quicpeer.Framing // the configured framing (auto: detected)
	framing quicpeer.Framing // what the next dial uses
	lastErr string
	errAt   time.Time
	ok      bool // the last dial succeeded
	// worked is the framing of the last session that carried work ("" none
	// yet); delay is the next backoff, retryAt when the next dial may go;
	// shortSessions counts sessions that ended right after the handshake.
	worked        string
	delay         time.Duration
	retryAt       time.Time
	shortSessions int
	dialing       bool // the connection loop is dialing (or backing off), not waiting for work
	// sentEntity: the peer has sent an entity (a result) on some session;
	// absentStreak counts its documents in a row that ended with their
	// result absent (knownResultless).
	sentEntity   bool
	absentStreak int

	// sending: attempts the dispatcher placed on this peer whose sending
	// has not returned yet (runAttempt), at most maxConcurrentDispatch.
	sending  int
	active   *sessState    // the session new work goes to
	sessWake chan struct{} // closed when the active session should be replaced
	connKick chan struct{} // wakes the connection loop waiting for work (draft-04)
	connects prometheus.Counter
	aborted  prometheus.Counter // attempts on this peer that ended without an outcome
}

// newPeers builds the peers of the options (fill made Options.Peers whole).
func newPeers(o *Options, m *metrics) ([]*peerConn, error) {
	out := make([]*peerConn, 0, len(o.Peers))
	for i, ep := range o.Peers {
		tc, err := tlsConfig(o, ep)
		if err != nil {
			if len(o.Peers) > 1 {
				err = fmt.Errorf("peer %d (%s): %w", i+1, ep.Addr, err)
			}
			return nil, err
		}
		mode := o.PeerFraming
		if ep.Framing != quicpeer.FramingAuto {
			mode = ep.Framing
		}
		out = append(out, &peerConn{addr: ep.Addr, idx: i, ep: ep, tls: tc, caPEM: ep.CAPEM, mode: mode, framing: mode,
			connKick: make(chan struct{}, 1), connects: m.connects.WithLabelValues(ep.Addr),
			aborted: m.aborted.WithLabelValues(ep.Addr)})
	}
	return out, nil
}

// usableLocked returns the session new work may go to on pc: up, no
// GOAWAY (nil if none).
func (pc *peerConn) usableLocked() *sessState {
	if pc.active == nil || pc.active.goaway || pc.active.closed {
		return nil
	}
	return pc.active
}

// readyLocked reports whether pc takes work: a session is up, or a
// draft-04 peer answered (it gets a connection per document).
func (pc *peerConn) readyLocked() bool {
	return pc.usableLocked() != nil || (pc.ok && pc.framing == quicpeer.FramingDraft04)
}

// reloadCALocked reads pc's --peer-ca file again (when it has one) and,
// if it holds other certificates than the ones in use, rebuilds the TLS
// config that verifies the peer. An unreadable or empty file keeps the
// previous config and is returned. Called before every dial and by
// ReloadPeerCAs.
func (b *Bridge) reloadCALocked(pc *peerConn) error {
	if pc.ep.CAFile == "" {
		return nil
	}
	pem, err := os.ReadFile(pc.ep.CAFile)
	if err != nil {
		return fmt.Errorf("re-read the CA file of the PipeStream peer %s: %w", pc.addr, err)
	}
	if bytes.Equal(pem, pc.caPEM) {
		return nil
	}
	ep := pc.ep
	ep.CAPEM = pem
	tc, err := tlsConfig(&b.opts, ep)
	if err != nil {
		return fmt.Errorf("the CA file %s of the PipeStream peer %s: %w", pc.ep.CAFile, pc.addr, err)
	}
	pc.tls, pc.caPEM = tc, pem
	b.log.Info("bridge: the peer's CA file changed; new dials verify with it", "addr", pc.addr, "file", pc.ep.CAFile)
	return nil
}

// caReplacedLocked reports whether err, a failed dial of pc, is the
// peer's certificate failing verification against the CA certificates
// caUsed while pc's CA file now holds others: the file was rewritten
// while the dial ran, as when a peer restarts with a new certificate and
// its file is replaced beside it (the dial read the file before the
// rewrite and reached the restarted peer). The failure says nothing about
// the peer, and the file now read verifies it.
func (b *Bridge) caReplacedLocked(pc *peerConn, caUsed []byte, err error) bool {
	var verr *tls.CertificateVerificationError
	if pc.ep.CAFile == "" || !errors.As(err, &verr) {
		return false
	}
	if b.reloadCALocked(pc) != nil {
		return false
	}
	return !bytes.Equal(pc.caPEM, caUsed)
}

// testHookDialing, when set by a test (OnDialing), runs before each dial
// of a peer, once its TLS config is read.
var testHookDialing atomic.Pointer[func(addr string)]

// ReloadPeerCAs reads every peer's CA file again now (SIGHUP): a changed
// one is used from the next dial, which goes at once (the backoff starts
// over). It returns what could not be read; those peers keep their
// previous certificates.
func (b *Bridge) ReloadPeerCAs() error {
	b.mu.Lock()
	var errs []error
	for _, pc := range b.peers {
		if err := b.reloadCALocked(pc); err != nil {
			errs = append(errs, err)
			continue
		}
		pc.delay, pc.retryAt = redialMin, time.Time{}
	}
	b.mu.Unlock()
	b.kick()
	return errors.Join(errs...)
}

// knownResultless reports whether pc has shown it returns no results: it
// never sent an entity and its last learnNoResultsAfter plain documents
// ended with the result absent. Guarded by Bridge.mu.
func (pc *peerConn) knownResultless() bool {
	return !pc.sentEntity && pc.absentStreak >= learnNoResultsAfter
}

// notePeerEntity records that ss's peer sends entities (results): the
// full settle wait applies to it from now on.
func (b *Bridge) notePeerEntity(ss *sessState) {
	b.mu.Lock()
	ss.pc.sentEntity, ss.pc.absentStreak = true, 0
	b.mu.Unlock()
}

// statusLocked is pc's PeerStatus.
func (pc *peerConn) statusLocked() PeerStatus {
	p := PeerStatus{Addr: pc.addr, State: "connecting", Framing: framingName(pc.framing), LastError: pc.lastErr,
		FramingWorked: pc.worked, ShortSessions: pc.shortSessions}
	if !pc.errAt.IsZero() {
		p.Since = pc.errAt.UTC().Format(time.RFC3339)
	}
	switch ss := pc.active; {
	case ss != nil && !ss.closed:
		p.State, p.Framing, p.Profile = "connected", ss.s.Framing().String(), ss.mode.name() == modeProfile
		p.InFlight, p.Window = len(ss.docs), ss.n.MaxWindow
	case pc.lastErr != "":
		p.State = "down"
	case (pc.ok && pc.framing == quicpeer.FramingDraft04) || !pc.dialing:
		p.State = "idle" // nothing dials it: no work for a draft-04 peer
	}
	return p
}

// Peers returns the state of every peer, in the configured order.
func (b *Bridge) Peers() []PeerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]PeerStatus, 0, len(b.peers))
	for _, pc := range b.peers {
		p := pc.statusLocked()
		if n := b.reg.peerDocs(pc); p.State != "connected" && n > 0 {
			// A draft-04 peer's connections each carry one document and
			// are never its active session.
			p.State, p.InFlight = "connected", n
		}
		out = append(out, p)
	}
	return out
}

func framingName(f quicpeer.Framing) string { return f.String() }

// noteDialLocked records a dial's outcome. Under auto framing a refused
// handshake (the peer closed the connection during the capability
// exchange, as a draft-04 peer does on a CAPABILITIES member it does not
// know) switches the next dial to the other framing.
func (b *Bridge) noteDialLocked(pc *peerConn, f quicpeer.Framing, err error) {
	if err == nil {
		// The last error stays until the session proves itself
		// (proveSessionLocked): a peer that closes every session at once
		// keeps showing why.
		pc.ok = true
		return
	}
	pc.noteFailure(err.Error(), time.Now())
	if pc.mode != quicpeer.FramingAuto || !quicpeer.HandshakeRefused(err) {
		return
	}
	next := quicpeer.FramingDraft04
	if f == quicpeer.FramingDraft04 {
		next = quicpeer.FramingAuto
	}
	b.log.Info("bridge: the peer refused the handshake; trying the other framing", "addr", pc.addr, "next", framingName(next), "err", err)
	pc.framing = next
}

// noteFailure records a failed dial or a session that ended at once:
// why is the last error, and errAt stays where the failure streak began
// while the failures repeat the same error, so the documents' wait reason
// (waitReasonLocked: "... (since errAt)") does not change, and no wait
// reason event is written, on every redial of a peer that stays down.
// Caller holds the registry's mu.
func (pc *peerConn) noteFailure(why string, at time.Time) {
	if pc.ok || pc.lastErr != why || pc.errAt.IsZero() {
		pc.errAt = at
	}
	pc.ok, pc.lastErr = false, why
}

// learnSessionLocked takes what a new session shows: its mode
// (chooseModeLocked, mode.go).
func (b *Bridge) learnSessionLocked(ss *sessState) {
	ss.mode = b.chooseModeLocked(ss)
}

// anyPeerReadyLocked reports whether some peer takes work.
func (b *Bridge) anyPeerReadyLocked() bool {
	for _, pc := range b.peers {
		if pc.readyLocked() {
			return true
		}
	}
	return false
}

// waitReasonLocked says why queued documents wait, "" when nothing is
// known to hold them up (some peer takes work).
func (b *Bridge) waitReasonLocked() string {
	if b.anyPeerReadyLocked() {
		return ""
	}
	if len(b.peers) == 1 {
		return b.peers[0].waitReasonLocked()
	}
	why := make([]string, 0, len(b.peers))
	for _, pc := range b.peers {
		why = append(why, pc.waitReasonLocked())
	}
	return "no PipeStream peer takes work: " + strings.Join(why, "; ")
}

// metaWaitReasonLocked says why queued documents that need entity metadata
// (plan.needsMetadata) wait, "" when a peer that receives it takes work: a
// draft-04 peer never does (docs/profile.md 9.3).
func (b *Bridge) metaWaitReasonLocked() string {
	var why []string
	for _, pc := range b.peers {
		if pc.framing == quicpeer.FramingDraft04 {
			continue
		}
		if ss := pc.usableLocked(); ss != nil && ss.mode.carriesMetadata() {
			return ""
		}
		why = append(why, pc.waitReasonLocked())
	}
	if len(why) == 0 {
		return "no PipeStream peer receives entity metadata: every one speaks draft-04, whose entity headers carry none (docs/profile.md 9.3)"
	}
	return "waiting for a PipeStream peer that receives entity metadata (a draft-04 peer receives none): " + strings.Join(why, "; ")
}

// waitReasons are why queued documents wait ("" for none): any, all of
// them; meta, those that need entity metadata.
type waitReasons struct{ any, meta string }

// of is the reason d waits.
func (w waitReasons) of(d *docRun) string {
	if need := d.plan.needsMetadata(); need != "" && w.meta != "" {
		return "the document's " + need + " is sent as entity metadata; " + w.meta
	}
	return w.any
}

// waitReasonLocked says why pc takes no work.
func (pc *peerConn) waitReasonLocked() string {
	if pc.lastErr == "" && !pc.dialing {
		return fmt.Sprintf("waiting for a session to the PipeStream peer %s: idle (%s framing: dialled when a document is queued)", pc.addr, framingName(pc.framing))
	}
	if pc.lastErr == "" {
		return fmt.Sprintf("waiting for a session to the PipeStream peer %s: connecting, no answer yet", pc.addr)
	}
	return fmt.Sprintf("waiting for a session to the PipeStream peer %s (%s framing): %s (since %s)",
		pc.addr, framingName(pc.framing), pc.lastErr, pc.errAt.UTC().Format(time.RFC3339))
}

// peerAddrs names the peers in messages: "the PipeStream peer A" or "any
// of the PipeStream peers A, B".
func (b *Bridge) peerAddrs() string {
	if len(b.peers) == 1 {
		return "the PipeStream peer " + b.peers[0].addr
	}
	addrs := make([]string, 0, len(b.peers))
	for _, pc := range b.peers {
		addrs = append(addrs, pc.addr)
	}
	return "any of the PipeStream peers " + strings.Join(addrs, ", ")
}

// superviseLoop enforces the bounds on waiting (docs/profile.md 9.3):
// every superviseInterval it marks why queued documents wait, fails those
// that waited PeerWait for a peer, and ends entities that exceeded their
// completion policy's timeout-ms (timeouts.go).
func (b *Bridge) superviseLoop(ctx context.Context) {
	defer b.wg.Done()
	t := time.NewTicker(superviseInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.supervise(time.Now())
	}
}

// supervise runs one pass of superviseLoop: the wait reason and the queue
// are read under the registry's mu, then each document is supervised
// under its own lock (and the registry's).
func (b *Bridge) supervise(now time.Time) {
	b.mu.Lock()
	why, addrs := waitReasons{any: b.waitReasonLocked(), meta: b.metaWaitReasonLocked()}, b.peerAddrs()
	queued := slices.Clone(b.queue)
	docs := b.docList()
	b.mu.Unlock()
	eachDoc(b.reg, queued, nil, func(d *docRun) { d.superviseWaitLocked(now, why, addrs) })
	eachDoc(b.reg, docs, nil, func(d *docRun) { d.superviseTimeoutLocked(now) })
}

// docList is a snapshot of the documents of this process (caller holds the
// registry's mu).
func (r *registry) docList() []*docRun {
	docs := make([]*docRun, 0, len(r.docs))
	for _, d := range r.docs {
		docs = append(docs, d)
	}
	return docs
}

// superviseWaitLocked updates the wait reason of d, a queued document,
// and fails it when it waited longer than PeerWait for a session (w:
// the reasons documents wait now; addrs: the peers).
func (d *docRun) superviseWaitLocked(now time.Time, w waitReasons, addrs string) {
	if d.terminal() || !d.queued {
		return
	}
	why := w.of(d)
	if why != "" && now.Sub(d.queuedAt) < superviseInterval {
		return // a document just queued is not held up yet
	}
	if d.rec.Doc.WaitReason != why {
		// A #document event carries the reason into the event log.
		d.rec.Doc.WaitReason = why
		d.addEvent(&gatewayv1.Event{Kind: kindDocument, State: d.rec.Doc.State, Message: why})
		d.env.kickFlush()
	}
	if why != "" && now.Sub(d.waitSince) > d.env.opts.PeerWait {
		msg := fmt.Sprintf("no session to %s within %v (--peer-wait): %s", addrs, d.env.opts.PeerWait, why)
		d.failWaitingLocked(msg)
	}
}

// failWaitingLocked fails a queued document that never got a session.
func (d *docRun) failWaitingLocked(msg string) {
	d.rec.Doc.WaitReason = ""
	d.finishLocked(gatewayv1.State_FAILED, msg)
}
