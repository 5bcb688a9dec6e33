package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// Plain draft-02 partners written from draft-krickert-pipestream-02 alone
// (raw quic-go, hand-built frames from interop_wire_test.go): they know
// nothing of this project's profile (no PipeDoc envelope, no pipestream.*
// metadata of their own, no result parts).
//
//   - d02Client: opens stream 0, exchanges CAPABILITIES, sends plain Layer 0
//     entities (raw payload, SHA-256) and DEHYDRATING parents with chunk
//     children, reads STATUS frames and the entities the server sends back.
//   - d02Peer: a processing peer that answers PROCESSING then COMPLETE for
//     every entity it reads and AFTER COMPLETE returns the upper-cased
//     payload as a new entity of its own id whose parent-id is the input's
//     id; variants return nothing, stall after PROCESSING, or refuse the
//     connection after CAPABILITIES.

// maxPartnerEntity bounds what a partner reads from one entity stream.
const maxPartnerEntity = 80 << 20

// readEntityStream reads one whole entity stream (header + payload to FIN).
func readEntityStream(s *quic.ReceiveStream) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(s, maxPartnerEntity+1))
	if err == nil && len(b) > maxPartnerEntity {
		err = perr(errLimitExceeded, "entity stream over %d octets", maxPartnerEntity)
	}
	return b, err
}

// ---- client ----

type d02Client struct {
	conn *quic.Conn
	ctl  *quic.Stream
	wmu  sync.Mutex // stream-0 writes

	mu         sync.Mutex
	n          *notifier
	serverCaps capsMsg
	serverKeys []string
	statuses   map[uint32][]uint8
	results    map[uint32][]gotEntity // by entity-id
	byParent   map[uint32][]gotEntity // by parent-id
	errs       []error                // protocol errors seen (bad frames, bad result entities)
	readErr    error                  // stream 0 ended
	next       uint32
	cursor     uint32
	resolved   map[uint32]bool
	gate       chan struct{} // closed: accept the server's entity streams
	gateOnce   sync.Once
}

// dialD02Client connects to addr and exchanges CAPABILITIES (plain Layer 0).
func dialD02Client(ctx context.Context, addr, caPEM string) (*d02Client, error) {
	return dialD02ClientOpts(ctx, addr, caPEM, false)
}

// dialD02ClientOpts with lazy: the client accepts the server's entity
// streams only after startAccepting (e.g. once it saw COMPLETE), with
// quinn's receive windows (an unread stream stops at 1.25 MB, the
// connection is not limited).
func dialD02ClientOpts(ctx context.Context, addr, caPEM string, lazy bool) (*d02Client, error) {
	cfg := partnerQUICConfig()
	if lazy {
		cfg = quinnLikeConfig()
	}
	conn, err := dialPartnerConfig(ctx, addr, caPEM, cfg)
	if err != nil {
		return nil, err
	}
	c := &d02Client{conn: conn, n: newNotifier(), statuses: map[uint32][]uint8{}, results: map[uint32][]gotEntity{},
		byParent: map[uint32][]gotEntity{}, next: 1, cursor: 1, resolved: map[uint32]bool{}, gate: make(chan struct{})}
	if err := c.handshake(ctx); err != nil {
		closeFor(conn, err)
		return nil, err
	}
	if !lazy {
		c.startAccepting()
	}
	go c.readLoop()
	go c.acceptLoop()
	return c, nil
}

// startAccepting lets acceptLoop take the server's entity streams.
func (c *d02Client) startAccepting() { c.gateOnce.Do(func() { close(c.gate) }) }

func (c *d02Client) handshake(ctx context.Context) error {
	ctl, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	if ctl.StreamID() != 0 {
		return fmt.Errorf("control stream is %d, not 0", ctl.StreamID())
	}
	c.ctl = ctl
	if err := c.write(varFrame(ftCaps, mustCBOR(plainCapsD02()))); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	}
	fr, err := readFrameD02(ctl)
	_ = ctl.SetReadDeadline(time.Time{}) // the read loop waits as long as the connection lives
	if err != nil {
		return fmt.Errorf("reading the server's CAPABILITIES: %w", err)
	}
	if fr.typ != ftCaps {
		return perr(errInternal, "first server frame is 0x%02X, not CAPABILITIES", fr.typ)
	}
	c.serverCaps, c.serverKeys, err = decodeCapsLenient(fr.f)
	return err
}

func (c *d02Client) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.ctl.Write(b)
	return err
}

func (c *d02Client) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.n.wake()
	c.mu.Unlock()
}

