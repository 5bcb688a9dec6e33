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

// sessState is the bridge's view of one quicpeer session. Guarded by
// Bridge.mu.
type sessState struct {
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
	waiters  map[entKey]chan wire.Status
	guessLog bool                 // the no-BARRIER fallback was logged on this session
	docs     map[*docRun]struct{} // documents whose current attempt runs here
	goaway   bool                 // GOAWAY received: assign nothing new here
	closed   bool
	// profile: documents on this session use the profile (else plain
	// entities, docs/profile.md 9); draft04: the session uses draft-04
	// framing and carries one document (the reference conversation).
	profile, draft04 bool
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

// bindEntLocked maps session entity sk on ss to ref and records the
// mapping in ref's attempt, so releaseSessLocked can drop it. Every write
// to sessState.ents goes through here. Callers hold Bridge.mu.
func bindEntLocked(ss *sessState, sk entKey, ref *entRef) {
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
// be guessed onto another document. Callers hold Bridge.mu.
func releaseSessLocked(a *attempt) {
	a.dropResultStreamLocked()
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

// tlsConfig builds the client TLS config: verify with PeerCAPEM, server name
// from PeerServerName or the host of PeerAddr, optional client certificate.
func tlsConfig(o *Options) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(o.PeerCAPEM) {
		return nil, invalidf("PeerCAPEM holds no PEM certificate; pass the peer's CA bundle or its pinned certificate")
	}
	name := o.PeerServerName
	if name == "" {
		host, _, err := net.SplitHostPort(o.PeerAddr)
		if err != nil {
			return nil, invalidf("PeerAddr %q is not host:port: %v", o.PeerAddr, err)
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

// connLoop keeps one active session: dial with backoff and jitter (profile
// 8), and dial again when the active one ends or received GOAWAY.
func (b *Bridge) connLoop(ctx context.Context) {
	defer b.wg.Done()
	delay := redialMin
	for ctx.Err() == nil {
		if !b.waitForWork(ctx) {
			return
		}
		ss, err := b.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			b.log.Warn("bridge: dial peer failed; retrying", "addr", b.opts.PeerAddr, "in", delay, "err", err)
			if !sleep(ctx, jitter(delay)) {
				return
			}
			delay = min(delay*2, redialMax)
			continue
		}
		delay = redialMin
		b.m.reconnects.Inc()
		b.log.Info("bridge: peer session up", "addr", b.opts.PeerAddr, "session", ss.s.ID(),
			"format", ss.n.Format, "layer1", ss.n.Layer1, "layer2", ss.n.Layer2)
		b.kick()
		// Wait until this session ends or is told to go away.
		b.mu.Lock()
		wake := b.sessWake
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-ss.s.Done():
		case <-wake:
		}
	}
}

// dial opens a session and makes it the active one.
func (b *Bridge) dial(ctx context.Context) (*sessState, error) {
	ss := &sessState{ents: map[entKey]*entRef{}, scopes: map[uint32]*scopeOwner{}, docs: map[*docRun]struct{}{},
		lastDehyd: map[uint32]parentRef{}, waiters: map[entKey]chan wire.Status{}}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	framing := b.dialFraming()
	s, err := quicpeer.Dial(dctx, b.opts.PeerAddr, quicpeer.Config{
		TLS:     b.tls.Clone(),
		Offer:   b.offer(),
		Handler: &handler{b: b, ss: ss},
		Logger:  b.log,
		Framing: framing,
		Profile: b.opts.PeerProfile != ProfileOff,
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.noteDialLocked(framing, err)
	if err != nil {
		return nil, err
	}
	ss.s = s
	ss.n = s.Negotiated()
	ss.codec = wire.CodecFor(ss.n.Format)
	b.learnSessionLocked(ss)
	if ss.closed { // ended during the handshake callback window
		return nil, fmt.Errorf("session closed right after the handshake: %v", s.Err())
	}
	b.active = ss
	b.sessions[ss] = struct{}{}
	b.sessWake = make(chan struct{})
	return ss, nil
}

// waitForWork holds a draft-04 dial until a document is queued and the
// previous draft-04 session has ended: the reference peer serves one
// connection at a time and one entity per connection, so an idle
// connection would block it. Other framings dial at once. It returns
// false when ctx ends.
func (b *Bridge) waitForWork(ctx context.Context) bool {
	for {
		b.mu.Lock()
		ready := b.peer.framing != quicpeer.FramingDraft04 || (len(b.queue) > 0 && b.liveSessionsLocked() == 0)
		b.mu.Unlock()
		if ready {
			return true
		}
		t := time.NewTimer(redialMax)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-b.connKick:
		case <-t.C:
		}
		t.Stop()
	}
}

func (b *Bridge) liveSessionsLocked() int {
	n := 0
	for ss := range b.sessions {
		if !ss.closed {
			n++
		}
	}
	return n
}

// activeSessionLocked returns the session new work goes to (nil if none).
func (b *Bridge) activeSessionLocked() *sessState {
	if b.active == nil || b.active.goaway || b.active.closed {
		return nil
	}
	return b.active
}

// retireLocked stops assigning on ss and wakes the connection loop to dial.
func (b *Bridge) retireLocked(ss *sessState) {
	if b.active == ss {
		b.active = nil
		if b.sessWake != nil {
			close(b.sessWake)
			b.sessWake = nil
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
// problem of one stream).
func sessionGone(ss *sessState, err error) bool {
	select {
	case <-ss.s.Done():
		return true
	default:
	}
	return errors.Is(err, net.ErrClosed)
}

// endDraft04Locked ends a draft-04 session whose document finished: GOAWAY
// with the document's entity, the peer's echo, close with 0x00 (the
// reference conversation).
func (b *Bridge) endDraft04Locked(ss *sessState) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, dialTimeout)
		defer cancel()
		if err := ss.s.GoAway(ctx); err != nil {
			b.log.Debug("bridge: draft-04 session ended", "err", err)
		}
	}()
}
