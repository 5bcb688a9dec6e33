package bridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// sessState is the bridge's view of one quicpeer session. Its mutable
// fields are guarded by the registry's mu (Bridge.mu); pc, s, n, codec
// and mode are set before it is published and never change after, and
// ctl has its own mutex.
type sessState struct {
	pc     *peerConn // the peer it is a session to
	s      *quicpeer.Session
	n      quicpeer.Negotiated
	codec  wire.Codec
	ents   map[entKey]*entRef     // (scope, id) on this session -> document entity
	scopes map[uint32]*scopeOwner // peer-allocated scope -> owner
	dehyd  []parentRef            // entities the peer reported DEHYDRATING, awaiting their scope
	// lastDehyd: the latest DEHYDRATING per entity ID, which a BARRIER's
	// Parent Entity ID resolves against (profile 6).
	lastDehyd map[uint32]parentRef
	// waiters: redemptions waiting for the peer's first status of the
	// redeemed entity (session key).
	waiters  map[entKey]*redeemWaiter
	guessLog bool                 // the no-BARRIER fallback was logged on this session
	docs     map[*docRun]struct{} // documents whose current attempt runs here
	goaway   bool                 // GOAWAY received: assign nothing new here
	closed   bool
	closedAt time.Time // when closed was set
	closeErr string    // why the session ended ("" for a clean close)
	upAt     time.Time // when the handshake completed
	// mode: how its documents talk to the peer (mode.go), chosen when the
	// handshake completed (plain until then: nothing is placed on it).
	mode peerMode
	// proven: the session carried work (the peer reported on one of its
	// documents' entities) or lived shortSession; one that ends sooner
	// counts as a failed dial (noteSessionEndLocked).
	proven bool
	// ctl: stream-0 frames decided under a document's lock, written after it
	// (ctrlout.go). Its own mutex.
	ctl ctrlOut
}

// entRef maps a session entity to its document entity: the attempt it
// belongs to and its key there (the session key plus the scope instance).
type entRef struct {
	att *attempt
	key entKey
}

// sessEnt is one sessState.ents key made for an attempt (attempt.sessEnts).
type sessEnt struct {
	ss *sessState
	k  entKey
}

// bindEntRegLocked maps session entity sk on ss to ref and records the
// mapping in ref's attempt, so releaseSessLocked can drop it. Every write
// to sessState.ents goes through here. Callers hold the registry's mu and
// ref's document's lock.
func bindEntRegLocked(ss *sessState, sk entKey, ref *entRef) {
	ss.ents[sk] = ref
	ref.att.sessEnts = append(ref.att.sessEnts, sessEnt{ss: ss, k: sk})
}

// releaseSessLocked drops what sessions hold for attempt a: its result
// assembly, its entity mappings (a later status for them is ignored as for
// any unknown entity, which the race rule of profile 3 does anyway for a
// finished or moved attempt) and its DEHYDRATING parents still awaiting a
// scope (no new scope may be attributed to an attempt that ended). Called
// when the attempt ends: terminal state, abort, abandoned upload, and for
// the previous attempt when the next one starts. Without it a long-lived
// session kept every finished document's docRun reachable (entity IDs are
// not reused within a session). Scope owners (sessState.scopes) stay until
// their SCOPE_DIGEST or the reuse of the scope ID: a late status in such a
// scope must still resolve to the finished attempt (and be ignored), not
// be guessed onto another document. Callers hold a's document's lock.
func releaseSessLocked(a *attempt) {
	a.dropResultStreamLocked()
	a.d.env.regLock()
	releaseSessRegLocked(a)
	a.d.env.regUnlock()
}