func (c *d02Client) readLoop() {
	for {
		fr, err := readFrameD02(c.ctl)
		if err != nil {
			c.mu.Lock()
			c.readErr = fmt.Errorf("stream 0: %w", err)
			c.n.wake()
			c.mu.Unlock()
			return
		}
		if fr.typ != ftStatus {
			continue // GOAWAY, CHECKPOINT, digests: nothing to do for a plain client
		}
		s, err := decodeStatusLenient(fr.f)
		if err != nil {
			c.fail(err)
			continue
		}
		if s.entity == connLevel {
			continue // heartbeat or the server's cursor
		}
		c.mu.Lock()
		c.statuses[s.entity] = append(c.statuses[s.entity], s.stat)
		c.n.wake()
		c.mu.Unlock()
	}
}

func (c *d02Client) acceptLoop() {
	<-c.gate
	for {
		s, err := c.conn.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go c.readResult(s)
	}
}

func (c *d02Client) readResult(s *quic.ReceiveStream) {
	b, err := readEntityStream(s)
	if err != nil {
		c.fail(fmt.Errorf("server entity stream %d: %w", s.StreamID(), err))
		return
	}
	e, err := decodeEntityLenient(b)
	e.stream = int64(s.StreamID())
	if err != nil {
		c.fail(fmt.Errorf("server entity stream %d: %w", s.StreamID(), err))
		return
	}
	c.mu.Lock()
	c.results[e.hdr.EntityID] = append(c.results[e.hdr.EntityID], e)
	if e.hdr.ParentID != nil {
		c.byParent[*e.hdr.ParentID] = append(c.byParent[*e.hdr.ParentID], e)
	}
	c.n.wake()
	c.mu.Unlock()
}

// newID assigns the next root-scope entity id.
func (c *d02Client) newID() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.next
	c.next++
	return id
}

func (c *d02Client) sendEntity(ctx context.Context, h entityHeader, payload []byte) error {
	s, err := c.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := s.Write(plainEntity(h, payload)); err != nil {
		return err
	}
	return s.Close()
}

func (c *d02Client) sendStatus(entity uint32, stat uint8) error {
	return c.write(encodeStatus(framingD02, entity, stat, nil))
}

// wait blocks until cond (called with c.mu held) holds, stream 0 ends, or
// ctx ends.
func (c *d02Client) wait(ctx context.Context, what string, cond func() bool) error {
	for {
		c.mu.Lock()
		if cond() {
			c.mu.Unlock()
			return nil
		}
		if c.readErr != nil {
			err := c.readErr
			c.mu.Unlock()
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		ch := c.n.ch
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (statuses so far: %s)", what, ctx.Err(), c.statusSummary())
		}
	}
}

func (c *d02Client) statusSummary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b bytes.Buffer
	for id, ss := range c.statuses {
		if b.Len() > 400 {
			b.WriteString(" ...")
			break
		}
		fmt.Fprintf(&b, " %d:%v", id, namesOf(ss))
	}
	return b.String()
}

func namesOf(ss []uint8) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = statusName(s)
	}
	return out
}

// terminalLocked reports whether id has a terminal status (c.mu held).
func (c *d02Client) terminalLocked(id uint32) bool {
	for _, s := range c.statuses[id] {
		if s == stComplete || s == stFailed || s == stAbandoned || s == stSkipped {
			return true
		}
	}
	return false
}

func (c *d02Client) statusesOf(id uint32) []uint8 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint8(nil), c.statuses[id]...)
}

func (c *d02Client) resultsOf(id uint32) []gotEntity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]gotEntity(nil), c.results[id]...)
}

func (c *d02Client) protocolErrors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// resolve marks ids resolved and sends a connection-level cursor update
// when the cursor moves (draft-02 Sections 6.2.3 and 9.1).
func (c *d02Client) resolve(ids ...uint32) error {
	c.mu.Lock()
	for _, id := range ids {
		c.resolved[id] = true
	}
	old := c.cursor
	for c.resolved[c.cursor] {
		delete(c.resolved, c.cursor)
		c.cursor++
	}
	cur := c.cursor
	c.mu.Unlock()
	if cur == old {
		return nil
	}
	return c.write(encodeStatus(framingD02, connLevel, stUnspecified, &cur))
}

// roundTrip sends payload as one plain root entity and waits for its
// terminal status and (unless FAILED) the entity the server returns for it.
func (c *d02Client) roundTrip(ctx context.Context, payload []byte, contentType string, meta map[string]string) (uint32, gotEntity, error) {
	id := c.newID()
	if err := c.sendEntity(ctx, entityHeader{EntityID: id, ContentType: contentType, Metadata: meta}, payload); err != nil {
		return id, gotEntity{}, err
	}
	res, err := c.awaitResult(ctx, id)
	if rerr := c.resolve(id); err == nil {
		err = rerr
	}
	return id, res, err
}

