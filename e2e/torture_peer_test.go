package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// The torture test's partner pool: independent PipeStream peers written
// from the drafts' text on raw quic-go (the wire helpers of
// interop_wire_test.go, nothing of quicpeer), each with one behaviour
// drawn from tortureBehaviours. Their processing is a deterministic
// function of the payload (tortureProcess) so the checker can recompute
// every result. Faults (kill, restart, new certificate) act on the
// listener's UDP socket, so a killed peer sends nothing, not even a
// CONNECTION_CLOSE.

// tBehaviour is what a torture peer does with every session and entity.
type tBehaviour int

const (
	// bOwnIDs: a plain draft-02 peer that numbers its results itself: a
	// counter per connection from 1 (so its ids collide with the
	// gateway's), parent-id = the input; every chunk gets a result of its
	// own, R is never reported (the gateway rehydrates).
	bOwnIDs tBehaviour = iota
	// bSameID: a plain draft-02 peer that answers with the input's
	// entity-id (no parent-id) and rehydrates dehydrated parents itself
	// (draft-02 REHYDRATE: REHYDRATING(R), one result under R, COMPLETE(R)).
	bSameID
	// bOutOfOrder: as bOwnIDs, but every answer waits a random 0-400 ms,
	// so chunk results (and COMPLETE against its result) arrive out of order.
	bOutOfOrder
	// bStall: PROCESSING for every entity, then nothing.
	bStall
	// bCloseAtOnce: answers CAPABILITIES and closes the connection at once.
	bCloseAtOnce
	// bD04Heartbeat: the draft-04 reference server conversation (one
	// entity per connection, connections one at a time, no result).
	bD04Heartbeat
	// bD04NoHeartbeat: as bD04Heartbeat without the optional heartbeat
	// after CAPABILITIES.
	bD04NoHeartbeat
)

var behaviourNames = []string{"own-ids", "same-id", "out-of-order", "stall", "close-at-once", "d04-heartbeat", "d04-no-heartbeat"}

func (b tBehaviour) String() string { return behaviourNames[b] }

// answers reports whether the behaviour completes entities.
func (b tBehaviour) answers() bool { return b != bStall && b != bCloseAtOnce }

// draft04 reports whether the behaviour speaks draft-04 framing.
func (b tBehaviour) draft04() bool { return b == bD04Heartbeat || b == bD04NoHeartbeat }

// tortureProcess is every torture peer's processing of a payload under
// processor proc: passthrough returns it unchanged; any other processor
// upper-cases ASCII letters. Both act octet by octet, so a document's
// result is the same function of its content however it was chunked.
func tortureProcess(proc string, in []byte) []byte {
	out := make([]byte, len(in))
	for i, c := range in {
		if proc != "passthrough" && c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		out[i] = c
	}
	return out
}

// tReceived is one entity a torture peer read.
type tReceived struct {
	peer    int
	conn    int64
	id      uint32
	parent  *uint32
	chunk   *chunkInfo
	sum     [32]byte
	payload []byte // kept for chunks (the checker joins them)
	at      time.Time
}

// tLedger is what the whole pool saw, for the checker.
type tLedger struct {
	mu       sync.Mutex
	received []tReceived
	faults   []tFault
	errs     []string // the partners' own protocol complaints (informational)
}

type tFault struct {
	peer int
	what string
	at   time.Time
}

func (l *tLedger) add(r tReceived) {
	l.mu.Lock()
	l.received = append(l.received, r)
	l.mu.Unlock()
}

func (l *tLedger) fault(peer int, what string) {
	l.mu.Lock()
	l.faults = append(l.faults, tFault{peer: peer, what: what, at: time.Now()})
	l.mu.Unlock()
}

func (l *tLedger) complain(format string, a ...any) {
	l.mu.Lock()
	if len(l.errs) < 200 {
		l.errs = append(l.errs, fmt.Sprintf(format, a...))
	}
	l.mu.Unlock()
}