// releaseSessRegLocked is the registry's part of releaseSessLocked
// (caller holds the registry's mu too).
func releaseSessRegLocked(a *attempt) {
	for _, e := range a.sessEnts {
		if r := e.ss.ents[e.k]; r != nil && r.att.d == a.d {
			delete(e.ss.ents, e.k)
		}
	}
	a.sessEnts = nil
	ss := a.ss
	if ss == nil {
		return
	}
	n := 0
	for _, p := range ss.dehyd {
		if p.att.d != a.d {
			ss.dehyd[n] = p
			n++
		}
	}
	clear(ss.dehyd[n:])
	ss.dehyd = ss.dehyd[:n]
	for id, p := range ss.lastDehyd {
		if p.att.d == a.d {
			delete(ss.lastDehyd, id)
		}
	}
}

// leaveSession takes d off ss's documents and reports whether ss has
// closed (nothing is to be sent on it). Caller holds d's lock.
func (d *docRun) leaveSession(ss *sessState) (closed bool) {
	d.env.regLock()
	defer d.env.regUnlock()
	delete(ss.docs, d)
	return ss.closed
}

// leftSession tells ss's mode that d left it for good (finished or
// dropped: a draft-04 conversation ends with its document), after what
// d had to send on ss was queued. Caller holds d's lock.
func (d *docRun) leftSession(ss *sessState) {
	d.env.regLock()
	defer d.env.regUnlock()
	ss.mode.docLeftRegLocked(d.env, ss)
}

// scopeOwner is the owner of a peer-allocated scope: the attempt and the
// entity (parent) the scope belongs to, and which use of the scope ID in
// that attempt it is.
type scopeOwner struct {
	att    *attempt
	parent entKey // document key of the entity the scope belongs to
	inst   uint32 // instance of the scope ID in the attempt
	depth  uint8
}

// parentRef is an entity the peer reported DEHYDRATING: the parent of a
// scope it will open.
type parentRef struct {
	att   *attempt
	key   entKey
	depth uint8
}

// tlsConfig builds the client TLS config toward ep: verify with ep.CAPEM,
// server name from ep.ServerName or the host of ep.Addr, optional client
// certificate (shared by every peer).
func tlsConfig(o *Options, ep PeerEndpoint) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ep.CAPEM) {
		return nil, invalidf("PeerCAPEM holds no PEM certificate; pass the peer's CA bundle or its pinned certificate")
	}
	name := ep.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(ep.Addr)
		if err != nil {
			return nil, invalidf("PeerAddr %q is not host:port: %v", ep.Addr, err)
		}
		name = host
	}
	c := &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS13, NextProtos: []string{quicpeer.ALPN}}
	if len(o.PeerClientCertPEM) > 0 || len(o.PeerClientKeyPEM) > 0 {
		cert, err := tls.X509KeyPair(o.PeerClientCertPEM, o.PeerClientKeyPEM)
		if err != nil {
			return nil, invalidf("PeerClientCertPEM/PeerClientKeyPEM: %v", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// offer is what the bridge advertises: every layer, the format preference.
func (b *Bridge) offer() wire.Capabilities {
	c := wire.Capabilities{Layer0Core: true, Layer1Recursive: true, Layer2Resilience: true}
	if b.opts.PreferProtobuf {
		f := wire.FormatProtobuf
		c.SerializationFormat = &f
	}
	return c
}

// connLoop keeps one active session to pc: dial with backoff and jitter
// (profile 8), and dial again when the active one ends or received GOAWAY.
// A session that ends right after it came up without carrying anything
// counts as a failed dial (noteSessionEndLocked): the next dial waits for
// the same backoff. Every peer has its own.
func (b *Bridge) connLoop(ctx context.Context, pc *peerConn) {
	defer b.wg.Done()
	again := false // the last dial failed on a CA file replaced under it
	for ctx.Err() == nil {
		if !again && !b.waitForWork(ctx, pc) {
			return
		}
		again = false
		if !b.waitBackoff(ctx, pc) {
			return
		}
		ss, err := b.dial(ctx, pc)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errShortSession) || errors.Is(err, errPeerBusy) {
				continue // judged by noteSessionEndLocked; or a busy draft-04 peer
			}
			if errors.Is(err, errStaleCA) {
				// Dial again at once, work or not: the answer came from the
				// restarted peer, which the new file verifies.
				b.log.Info("bridge: the peer's CA file changed during the dial; dialing again with it", "addr", pc.addr)
				again = true
				continue
			}
			b.mu.Lock()
			in := pc.backoffLocked()
			b.mu.Unlock()
			b.kick() // documents held for this peer go elsewhere
			b.log.Warn("bridge: dial peer failed; retrying", "addr", pc.addr, "in", in, "err", err)
			continue
		}
		pc.connects.Inc()
		b.log.Info("bridge: peer session up", "addr", pc.addr, "session", ss.s.ID(), "framing", ss.s.Framing().String(),
			"format", ss.n.Format, "layer1", ss.n.Layer1, "layer2", ss.n.Layer2)
		b.kick()
		// Wait until this session ends or is told to go away.
		b.mu.Lock()
		wake := pc.sessWake
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-ss.s.Done():
		case <-wake:
		}
	}
}

