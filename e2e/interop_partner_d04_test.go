package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// Draft-04 partners: the Layer 0 conversation of the public reference
// suite (ai-pipestream/pipestream-quic-protocol-rfc, Rust/quinn
// implementation, src/transport.rs and src/lib.rs at fb9e8f79), ported
// to Go and as strict as the reference: every control frame is Type +
// 4-octet Length + payload, CBOR maps are closed and must be canonical,
// lengths are exact, and any deviation closes the connection with the
// reference's error code.
//
// Client: CAPABILITIES (six members) -> server CAPABILITIES, refused
// (0x0D) when it exceeds the offer (validate_response) -> heartbeat
// -> STATUS PENDING(id) -> entity stream -> STATUS PROCESSING, COMPLETE
// (heartbeats skipped) -> CHECKPOINT request -> CHECKPOINT ACK echo ->
// connection-level cursor update (id+1) -> GOAWAY(id) -> GOAWAY echo ->
// close 0x00.
//
// Server: the mirror image, one entity per connection, connections served
// one after another (the reference awaits each before accepting the next).

// nextEntityID is the reference's next_entity_id.
func nextEntityID(id uint32) (uint32, error) {
	if id == 0 || id > maxEntityID {
		return 0, perr(errEntityInvalid, "entity-id is reserved")
	}
	if id == maxEntityID {
		return 1, nil
	}
	return id + 1, nil
}

// readControlD04 is the reference's read_control: one frame, connection
// heartbeats skipped, STATUS payloads decoded strictly on the way.
func readControlD04(r io.Reader) (ctlFrame, error) {
	for {
		fr, err := readFrameD04(r)
		if err != nil {
			return fr, err
		}
		if fr.typ != ftStatus {
			return fr, nil
		}
		s, err := decodeStatusStrict(fr.f)
		if err != nil {
			return fr, err
		}
		if !isHeartbeat(s) {
			return fr, nil
		}
	}
}

// readStatusD04 reads the next frame and requires a STATUS.
func readStatusD04(r io.Reader, what string) (statusFrame, error) {
	fr, err := readControlD04(r)
	if err != nil {
		return statusFrame{}, err
	}
	if fr.typ != ftStatus {
		return statusFrame{}, perr(errFrame, "%s: got frame 0x%02X, want STATUS", what, fr.typ)
	}
	return decodeStatusStrict(fr.f)
}

// ---- client ----

// d04ClientReport is what the reference client saw.
type d04ClientReport struct {
	serverCaps capsD04
	statuses   []statusFrame // PROCESSING, COMPLETE for the entity
	ack        checkpointMsg
	goaway     uint32
	results    []gotEntity // entities the server opened (the reference never reads them)
	resultErrs []error     // ... that the reference's decoder would refuse
	drainErrs  []error     // ... that could not be read after the conversation
}

type d04Client struct {
	conn *quic.Conn
	ctl  *quic.Stream
	rep  d04ClientReport
}

// runD04Client runs the reference client conversation for one entity.
func runD04Client(ctx context.Context, addr, caPEM string, id uint32, payload []byte, contentType string) (d04ClientReport, error) {
	conn, err := dialPartnerConfig(ctx, addr, caPEM, quinnLikeConfig())
	if err != nil {
		return d04ClientReport{}, err
	}
	c := &d04Client{conn: conn}
	err = c.converse(ctx, id, payload, contentType)
	if err != nil {
		closeFor(conn, err)
		return c.rep, err
	}
	c.drainResults(ctx, 2*time.Second)
	_ = conn.CloseWithError(errNoError, "complete")
	return c.rep, nil
}

// quinnLikeConfig mirrors quinn's receive windows (the reference client
// never reads server-initiated streams: a stream stops at quinn's
// per-stream window of 1.25 MB; the connection window is unbounded).
func quinnLikeConfig() *quic.Config {
	cfg := partnerQUICConfig()
	cfg.InitialStreamReceiveWindow, cfg.MaxStreamReceiveWindow = 1250000, 1250000
	cfg.InitialConnectionReceiveWindow, cfg.MaxConnectionReceiveWindow = 1<<30, 1<<30
	return cfg
}