// tPeer is one partner of the pool.
type tPeer struct {
	idx     int
	beh     tBehaviour
	addr    string // fixed across restarts
	caPath  string // the gateway's --peer-ca; rewritten by a new certificate
	certDir string
	ledger  *tLedger
	t       testing.TB
	faultMu sync.Mutex // faults on one peer run one after another

	mu      sync.Mutex
	rng     *rand.Rand
	cert    tls.Certificate
	udp     *net.UDPConn
	tr      *quic.Transport
	ln      *quic.Listener
	conns   map[*quic.Conn]struct{}
	nconn   int64
	connAt  []time.Time // when each connection was accepted
	claims  map[uint64]*tClaim
	paused  time.Time // answers wait until then (the pause fault)
	stopped bool
}

// startTPeer starts peer idx with behaviour beh on a free loopback port.
func startTPeer(t testing.TB, idx int, beh tBehaviour, seed uint64, ledger *tLedger) *tPeer {
	t.Helper()
	dir := t.TempDir()
	cert, caPath := partnerCert(t, dir)
	p := &tPeer{idx: idx, beh: beh, caPath: caPath, certDir: dir, ledger: ledger, t: t, cert: cert,
		rng: rand.New(rand.NewPCG(seed, uint64(idx))), conns: map[*quic.Conn]struct{}{}, claims: map[uint64]*tClaim{}}
	if err := p.listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	return p
}

func (p *tPeer) listen(addr string) error {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	var udp *net.UDPConn
	for range 100 { // the port of a killed peer is free at once, but be patient
		if udp, err = net.ListenUDP("udp", ua); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("torture peer %d: listen %s: %w", p.idx, addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	cfg := partnerQUICConfig()
	if p.beh.draft04() {
		cfg = quinnLikeConfig()
		cfg.MaxIncomingStreams, cfg.MaxIncomingUniStreams = 1, 128
	}
	p.mu.Lock()
	tc := &tls.Config{Certificates: []tls.Certificate{p.cert}, NextProtos: []string{alpnPipeStream}, MinVersion: tls.VersionTLS13}
	p.mu.Unlock()
	ln, err := tr.Listen(tc, cfg)
	if err != nil {
		udp.Close()
		return err
	}
	p.mu.Lock()
	p.udp, p.tr, p.ln, p.addr = udp, tr, ln, udp.LocalAddr().String()
	p.mu.Unlock()
	go p.serve(ln)
	return nil
}

// kill drops the peer like a crash: the socket closes first, so no
// CONNECTION_CLOSE leaves; the gateway learns from QUIC's idle timeout or
// the restarted peer's stateless reset.
func (p *tPeer) kill() {
	p.mu.Lock()
	udp, tr := p.udp, p.tr
	p.udp, p.tr, p.ln = nil, nil, nil
	p.conns = map[*quic.Conn]struct{}{}
	p.mu.Unlock()
	if udp != nil {
		udp.Close()
		tr.Close()
	}
}

// restart listens again on the same address, with a new certificate
// written over --peer-ca when newCert.
func (p *tPeer) restart(newCert bool) error {
	if newCert {
		cert, _, err := partnerCertE(p.certDir) // on the torture's fault goroutine
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.cert = cert
		p.mu.Unlock()
	}
	return p.listen(p.addr)
}

// closeAll ends every connection gracefully (0x00), like a peer that
// restarts cleanly.
func (p *tPeer) closeAll() {
	p.mu.Lock()
	var cs []*quic.Conn
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		_ = c.CloseWithError(errNoError, "torture: graceful restart")
	}
}

func (p *tPeer) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.kill()
}

func (p *tPeer) randIntN(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.IntN(n)
}