// errShortSession: the session ended before dial returned it;
// errPeerBusy: a draft-04 peer did not answer within dialTimeout while
// another session to it is live; errStaleCA: the peer's certificate
// failed verification against CA certificates its --peer-ca file no
// longer holds (caReplacedLocked).
var (
	errShortSession = errors.New("session closed right after the handshake")
	errPeerBusy     = errors.New("the draft-04 peer is busy with another connection")
	errStaleCA      = errors.New("the CA file changed during the dial")
)

// waitBackoff holds pc's next dial until the backoff after its last
// failure (a failed dial or a session that ended at once) has passed. It
// returns false when ctx ends.
func (b *Bridge) waitBackoff(ctx context.Context, pc *peerConn) bool {
	b.mu.Lock()
	d := time.Until(pc.retryAt)
	b.mu.Unlock()
	if d <= 0 {
		return true
	}
	return sleep(ctx, d)
}

// backoffLocked records a failure of pc's dial or session: the next dial
// waits the current delay with jitter, and the delay doubles up to
// redialMax. It returns the wait.
func (pc *peerConn) backoffLocked() time.Duration {
	if pc.delay < redialMin {
		pc.delay = redialMin
	}
	in := jitter(pc.delay)
	pc.retryAt = time.Now().Add(in)
	pc.delay = min(pc.delay*2, redialMax)
	return in
}

// noteSessionEndLocked judges a session that ended (under Bridge.mu,
// from onSessionClosedLocked). One that carried a document (the peer
// reported on one of its entities) or lived shortSession proved the peer
// and its framing: the backoff starts over and the framing is remembered.
// One that ended sooner without carrying anything is a failed dial: the
// last error names it, the next dial backs off, and under auto framing,
// when the peer closed it with an error (framingSuspect), the next dial
// tries the other framing (a draft-04 peer closes a session whose framing
// it cannot read, right after the handshake). It reports whether the
// session failed.
func (b *Bridge) noteSessionEndLocked(ss *sessState, err error) bool {
	pc := ss.pc
	if ss.upAt.IsZero() {
		return true // ended inside Dial: dial judges it once the session is known
	}
	if ss.proven || ss.closedAt.Sub(ss.upAt) >= shortSession {
		b.proveSessionLocked(ss)
		return false
	}
	why := "session closed right after the handshake"
	if err != nil {
		why = "session ended right after the handshake: " + err.Error()
	}
	pc.noteFailure(why, ss.closedAt)
	pc.shortSessions++
	in := pc.backoffLocked()
	b.log.Warn("bridge: peer session ended right after it came up; backing off", "addr", pc.addr,
		"framing", ss.s.Framing().String(), "lasted", ss.closedAt.Sub(ss.upAt), "in", in, "err", err)
	if pc.mode == quicpeer.FramingAuto && framingSuspect(ss, err) {
		next := quicpeer.FramingDraft04
		if ss.s.Framing() == wire.FramingDraft04 {
			next = quicpeer.FramingAuto
		}
		if pc.framing != next {
			b.log.Info("bridge: trying the other framing", "addr", pc.addr, "next", framingName(next))
			pc.framing = next
		}
	}
	return true
}