// awaitResult waits for id's terminal status and the entity returned for
// it: one with entity-id id (the gateway peer's form) or parent-id id.
func (c *d02Client) awaitResult(ctx context.Context, id uint32) (gotEntity, error) {
	err := c.wait(ctx, fmt.Sprintf("entity %d terminal with a result", id), func() bool {
		has := len(c.results[id]) > 0 || len(c.byParent[id]) > 0
		return c.terminalLocked(id) && (has || !containsStat(c.statuses[id], stComplete))
	})
	if err != nil {
		return gotEntity{}, err
	}
	ss := c.statusesOf(id)
	if !containsStat(ss, stComplete) {
		return gotEntity{}, fmt.Errorf("entity %d ended %v", id, namesOf(ss))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.results[id]; len(r) > 0 {
		return r[0], nil
	}
	return c.byParent[id][0], nil
}

// resultsFor lists the entities returned with parent-id id.
func (c *d02Client) resultsFor(id uint32) []gotEntity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]gotEntity(nil), c.byParent[id]...)
}

// dehydrate announces a parent R with STATUS(R, DEHYDRATING) and sends
// chunks as children (parent-id R, chunk-info with total-chunks N on
// every child), then waits for R's terminal status and result.
func (c *d02Client) dehydrate(ctx context.Context, chunks [][]byte, contentType string) (uint32, []uint32, gotEntity, error) {
	r := c.newID()
	if err := c.sendStatus(r, stDehydrating); err != nil {
		return r, nil, gotEntity{}, err
	}
	var kids []uint32
	off := uint64(0)
	for i, ch := range chunks {
		id := c.newID()
		kids = append(kids, id)
		h := entityHeader{EntityID: id, ParentID: ptr(r), ContentType: contentType,
			ChunkInfo: &chunkInfo{Total: uint64(len(chunks)), Index: uint64(i), Offset: off}}
		if err := c.sendEntity(ctx, h, ch); err != nil {
			return r, kids, gotEntity{}, err
		}
		off += uint64(len(ch))
	}
	res, err := c.awaitResult(ctx, r)
	if rerr := c.resolve(append(kids, r)...); err == nil {
		err = rerr
	}
	return r, kids, res, err
}

func (c *d02Client) close() {
	c.mu.Lock()
	last := c.next - 1
	c.mu.Unlock()
	_ = c.write(encodeGoaway(framingD02, last))
	_ = c.conn.CloseWithError(errNoError, "")
}

func containsStat(ss []uint8, s uint8) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}

// ---- peer ----

type d02PeerMode int

const (
	peerEcho       d02PeerMode = iota // PROCESSING, COMPLETE, then the upper-cased payload as a new entity
	peerNoResult                      // PROCESSING, COMPLETE, nothing returned
	peerStall                         // PROCESSING, then nothing
	peerRefuse                        // reads CAPABILITIES, closes the connection (0x0C) without answering
	peerEchoSameID                    // as peerEcho, but the result entity reuses the input's entity-id (no parent-id)
	peerSlam                          // answers CAPABILITIES, then closes the connection at once (0x01)
)

// peerResultBase is where the peer's own entity ids start: draft-02 does
// not say how client and server share the root-scope id space, so the
// peer keeps well clear of the client's ids.
const peerResultBase = 0x40000000

type d02Peer struct {
	ln    *quic.Listener
	addr  string
	caPEM string
	mode  d02PeerMode

	mu          sync.Mutex
	n           *notifier
	conns       int
	connAt      []time.Time // when each connection was accepted
	offered     [][]string  // the CAPABILITIES keys each client offered
	entities    []gotEntity
	statusIn    []statusFrame
	errs        []error
	next        uint32
	resultsSent map[uint32]uint32 // input id -> result id
}

// startD02Peer starts a plain draft-02 peer on a free UDP port.
func startD02Peer(t testing.TB, mode d02PeerMode) *d02Peer {
	t.Helper()
	ln, pemPath := listenPartner(t)
	p := &d02Peer{ln: ln, addr: ln.Addr().String(), caPEM: pemPath, mode: mode, n: newNotifier(),
		next: peerResultBase, resultsSent: map[uint32]uint32{}}
	go p.serve()
	return p
}

func (p *d02Peer) serve() {
	for {
		conn, err := p.ln.Accept(context.Background())
		if err != nil {
			return
		}
		go p.handle(conn)
	}
}

func (p *d02Peer) record(f func()) {
	p.mu.Lock()
	f()
	p.n.wake()
	p.mu.Unlock()
}

func (p *d02Peer) fail(err error) { p.record(func() { p.errs = append(p.errs, err) }) }

// d02PeerConn is one connection of the peer.
type d02PeerConn struct {
	p    *d02Peer
	conn *quic.Conn
	ctl  *quic.Stream
	wmu  sync.Mutex
}

func (pc *d02PeerConn) write(b []byte) error {
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	_, err := pc.ctl.Write(b)
	return err
}

func (pc *d02PeerConn) status(id uint32, stat uint8) error {
	return pc.write(encodeStatus(framingD02, id, stat, nil))
}