func (p *tPeer) serve(ln *quic.Listener) {
	for {
		conn, err := ln.Accept(context.Background())
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[conn] = struct{}{}
		p.nconn++
		p.connAt = append(p.connAt, time.Now())
		n := p.nconn
		p.mu.Unlock()
		if p.beh.draft04() {
			p.serveD04(conn, n) // one connection at a time, like the reference
			continue
		}
		go p.serveD02(conn, n)
	}
}

// ---- draft-02 ----

// tConn is one draft-02 connection of a torture peer.
type tConn struct {
	p    *tPeer
	conn *quic.Conn
	n    int64
	ctl  *quic.Stream
	wmu  sync.Mutex

	mu    sync.Mutex
	next  uint32                       // bOwnIDs' counter
	kids  map[uint32]map[uint64][]byte // bSameID: parent -> chunk index -> output
	total map[uint32]uint64            // bSameID: parent -> N
	done  map[uint32]bool              // bSameID: parents rehydrated
}

func (c *tConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.ctl.Write(b)
	return err
}

func (c *tConn) status(id uint32, st uint8) error {
	return c.write(encodeStatus(framingD02, id, st, nil))
}

func (p *tPeer) serveD02(conn *quic.Conn, n int64) {
	c := &tConn{p: p, conn: conn, n: n, next: 1, kids: map[uint32]map[uint64][]byte{}, total: map[uint32]uint64{}, done: map[uint32]bool{}}
	ctx, cancel := context.WithTimeout(conn.Context(), 10*time.Second)
	ctl, err := conn.AcceptStream(ctx)
	cancel()
	if err != nil {
		return
	}
	c.ctl = ctl
	_ = ctl.SetReadDeadline(time.Now().Add(10 * time.Second))
	fr, err := readFrameD02(ctl)
	_ = ctl.SetReadDeadline(time.Time{})
	if err != nil || fr.typ != ftCaps {
		closeFor(conn, perr(errInternal, "first frame: %v", err))
		return
	}
	if _, _, err := decodeCapsLenient(fr.f); err != nil {
		closeFor(conn, err)
		return
	}
	caps := plainCapsD02()
	caps.Layer1, caps.Layer2 = ptr(true), ptr(true) // Layer 2: claim checks (Layer 1 is its prerequisite)
	if err := c.write(varFrame(ftCaps, mustCBOR(caps))); err != nil {
		return
	}
	if p.beh == bCloseAtOnce {
		// A heartbeat lets an auto-framing client settle at once; the
		// session is up once the client's first frame after
		// CAPABILITIES (its heartbeat) arrives: then it ends.
		_ = c.write(encodeStatus(framingD02, connLevel, stUnspecified, nil))
		_ = ctl.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = readFrameD02(ctl)
		_ = conn.CloseWithError(errNoError, "torture: this peer closes every session at once")
		return
	}
	go c.readControl()
	for {
		s, err := conn.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go c.entity(s)
	}
}

// readControl reads stream 0: a GOAWAY is echoed and the connection ends
// once the gateway closes it; statuses need nothing (a plain peer).
func (c *tConn) readControl() {
	for {
		fr, err := readFrameD02(c.ctl)
		if err != nil {
			return
		}
		if fr.typ == ftGoaway {
			if last, err := decodeGoaway(fr.f); err == nil {
				_ = c.write(encodeGoaway(framingD02, last))
			}
		}
	}
}

func (c *tConn) entity(s *quic.ReceiveStream) {
	p := c.p
	b, err := readEntityStream(s)
	if err != nil {
		return // a reset (cancel) or a lost connection
	}
	e, err := decodeEntityLenient(b)
	if err != nil {
		p.ledger.complain("peer %d: entity stream %d: %v", p.idx, s.StreamID(), err)
		if e.hdr.EntityID != 0 {
			_ = c.status(e.hdr.EntityID, stFailed)
		}
		return
	}
	r := tReceived{peer: p.idx, conn: c.n, id: e.hdr.EntityID, parent: e.hdr.ParentID, chunk: e.hdr.ChunkInfo,
		sum: sha256.Sum256(e.payload), at: time.Now()}
	if e.hdr.ChunkInfo != nil {
		r.payload = e.payload
	}
	p.ledger.add(r)
	if err := c.answer(e); err != nil && c.conn.Context().Err() == nil {
		p.ledger.complain("peer %d: answering entity %d: %v", p.idx, e.hdr.EntityID, err)
	}
}