// framingSuspect reports whether a session that ended at once may have
// ended over its framing: the peer closed it with an error code (a
// draft-04 peer reading a draft-02 STATUS as a frame header closes with
// 0x06 or 0x0D). Not when the peer selected the profile: this project's
// peer answers in the client's framing. A clean close (a peer shutting
// down) keeps the framing.
func framingSuspect(ss *sessState, err error) bool {
	if ss.n.Profile {
		return false
	}
	var ce *quicpeer.CloseError
	return errors.As(err, &ce) && ce.Remote && ce.Code != wire.CodeNoError
}

// proveSessionLocked records that ss carried work (or lived long enough):
// the peer's backoff starts over, its last error is cleared, and the
// framing ss uses is the one that worked (auto keeps using it).
func (b *Bridge) proveSessionLocked(ss *sessState) {
	pc := ss.pc
	if !ss.proven {
		ss.proven = true
	}
	pc.delay, pc.retryAt = redialMin, time.Time{}
	pc.lastErr, pc.errAt = "", time.Time{}
	f := quicpeer.FramingDraft02
	if ss.s.Framing() == wire.FramingDraft04 {
		f = quicpeer.FramingDraft04
	}
	pc.worked = f.String()
	if pc.mode == quicpeer.FramingAuto {
		pc.framing = f
	}
}