func (c *d04Client) converse(ctx context.Context, id uint32, payload []byte, contentType string) error {
	if err := c.capabilities(ctx); err != nil {
		return fmt.Errorf("capabilities: %w", err)
	}
	if err := c.sendEntity(ctx, id, payload, contentType); err != nil {
		return fmt.Errorf("entity: %w", err)
	}
	for _, want := range []uint8{stProcessing, stComplete} {
		s, err := readStatusD04(c.ctl, "entity status")
		if err != nil {
			return err
		}
		if s.entity != id || s.stat != want {
			return perr(errEntityInvalid, "unexpected status response %v, want STATUS(%d %s)", s, id, statusName(want))
		}
		c.rep.statuses = append(c.rep.statuses, s)
	}
	return c.finish(id)
}

func (c *d04Client) capabilities(ctx context.Context) error {
	ctl, err := c.conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	c.ctl = ctl
	if dl, ok := ctx.Deadline(); ok { // every read of the conversation ends with ctx
		_ = ctl.SetReadDeadline(dl)
	}
	if _, err := ctl.Write(varFrame(ftCaps, mustCBOR(referenceCaps()))); err != nil {
		return err
	}
	fr, err := readControlD04(ctl)
	if err != nil {
		return err
	}
	if fr.typ != ftCaps {
		return perr(errFrame, "server did not answer capabilities (frame 0x%02X)", fr.typ)
	}
	if c.rep.serverCaps, err = decodeCapsStrict(fr.f); err != nil {
		return err
	}
	return validateResponseD04(referenceCaps(), c.rep.serverCaps)
}

func (c *d04Client) sendEntity(ctx context.Context, id uint32, payload []byte, contentType string) error {
	if _, err := c.ctl.Write(encodeStatus(framingD04, connLevel, stUnspecified, nil)); err != nil {
		return err
	}
	if _, err := c.ctl.Write(encodeStatus(framingD04, id, stPending, nil)); err != nil {
		return err
	}
	s, err := c.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := s.Write(referenceEntity(id, nil, payload, contentType)); err != nil {
		return err
	}
	return s.Close()
}

// finish: CHECKPOINT and its ACK, cursor update, GOAWAY and its echo.
func (c *d04Client) finish(id uint32) error {
	next, err := nextEntityID(id)
	if err != nil {
		return err
	}
	cp := checkpointMsg{ID: fmt.Sprintf("entity-%d", id), Seq: 1, EntityID: next, Flags: ptr(uint8(0))}
	if _, err := c.ctl.Write(varFrame(ftCheckpoint, mustCBOR(cp))); err != nil {
		return err
	}
	fr, err := readControlD04(c.ctl)
	if err != nil {
		return err
	}
	if fr.typ != ftCheckpoint {
		return perr(errFrame, "expected CHECKPOINT acknowledgement, got frame 0x%02X", fr.typ)
	}
	ack, err := decodeCheckpointStrict(fr.f)
	if err != nil {
		return err
	}
	c.rep.ack = ack
	if ack.ID != cp.ID || ack.Seq != cp.Seq || ack.EntityID != cp.EntityID || *ack.Flags != checkpointAck {
		return perr(errEntityInvalid, "invalid checkpoint acknowledgement %+v", ack)
	}
	if _, err := c.ctl.Write(encodeStatus(framingD04, connLevel, stUnspecified, &next)); err != nil {
		return err
	}
	if _, err := c.ctl.Write(encodeGoaway(framingD04, id)); err != nil {
		return err
	}
	return c.goawayEcho(id)
}

func (c *d04Client) goawayEcho(id uint32) error {
	fr, err := readControlD04(c.ctl)
	if err != nil {
		return err
	}
	if fr.typ != ftGoaway {
		return perr(errFrame, "invalid GOAWAY acknowledgement: frame 0x%02X", fr.typ)
	}
	last, err := decodeGoaway(fr.f)
	if err != nil {
		return err
	}
	c.rep.goaway = last
	if last != id {
		return perr(errFrame, "invalid GOAWAY acknowledgement: last entity %d, want %d", last, id)
	}
	return c.ctl.Close()
}