func (p *d02Peer) handle(conn *quic.Conn) {
	p.record(func() { p.conns++; p.connAt = append(p.connAt, time.Now()) })
	pc := &d02PeerConn{p: p, conn: conn}
	if err := pc.handshake(); err != nil {
		p.fail(fmt.Errorf("handshake: %w", err))
		closeFor(conn, err)
		return
	}
	if p.mode == peerSlam {
		closeFor(conn, perr(errInternal, "this peer closes every session at once"))
		return
	}
	go pc.readControl()
	for {
		s, err := conn.AcceptUniStream(context.Background())
		if err != nil {
			return
		}
		go pc.entity(s)
	}
}

func (pc *d02PeerConn) handshake() error {
	ctl, err := pc.conn.AcceptStream(pc.conn.Context())
	if err != nil {
		return err
	}
	if ctl.StreamID() != 0 {
		return perr(errEntityInvalid, "control stream is %d, not 0", ctl.StreamID())
	}
	pc.ctl = ctl
	_ = ctl.SetReadDeadline(time.Now().Add(30 * time.Second))
	fr, err := readFrameD02(ctl)
	_ = ctl.SetReadDeadline(time.Time{})
	if err != nil {
		return perr(errInternal, "first frame: %v", err)
	}
	if fr.typ != ftCaps {
		return perr(errInternal, "first frame 0x%02X is not CAPABILITIES", fr.typ)
	}
	_, keys, err := decodeCapsLenient(fr.f)
	pc.p.record(func() { pc.p.offered = append(pc.p.offered, keys) })
	if err != nil {
		return err
	}
	if pc.p.mode == peerRefuse {
		return perr(errLayerUnsupported, "this peer refuses every session")
	}
	return pc.write(varFrame(ftCaps, mustCBOR(plainCapsD02())))
}

func (pc *d02PeerConn) readControl() {
	for {
		fr, err := readFrameD02(pc.ctl)
		if err != nil {
			if code, _ := closeCode(err); code < 0 && !errors.Is(err, io.EOF) {
				pc.p.fail(fmt.Errorf("stream 0: %w", err))
			}
			return
		}
		if fr.typ != ftStatus {
			continue
		}
		s, err := decodeStatusLenient(fr.f)
		if err != nil {
			pc.p.fail(err)
			continue
		}
		if !isHeartbeat(s) {
			pc.p.record(func() { pc.p.statusIn = append(pc.p.statusIn, s) })
		}
	}
}

// entity reads one entity and answers it as the mode says.
func (pc *d02PeerConn) entity(s *quic.ReceiveStream) {
	p := pc.p
	b, err := readEntityStream(s)
	if err != nil {
		p.fail(fmt.Errorf("entity stream %d: %w", s.StreamID(), err))
		return
	}
	e, err := decodeEntityLenient(b)
	e.stream = int64(s.StreamID())
	if err != nil {
		p.fail(fmt.Errorf("entity stream %d: %w", s.StreamID(), err))
		if e.hdr.EntityID != 0 {
			_ = pc.status(e.hdr.EntityID, stFailed)
		}
		return
	}
	p.record(func() { p.entities = append(p.entities, e) })
	if err := pc.answer(e); err != nil {
		p.fail(fmt.Errorf("answering entity %d: %w", e.hdr.EntityID, err))
	}
}

func (pc *d02PeerConn) answer(e gotEntity) error {
	id := e.hdr.EntityID
	if err := pc.status(id, stProcessing); err != nil || pc.p.mode == peerStall {
		return err
	}
	if err := pc.status(id, stComplete); err != nil || pc.p.mode == peerNoResult {
		return err
	}
	h := entityHeader{EntityID: id, ContentType: e.hdr.ContentType}
	if pc.p.mode != peerEchoSameID {
		pc.p.record(func() {
			h.EntityID, h.ParentID = pc.p.next, ptr(id)
			pc.p.next++
		})
	}
	pc.p.record(func() { pc.p.resultsSent[id] = h.EntityID })
	s, err := pc.conn.OpenUniStreamSync(pc.conn.Context())
	if err != nil {
		return err
	}
	if _, err := s.Write(plainEntity(h, bytes.ToUpper(e.payload))); err != nil {
		return err
	}
	return s.Close()
}

func (p *d02Peer) snapshot() (entities []gotEntity, statusIn []statusFrame, offered [][]string, errs []error, conns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]gotEntity(nil), p.entities...), append([]statusFrame(nil), p.statusIn...),
		append([][]string(nil), p.offered...), append([]error(nil), p.errs...), p.conns
}

// wait blocks until cond (called with p.mu held) holds or ctx ends.
func (p *d02Peer) wait(ctx context.Context, what string, cond func() bool) error {
	return p.n.waitFor(ctx, &p.mu, what, cond)
}