// answer processes one entity as the peer's behaviour says.
func (c *tConn) answer(e gotEntity) error {
	p, id := c.p, e.hdr.EntityID
	if claim, ok := e.hdr.Metadata["pipestream.claim-id"]; ok && p.beh.answers() {
		if !p.redeem(claim, id) {
			return c.status(id, stFailed) // unknown, redeemed before, or expired
		}
	} else if e.hdr.Metadata[tortureDeferKey] == "1" && p.beh.answers() && e.hdr.ChunkInfo == nil {
		if err := c.status(id, stProcessing); err != nil {
			return err
		}
		return c.deferEntity(id)
	}
	if err := c.status(id, stProcessing); err != nil || p.beh == bStall {
		return err
	}
	p.waitPause()
	if p.beh == bOutOfOrder {
		time.Sleep(time.Duration(p.randIntN(400)) * time.Millisecond)
	}
	out := tortureProcess(e.hdr.Metadata["pipestream.processor"], e.payload)
	chunk := e.hdr.ParentID != nil && e.hdr.ChunkInfo != nil
	if p.beh == bSameID {
		if chunk {
			return c.sameIDChunk(e, out)
		}
		return c.resultThenComplete(entityHeader{EntityID: id, ContentType: e.hdr.ContentType}, out, id)
	}
	c.mu.Lock()
	own := c.next
	c.next++
	c.mu.Unlock()
	h := entityHeader{EntityID: own, ParentID: ptr(id), ContentType: e.hdr.ContentType}
	if p.randIntN(2) == 0 {
		if err := c.status(id, stComplete); err != nil {
			return err
		}
		return c.send(h, out)
	}
	return c.resultThenComplete(h, out, id)
}

// resultThenComplete opens the result stream, then reports COMPLETE (the
// order of profile 9.1; they still travel on different streams).
func (c *tConn) resultThenComplete(h entityHeader, out []byte, id uint32) error {
	if err := c.send(h, out); err != nil {
		return err
	}
	return c.status(id, stComplete)
}

func (c *tConn) send(h entityHeader, payload []byte) error {
	s, err := c.conn.OpenUniStreamSync(c.conn.Context())
	if err != nil {
		return err
	}
	if _, err := s.Write(plainEntity(h, payload)); err != nil {
		return err
	}
	return s.Close()
}

// sameIDChunk completes a chunk and, once every chunk of its parent is in
// (N from a non-zero total-chunks), rehydrates the parent: REHYDRATING(R),
// one result under R (the outputs in chunk-index order), COMPLETE(R).
func (c *tConn) sameIDChunk(e gotEntity, out []byte) error {
	r, ci := *e.hdr.ParentID, e.hdr.ChunkInfo
	if err := c.status(e.hdr.EntityID, stComplete); err != nil {
		return err
	}
	c.mu.Lock()
	if c.kids[r] == nil {
		c.kids[r] = map[uint64][]byte{}
	}
	c.kids[r][ci.Index] = out
	if ci.Total != 0 {
		c.total[r] = ci.Total
	}
	n := c.total[r]
	ready := n > 0 && uint64(len(c.kids[r])) == n && !c.done[r]
	var joined []byte
	if ready {
		c.done[r] = true
		for i := range n {
			joined = append(joined, c.kids[r][i]...)
		}
		delete(c.kids, r)
	}
	c.mu.Unlock()
	if !ready {
		return nil
	}
	if err := c.status(r, stRehydrating); err != nil {
		return err
	}
	return c.resultThenComplete(entityHeader{EntityID: r, ContentType: e.hdr.ContentType}, joined, r)
}