// drainResults reads, after the conversation, entities the server opened
// (the reference client never accepts them; this records whether its
// decoder would take them). Transport errors are not recorded.
func (c *d04Client) drainResults(ctx context.Context, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		s, err := c.conn.AcceptUniStream(ctx)
		if err != nil {
			return
		}
		_ = s.SetReadDeadline(time.Now().Add(d))
		b, err := readEntityStream(s)
		if err != nil {
			c.rep.drainErrs = append(c.rep.drainErrs, fmt.Errorf("stream %d: %w", s.StreamID(), err))
			continue
		}
		e, err := decodeEntityStrict(b)
		c.rep.results = append(c.rep.results, e)
		if err != nil {
			c.rep.resultErrs = append(c.rep.resultErrs, err)
		}
	}
}

// ---- server ----

// d04Session is one completed reference server conversation.
type d04Session struct {
	clientCaps capsD04
	pending    uint32
	entity     gotEntity
	checkpoint *checkpointMsg
	cursor     uint32
}

type d04Server struct {
	ln    *quic.Listener
	addr  string
	caPEM string
	// noHeartbeat: the server sends no heartbeat after CAPABILITIES (the
	// heartbeat is optional), so a client in auto framing cannot detect
	// draft-04 from it.
	noHeartbeat bool

	mu       sync.Mutex
	n        *notifier
	conns    int
	sessions []d04Session
	errs     []error // why a connection was closed with an error
}

// startD04Server starts the reference server conversation on a free port.
func startD04Server(t testing.TB) *d04Server { return startD04ServerWith(t, false) }

// startD04ServerWith starts it, without the heartbeat after CAPABILITIES
// when noHeartbeat is set.
func startD04ServerWith(t testing.TB, noHeartbeat bool) *d04Server {
	t.Helper()
	cfg := quinnLikeConfig() // and the reference server's stream limits
	cfg.MaxIncomingStreams, cfg.MaxIncomingUniStreams = 1, 128
	ln, pemPath := listenPartnerConfig(t, cfg)
	s := &d04Server{ln: ln, addr: ln.Addr().String(), caPEM: pemPath, n: newNotifier(), noHeartbeat: noHeartbeat}
	go s.serve()
	return s
}