// dial opens a session to pc and makes it pc's active one.
func (b *Bridge) dial(ctx context.Context, pc *peerConn) (*sessState, error) {
	ss := &sessState{pc: pc, ents: map[entKey]*entRef{}, scopes: map[uint32]*scopeOwner{}, docs: map[*docRun]struct{}{}, mode: plainMode{},
		lastDehyd: map[uint32]parentRef{}, waiters: map[entKey]*redeemWaiter{}}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	b.mu.Lock()
	framing := pc.framing
	if err := b.reloadCALocked(pc); err != nil {
		b.log.Warn("bridge: dialing with the previous certificates", "err", err)
	}
	tc, caUsed := pc.tls.Clone(), pc.caPEM
	b.mu.Unlock()
	if h := testHookDialing.Load(); h != nil {
		(*h)(pc.addr)
	}
	s, err := quicpeer.Dial(dctx, pc.addr, quicpeer.Config{
		TLS:     tc,
		Offer:   b.offer(),
		Handler: &handler{b: b, ss: ss},
		Logger:  b.log,
		Framing: framing,
		Profile: b.opts.PeerProfile != ProfileOff,
		// Transport liveness: a dead peer is noticed within this.
		IdleTimeout: b.opts.PeerIdleTimeout,
		// A peer that stops reading stream 0 ends its session after this
		// (0: quicpeer's default); tests lengthen it (export_test.go).
		Limits: quicpeer.Limits{ControlWriteTimeout: controlWriteTimeout.Load(), InlineResultBytes: inlineResultOffer},
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil && framing == quicpeer.FramingDraft04 && dctx.Err() != nil && ctx.Err() == nil && b.reg.liveSessions(pc) > 0 {
		// A draft-04 peer serving one connection at a time has not
		// answered this one while another conversation runs: busy, not
		// down.
		return nil, fmt.Errorf("%w: %v", errPeerBusy, err)
	}
	if err != nil && b.caReplacedLocked(pc, caUsed, err) {
		// Not the peer's failure: not recorded, no backoff.
		return nil, fmt.Errorf("%w: %w", errStaleCA, err)
	}
	b.noteDialLocked(pc, framing, err)
	if err != nil {
		return nil, err
	}
	ss.s = s
	ss.n = s.Negotiated()
	ss.codec = wire.CodecFor(ss.n.Format)
	b.learnSessionLocked(ss)
	ss.upAt = time.Now()
	if ss.closed { // ended during the handshake callback window
		b.noteSessionEndLocked(ss, s.Err())
		return nil, fmt.Errorf("%w: %v", errShortSession, s.Err())
	}
	pc.active = ss
	b.sessions[ss] = struct{}{}
	pc.sessWake = make(chan struct{})
	// A session still up after shortSession has proved the peer, work or
	// not: its last error clears and the backoff starts over.
	time.AfterFunc(shortSession, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !ss.closed && !ss.proven {
			b.proveSessionLocked(ss)
		}
	})
	return ss, nil
}

// waitForWork holds a draft-04 dial until a document it could take is
// queued (one that needs no entity metadata; or, for a
// peer not known to answer, documents run elsewhere: probeDraft04Locked),
// the previous session dialled to pc has been given its document, and fewer
// than Options.PeerDraft04Conns sessions to pc are live: the reference
// peer takes one entity per connection and serves connections one at a
// time, so the next connection's handshake waits while the previous
// conversation runs (and idle connections beyond the bound would only
// queue at it). Other framings dial at once. It returns false when ctx
// ends.
func (b *Bridge) waitForWork(ctx context.Context, pc *peerConn) bool {
	for {
		b.mu.Lock()
		ready := pc.framing != quicpeer.FramingDraft04 ||
			(pc.active == nil && b.reg.liveSessions(pc) < b.opts.PeerDraft04Conns &&
				(b.queuedWithoutMetadataLocked() || b.probeDraft04Locked(pc)))
		pc.dialing = ready // a peer nothing dials is idle, not connecting
		wait := redialMax
		if d := time.Until(pc.retryAt); pc.lastErr != "" && d > 0 && d < wait {
			wait = d // a down peer is probed when its backoff has passed
		}
		b.mu.Unlock()
		if ready {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-pc.connKick:
		case <-t.C:
		}
		t.Stop()
	}
}

// queuedWithoutMetadataLocked reports whether a queued document needs no
// entity metadata (a draft-04 peer could take it). A finished one (a
// cancelled document stays queued until the next placement) is no work.
func (b *Bridge) queuedWithoutMetadataLocked() bool {
	for _, d := range b.queue {
		if !d.finished.Load() && d.plan.needsMetadata() == "" {
			return true
		}
	}
	return false
}

// probeDraft04Locked reports whether a draft-04 peer not known to answer
// (never dialled, or its last dial or session failed, backoff passed)
// should be dialled while documents run on other peers, with none queued:
// a draft-02 peer takes every queued document at once, so without this
// the draft-04 peer would never be dialled again and never get its share
// (placement counts it once it answered, candidateRegLocked).
//
// A peer whose last dial or session failed is probed, backoff passed, work
// or not, until it answers: it shows "down" until then, and with no
// document to dial it for, a peer killed and restarted while its dial
// failed stayed "down" on /healthz for good (torture seed
// 1795970435618862729: a dial that met the restart timed out reading
// CAPABILITIES, and the round's last document went elsewhere).
func (b *Bridge) probeDraft04Locked(pc *peerConn) bool {
	if pc.ok || time.Now().Before(pc.retryAt) {
		return false
	}
	if pc.lastErr != "" {
		return true
	}
	for ss := range b.sessions {
		if ss.pc != pc && !ss.closed && len(ss.docs) > 0 {
			return true
		}
	}
	return false
}

// pickSessionRegLocked returns the session a new document goes to: that of
// the least-loaded healthy peer by its capacity (peerLoad: documents in
// flight relative to the negotiated window, or to Options.PeerDraft04Conns
// for a draft-04 peer, which takes one document per connection), ties
// broken round-robin so equal peers share the work. A draft-04 peer that
// answered before counts even while no connection to it is up: when it is
// the least loaded, the document waits for its next connection (its
// connection loop is woken) instead of going to a busier peer, so such a
// peer gets its share. nil when no peer has room (down, connecting,
// GOAWAY) or the pick is a draft-04 peer being dialled. newAttemptRegLocked starts
// the attempt there. For the dispatcher (dispatch), a peer running
// maxConcurrentDispatch sendings already is skipped; a pipelined upload
// is not counted there (its client sets its pace). meta: the document
// needs entity metadata (plan.needsMetadata), so only peers that receive
// it count (never a draft-04 one).
func (env *docEnv) pickSessionRegLocked(dispatch, meta bool) *sessState {
	var best *peerConn
	var bestSS *sessState
	var bestLoad peerLoad
	n := len(env.reg.peers)
	for i := range n {
		pc := env.reg.peers[(env.reg.nextPeer+i)%n]
		ss, load, ok := env.candidateRegLocked(pc, dispatch, meta)
		if ok && (best == nil || load.less(bestLoad)) {
			best, bestSS, bestLoad = pc, ss, load
		}
	}
	if best != nil && bestSS == nil {
		select { // its connection loop dials for the document
		case best.connKick <- struct{}{}:
		default:
		}
	}
	return bestSS
}

// peerLoad is a peer's documents in flight over its capacity.
type peerLoad struct{ docs, capacity uint64 }

// less compares docs/capacity without division.
func (x peerLoad) less(y peerLoad) bool {
	return x.docs*max(y.capacity, 1) < y.docs*max(x.capacity, 1)
}

// candidateRegLocked says whether pc can take a document now (ss, its load),
// or soon (ss nil: a draft-04 peer that answered before, with room for
// another connection, not backing off). With meta, a peer that would not
// receive the document's metadata is not a candidate.
func (env *docEnv) candidateRegLocked(pc *peerConn, dispatch, meta bool) (*sessState, peerLoad, bool) {
	if dispatch && pc.sending >= maxConcurrentDispatch {
		return nil, peerLoad{}, false // its sendings must finish first
	}
	if ss := pc.usableLocked(); ss != nil {
		if meta && !ss.mode.carriesMetadata() {
			return nil, peerLoad{}, false
		}
		return ss, peerLoad{docs: uint64(env.reg.peerDocs(pc)), capacity: ss.mode.capacity(env, ss)}, true
	}
	live := env.reg.liveSessions(pc)
	if meta || pc.framing != quicpeer.FramingDraft04 || !pc.ok || time.Now().Before(pc.retryAt) || live >= env.opts.PeerDraft04Conns {
		return nil, peerLoad{}, false
	}
	return nil, peerLoad{docs: uint64(env.reg.peerDocs(pc)), capacity: uint64(env.opts.PeerDraft04Conns)}, true
}

// retireRegLocked stops assigning on ss and wakes its peer's connection loop
// to dial.
func (env *docEnv) retireRegLocked(ss *sessState) {
	pc := ss.pc
	if pc.active == ss {
		pc.active = nil
		if pc.sessWake != nil {
			close(pc.sessWake)
			pc.sessWake = nil
		}
	}
}

func jitter(d time.Duration) time.Duration {
	// Full jitter in [d/2, d).
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sessionGone reports whether err means the session ended (as opposed to a
// problem of one stream): a CONNECTION_CLOSE error means it, even when the
// session's own close is still being processed (HandleClose re-dispatches,
// counting the attempt only if the session carried it).
func sessionGone(ss *sessState, err error) bool {
	select {
	case <-ss.s.Done():
		return true
	default:
	}
	var ce *quicpeer.CloseError
	return errors.Is(err, net.ErrClosed) || errors.As(err, &ce)
}

// endDraft04 ends a draft-04 session whose document finished: GOAWAY
// with the document's entity, the peer's echo, close with 0x00 (the
// reference conversation).
func (env *docEnv) endDraft04(ss *sessState) {
	env.wg.Add(1)
	go func() {
		defer env.wg.Done()
		ctx, cancel := context.WithTimeout(env.ctx, dialTimeout)
		defer cancel()
		if err := ss.s.GoAway(ctx); err != nil {
			env.log.Debug("bridge: draft-04 session ended", "err", err)
		}
	}()
}