// ---- draft-04 ----

// serveD04 runs the reference server conversation on conn (one entity),
// with or without the heartbeat after CAPABILITIES.
func (p *tPeer) serveD04(conn *quic.Conn, n int64) {
	ctx, cancel := context.WithTimeout(conn.Context(), 30*time.Second)
	defer cancel()
	sc := &d04ServerConn{conn: conn, noHeartbeat: p.beh != bD04Heartbeat}
	err := sc.capabilities(ctx)
	if err == nil {
		err = sc.entity(ctx)
	}
	if err == nil {
		e := sc.sess.entity
		p.ledger.add(tReceived{peer: p.idx, conn: n, id: e.hdr.EntityID, parent: e.hdr.ParentID, sum: sha256.Sum256(e.payload), at: time.Now()})
		err = sc.finish()
	}
	if err != nil {
		closeFor(conn, err)
		return
	}
	select { // the reference waits up to 5 s for the client to close
	case <-conn.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

// connsSince counts the connections accepted at or after from.
func (p *tPeer) connsSince(from time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.connAt {
		if !at.Before(from) {
			n++
		}
	}
	return n
}

// ---- claim checks (Layer 2) ----

// tortureDeferKey is the request metadata that asks a torture peer to
// defer a whole document: DEFERRED with a claim check (draft-02 Section
// 6.5.2), ABANDONED when it expires unredeemed. A redemption is an entity
// whose metadata carries pipestream.claim-id (docs/profile.md 6 and 9.1:
// the raw content again); the peer then processes that payload.
const tortureDeferKey = "torture-defer"

// tortureClaimTTL is how long a torture peer's claim checks live.
const tortureClaimTTL = 8 * time.Second

type tClaim struct {
	entity   uint32
	expiry   time.Time
	redeemed bool
}

// deferEntity issues a claim check for entity id and abandons the entity
// when the claim expires unredeemed.
func (c *tConn) deferEntity(id uint32) error {
	p := c.p
	p.mu.Lock()
	claim := p.rng.Uint64()
	cl := &tClaim{entity: id, expiry: time.Now().Add(tortureClaimTTL)}
	p.claims[claim] = cl
	p.mu.Unlock()
	full := make([]byte, 16, 36)
	full[0] = ftStatus
	full[1] = 1<<4 | stDeferred
	full[2] = 0x80 // E: the claim check extension follows
	binary.BigEndian.PutUint32(full[4:], id)
	full = binary.BigEndian.AppendUint32(full, 16)
	full = binary.BigEndian.AppendUint64(full, claim)
	full = binary.BigEndian.AppendUint64(full, uint64(cl.expiry.UnixMicro()))
	if err := c.write(full); err != nil {
		return err
	}
	time.AfterFunc(tortureClaimTTL, func() {
		p.mu.Lock()
		expired := !cl.redeemed
		cl.redeemed = true // an expired claim is never redeemed
		p.mu.Unlock()
		if expired {
			_ = c.status(id, stAbandoned)
		}
	})
	return nil
}

// redeem takes claim (decimal) for entity id once, before its expiry.
func (p *tPeer) redeem(claim string, id uint32) bool {
	n, err := strconv.ParseUint(claim, 10, 64)
	if err != nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cl := p.claims[n]
	if cl == nil || cl.redeemed || time.Now().After(cl.expiry) {
		return false
	}
	cl.redeemed = true
	return true
}

// pause holds every answer of the peer (after PROCESSING) for d: a peer
// that stalls for a while and then goes on, its late results included.
func (p *tPeer) pause(d time.Duration) {
	p.mu.Lock()
	p.paused = time.Now().Add(d)
	p.mu.Unlock()
}

func (p *tPeer) waitPause() {
	p.mu.Lock()
	until := p.paused
	p.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
}