// serve handles connections one at a time, like the reference. Unlike
// the reference binary, it keeps serving after a failed connection (the
// reference's serve() returns the error and exits).
func (s *d04Server) serve() {
	for {
		conn, err := s.ln.Accept(context.Background())
		if err != nil {
			return
		}
		s.record(func() { s.conns++ })
		sess, err := s.handle(conn, s.noHeartbeat)
		if err != nil {
			closeFor(conn, err)
			s.record(func() { s.errs = append(s.errs, err) })
			continue
		}
		s.record(func() { s.sessions = append(s.sessions, sess) })
		select { // the reference waits up to 5 s for the client to close
		case <-conn.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}
}

func (s *d04Server) record(f func()) {
	s.mu.Lock()
	f()
	s.n.wake()
	s.mu.Unlock()
}

type d04ServerConn struct {
	conn        *quic.Conn
	ctl         *quic.Stream
	sess        d04Session
	noHeartbeat bool
}

func (s *d04Server) handle(conn *quic.Conn, noHeartbeat bool) (d04Session, error) {
	ctx, cancel := context.WithTimeout(conn.Context(), 60*time.Second)
	defer cancel()
	sc := &d04ServerConn{conn: conn, noHeartbeat: noHeartbeat}
	if err := sc.capabilities(ctx); err != nil {
		return sc.sess, err
	}
	if err := sc.entity(ctx); err != nil {
		return sc.sess, err
	}
	return sc.sess, sc.finish()
}

func (sc *d04ServerConn) capabilities(ctx context.Context) error {
	ctl, err := sc.conn.AcceptStream(ctx)
	if err != nil {
		return perr(errFrame, "PIPESTREAM_CONTROL_RESET: %v", err)
	}
	sc.ctl = ctl
	if dl, ok := ctx.Deadline(); ok {
		_ = ctl.SetReadDeadline(dl)
	}
	fr, err := readControlD04(ctl)
	if err != nil {
		return err
	}
	if fr.typ != ftCaps {
		return perr(errFrame, "first frame must be CAPABILITIES")
	}
	peer, err := decodeCapsStrict(fr.f)
	if err != nil {
		return err
	}
	sc.sess.clientCaps = peer
	if _, err := ctl.Write(varFrame(ftCaps, mustCBOR(negotiateD04(referenceCaps(), peer)))); err != nil {
		return perr(errFrame, "%v", err)
	}
	if sc.noHeartbeat {
		return nil
	}
	_, err = ctl.Write(encodeStatus(framingD04, connLevel, stUnspecified, nil))
	return err
}

func (sc *d04ServerConn) entity(ctx context.Context) error {
	pending, err := readStatusD04(sc.ctl, "entity announcement")
	if err != nil {
		return err
	}
	if pending.stat != stPending {
		return perr(errEntityInvalid, "first entity status must be PENDING, got %v", pending)
	}
	sc.sess.pending = pending.entity
	us, err := sc.conn.AcceptUniStream(ctx)
	if err != nil {
		return perr(errFrame, "%v", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = us.SetReadDeadline(dl)
	}
	b, err := io.ReadAll(io.LimitReader(us, maxEntityBodyD04+maxEntityHdrD04+4+1))
	if err != nil {
		return perr(errFrame, "%v", err)
	}
	e, err := decodeEntityStrict(b)
	if err != nil {
		return err
	}
	if e.hdr.EntityID != pending.entity {
		return perr(errEntityInvalid, "PENDING and EntityHeader IDs differ (%d, %d)", pending.entity, e.hdr.EntityID)
	}
	sc.sess.entity = e
	if _, err := sc.ctl.Write(encodeStatus(framingD04, e.hdr.EntityID, stProcessing, nil)); err != nil {
		return perr(errFrame, "%v", err)
	}
	_, err = sc.ctl.Write(encodeStatus(framingD04, e.hdr.EntityID, stComplete, nil))
	return err
}

func (sc *d04ServerConn) finish() error {
	id := sc.sess.entity.hdr.EntityID
	next, err := nextEntityID(id)
	if err != nil {
		return err
	}
	fr, err := readControlD04(sc.ctl)
	if err != nil {
		return err
	}
	if fr.typ == ftCheckpoint {
		if fr, err = sc.checkpoint(fr, next); err != nil {
			return err
		}
	}
	if fr.typ != ftStatus {
		return perr(errFrame, "terminal status must be followed by cursor update (frame 0x%02X)", fr.typ)
	}
	cur, err := decodeStatusStrict(fr.f)
	if err != nil {
		return err
	}
	if cur.stat != stUnspecified || cur.entity != connLevel || !cur.hasCursor || cur.cursor != next {
		return perr(errEntityInvalid, "invalid connection-level cursor update %v, want cursor %d", cur, next)
	}
	sc.sess.cursor = cur.cursor
	return sc.goaway(id)
}

func (sc *d04ServerConn) checkpoint(fr ctlFrame, next uint32) (ctlFrame, error) {
	cp, err := decodeCheckpointStrict(fr.f)
	if err != nil {
		return fr, err
	}
	if *cp.Flags != 0 || cp.EntityID != next {
		return fr, perr(errEntityInvalid, "checkpoint barrier is not satisfied (%+v)", cp)
	}
	sc.sess.checkpoint = &cp
	cp.Flags = ptr(uint8(checkpointAck))
	if _, err := sc.ctl.Write(varFrame(ftCheckpoint, mustCBOR(cp))); err != nil {
		return fr, err
	}
	return readControlD04(sc.ctl)
}

func (sc *d04ServerConn) goaway(id uint32) error {
	fr, err := readControlD04(sc.ctl)
	if err != nil {
		return err
	}
	if fr.typ != ftGoaway {
		return perr(errFrame, "invalid GOAWAY (frame 0x%02X)", fr.typ)
	}
	last, err := decodeGoaway(fr.f)
	if err != nil {
		return err
	}
	if last != id {
		return perr(errFrame, "invalid GOAWAY: last entity %d, want %d", last, id)
	}
	if _, err := sc.ctl.Write(encodeGoaway(framingD04, id)); err != nil {
		return err
	}
	return sc.ctl.Close()
}

func (s *d04Server) snapshot() (sessions []d04Session, errs []error, conns int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]d04Session(nil), s.sessions...), append([]error(nil), s.errs...), s.conns
}

// wait blocks until cond (called with s.mu held) holds or ctx ends.
func (s *d04Server) wait(ctx context.Context, what string, cond func() bool) error {
	return s.n.waitFor(ctx, &s.mu, what, cond)
}

// errorsText joins errs for a failure message.
func errorsText(errs []error) string {
	if len(errs) == 0 {
		return "(none)"
	}
	return errors.Join(errs...).Error()
}
