package quicpeer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// quicConfig derives the QUIC transport settings from the configuration:
// the peer's uni-stream cap (Section 10.3), no peer-opened bidirectional
// stream beyond stream 0, and liveness from the offered keepalive
// (Section 5.1.4: transport-native liveness first; MaxIdleTimeout is
// 3 x keepalive, the QUIC PING period half the keepalive; the client caps
// them at Config.IdleTimeout and a third of it, docs/profile.md 1).
func quicConfig(cfg *resolved, role Role) *quic.Config {
	ka := defaultKeepaliveDuration(cfg.offer)
	bidi := int64(1) // the server accepts stream 0 only
	idle, ping := idleFactor*ka, ka/2
	if role == RoleClient {
		bidi = -1 // the server opens no bidirectional stream
		idle = min(idle, cfg.IdleTimeout)
		ping = min(ping, idle/probesPerIdle)
	}
	return &quic.Config{
		HandshakeIdleTimeout:  cfg.HandshakeTimeout,
		MaxIdleTimeout:        idle,
		KeepAlivePeriod:       ping,
		MaxIncomingStreams:    bidi,
		MaxIncomingUniStreams: cfg.Limits.MaxIncomingStreams,
	}
}

func defaultKeepaliveDuration(o wire.Capabilities) time.Duration {
	ms := uint64(wire.DefaultKeepaliveMs)
	if o.KeepaliveTimeoutMs != nil && *o.KeepaliveTimeoutMs > 0 {
		ms = min(*o.KeepaliveTimeoutMs, maxKeepaliveMs)
	}
	return time.Duration(ms) * time.Millisecond
}

// Dial opens a client session: QUIC handshake, stream 0, capability
// exchange. It returns once the exchange completed.
func Dial(ctx context.Context, addr string, c Config) (*Session, error) {
	cfg, err := resolve(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	conn, err := dialConn(ctx, addr, cfg)
	if err != nil {
		return nil, err
	}
	// Bound the capability exchange: on timeout the connection closes with
	// PIPESTREAM_IDLE_TIMEOUT and every pending read fails.
	stop := context.AfterFunc(ctx, func() {
		_ = conn.CloseWithError(wire.CodeIdleTimeout, "capability exchange timed out")
	})
	s, err := clientHandshake(cfg, conn)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		if s != nil {
			_ = s.CloseWithError(wire.CodeIdleTimeout, "capability exchange timed out")
			<-s.done
		}
		return nil, err
	}
	return s, nil
}

// dialConn opens the connection: QUIC over UDP, or the in-process
// transport for an "inproc:" address (inproc.go).
func dialConn(ctx context.Context, addr string, cfg *resolved) (connection, error) {
	if strings.HasPrefix(addr, InProcessScheme) {
		return dialInProcess(ctx, addr, cfg)
	}
	qc, err := quic.DialAddr(ctx, addr, cfg.TLS, quicConfig(cfg, RoleClient))
	if err != nil {
		return nil, fmt.Errorf("quicpeer: dial %s: %w", addr, err)
	}
	return quicConn{qc}, nil
}

// clientHandshake opens stream 0, sends CAPABILITIES and reads the
// server's (Section 3.4, 5.1.2, 8.2.2).
func clientHandshake(cfg *resolved, conn connection) (*Session, error) {
	ctrl, err := conn.OpenStreamSync(conn.Context())
	if err != nil {
		return nil, fmt.Errorf("quicpeer: open stream 0: %w", err)
	}
	if ctrl.StreamID() != 0 {
		_ = conn.CloseWithError(wire.CodeInternalError, "control stream is not stream 0")
		return nil, errors.New("quicpeer: the first client stream is not stream 0")
	}
	offer := clientOffer(cfg)
	if err := writeCapabilities(ctrl, &offer); err != nil {
		_ = conn.CloseWithError(wire.CodeInternalError, "cannot send CAPABILITIES")
		return nil, err
	}
	peer, err := readCapabilities(ctrl)
	if err != nil {
		_ = conn.CloseWithError(wire.CodeOf(err), err.Error())
		return nil, err
	}
	s := start(cfg, RoleClient, conn, ctrl, negotiate(offer, *peer))
	s.settleClientFraming()
	if err := s.validateAnswer(offer, peer); err != nil {
		return nil, err
	}
	// A heartbeat after CAPABILITIES, as the reference client sends: it
	// shows a FramingAuto server this client's framing at once.
	_ = s.sendHeartbeat()
	return s, nil
}

// serverHandshake accepts stream 0, reads the client's CAPABILITIES, then
// answers with its own. Entity streams are accepted only afterwards.
func serverHandshake(ctx context.Context, cfg *resolved, conn connection) (*Session, error) {
	ctrl, err := conn.AcceptStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("quicpeer: accept stream 0: %w", err)
	}
	if ctrl.StreamID() != 0 {
		err := localErr(wire.CodeInternalError, "the client's first stream is %d, not stream 0", ctrl.StreamID())
		_ = conn.CloseWithError(wire.CodeInternalError, err.Error())
		return nil, err
	}
	peer, err := readCapabilities(ctrl)
	if err != nil {
		_ = conn.CloseWithError(wire.CodeOf(err), err.Error())
		return nil, err
	}
	reply := serverReply(cfg, peer)
	if err := writeCapabilities(ctrl, &reply); err != nil {
		_ = conn.CloseWithError(wire.CodeInternalError, "cannot send CAPABILITIES")
		return nil, err
	}
	s := start(cfg, RoleServer, conn, ctrl, negotiate(reply, *peer))
	if cfg.Framing == FramingDraft04 {
		_ = s.sendHeartbeat() // the reference server's heartbeat after CAPABILITIES
	}
	return s, nil
}

// writeCapabilities sends CAPABILITIES, always CBOR (Section 3.4).
func writeCapabilities(w sendStream, c *wire.Capabilities) error {
	body, err := wire.CodecFor(wire.FormatCBOR).MarshalCapabilities(c)
	if err != nil {
		return fmt.Errorf("quicpeer: encode CAPABILITIES: %w", err)
	}
	_, err = w.Write(wire.AppendVariable(nil, wire.FrameCapabilities, body))
	return err
}

// readCapabilities reads the first frame of stream 0, which must be a
// CBOR CAPABILITIES, straight from r (no ControlReader yet: the session's
// reader allows 16 MiB bodies, the first CAPABILITIES only
// maxCapabilitiesBytes). The type octet is checked first and the declared
// length next, before any octet of the body is read or buffered (Section
// 10.3): a longer one is PIPESTREAM_ENTITY_TOO_LARGE (0x06). Anything that
// cannot be decoded (another frame type, a stream that ends inside the
// frame, bad CBOR) is PIPESTREAM_INTERNAL_ERROR (Section 3.4.2);
// layer0-core false is 0x0C and the limit checks of
// wire.ValidateCapabilities keep their codes. It reads exactly one frame.
func readCapabilities(r io.Reader) (*wire.Capabilities, error) {
	var hdr [wire.VarHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:1]); err != nil {
		return nil, fmt.Errorf("quicpeer: read CAPABILITIES: %w", err)
	}
	if t := wire.FrameType(hdr[0]); t != wire.FrameCapabilities {
		return nil, localErr(wire.CodeInternalError, "first frame on stream 0 is type 0x%02X, not CAPABILITIES (0x80)", byte(t))
	}
	if _, err := io.ReadFull(r, hdr[1:]); err != nil {
		return nil, handshakeReadErr(err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxCapabilitiesBytes {
		return nil, localErr(wire.CodeEntityTooLarge, "first CAPABILITIES declares %d octets, more than the %d allowed", n, maxCapabilitiesBytes)
	}
	body := make([]byte, n) // n <= maxCapabilitiesBytes
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, handshakeReadErr(err)
	}
	c, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(body)
	if err != nil {
		return nil, localErr(wire.CodeInternalError, "cannot decode the first CAPABILITIES: %v", err)
	}
	if err := wire.ValidateCapabilities(c); err != nil {
		return nil, err
	}
	return c, nil
}

// handshakeReadErr maps a read error inside the first CAPABILITIES: the
// stream ending there makes it undecodable (0x01); anything else (a reset,
// the connection ending) is returned as is.
func handshakeReadErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return localErr(wire.CodeInternalError, "cannot decode the first CAPABILITIES: stream 0 ended inside the frame")
	}
	return fmt.Errorf("quicpeer: read CAPABILITIES: %w", err)
}

// Listener accepts server sessions on its own UDP socket and QUIC
// transport (the transport carries the stateless reset key).
type Listener struct {
	cfg    *resolved
	udp    *net.UDPConn
	tr     *quic.Transport
	ql     *quic.Listener
	inproc *inprocListener // set instead of udp, tr and ql for "inproc:"
	ctx    context.Context
	cancel context.CancelFunc
	ready  chan *Session
	wg     sync.WaitGroup

	// conns counts accepted QUIC connections that have not ended
	// (Limits.MaxConnections); only acceptLoop increments it.
	conns atomic.Int64

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// Listen starts a server endpoint on a UDP address ("127.0.0.1:0" picks a port).
func Listen(addr string, c Config) (*Listener, error) {
	cfg, err := resolve(c)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(addr, InProcessScheme) {
		il, err := listenInProcess(addr, cfg)
		if err != nil {
			return nil, err
		}
		return newListener(cfg, &Listener{inproc: il}), nil
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("quicpeer: listen %s: %w", addr, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("quicpeer: listen %s: %w", addr, err)
	}
	tr := &quic.Transport{Conn: udp, ConnectionIDLength: serverConnIDLen}
	if cfg.StatelessResetKey != nil {
		k := quic.StatelessResetKey(*cfg.StatelessResetKey)
		tr.StatelessResetKey = &k
	}
	ql, err := tr.Listen(cfg.TLS, quicConfig(cfg, RoleServer))
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return nil, fmt.Errorf("quicpeer: listen %s: %w", addr, err)
	}
	return newListener(cfg, &Listener{udp: udp, tr: tr, ql: ql}), nil
}

// newListener completes l and starts accepting.
func newListener(cfg *resolved, l *Listener) *Listener {
	l.cfg, l.ready, l.sessions = cfg, make(chan *Session), map[*Session]struct{}{}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// accept returns the next connection and its remote address.
func (l *Listener) accept() (connection, string, error) {
	if l.inproc != nil {
		c, err := l.inproc.accept(l.ctx)
		if err != nil {
			return nil, "", err
		}
		return c, "inproc", nil
	}
	qc, err := l.ql.Accept(l.ctx)
	if err != nil {
		return nil, "", err
	}
	return quicConn{qc}, qc.RemoteAddr().String(), nil
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		conn, remote, err := l.accept()
		if err != nil {
			return
		}
		if limit := int64(l.cfg.Limits.MaxConnections); l.conns.Load() >= limit {
			l.cfg.Logger.Warn("connection refused: limit reached", "remote", remote, "max_connections", limit)
			_ = conn.CloseWithError(wire.CodeInternalError,
				fmt.Sprintf("too many connections: this endpoint holds at most %d (Limits.MaxConnections); retry later", limit))
			continue
		}
		l.conns.Add(1)
		context.AfterFunc(conn.Context(), func() { l.conns.Add(-1) })
		l.wg.Add(1)
		go l.handshake(conn, remote)
	}
}

func (l *Listener) handshake(conn connection, remote string) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		_ = conn.CloseWithError(wire.CodeIdleTimeout, "capability exchange timed out")
	})
	s, err := serverHandshake(ctx, l.cfg, conn)
	stop()
	if err != nil {
		l.cfg.Logger.Warn("capability exchange failed", "remote", remote, "err", err)
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = s.CloseWithError(wire.CodeNoError, "listener closed")
		<-s.done
		return
	}
	l.sessions[s] = struct{}{}
	l.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		<-s.done
		l.mu.Lock()
		delete(l.sessions, s)
		l.mu.Unlock()
	}()
	select {
	case l.ready <- s:
	case <-s.ctx.Done():
	case <-l.ctx.Done():
	}
}

// Accept returns the next session whose capability exchange completed.
func (l *Listener) Accept(ctx context.Context) (*Session, error) {
	select {
	case s := <-l.ready:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Addr is the bound UDP address (or the "inproc:" one).
func (l *Listener) Addr() net.Addr {
	if l.inproc != nil {
		return l.inproc.addr
	}
	return l.ql.Addr()
}

// Close stops accepting and closes all sessions with PIPESTREAM_NO_ERROR.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	ss := make([]*Session, 0, len(l.sessions))
	for s := range l.sessions {
		ss = append(ss, s)
	}
	l.mu.Unlock()
	l.cancel()
	for _, s := range ss {
		_ = s.CloseWithError(wire.CodeNoError, "listener closed")
	}
	if l.inproc != nil {
		l.inproc.close()
		l.wg.Wait()
		return nil
	}
	err := l.ql.Close()
	// The sessions are closed; the transport ends what is left (handshakes,
	// closed connections lingering to repeat their CONNECTION_CLOSE).
	_ = l.tr.Close()
	if uerr := l.udp.Close(); uerr != nil && !errors.Is(uerr, net.ErrClosed) && err == nil {
		err = uerr
	}
	l.wg.Wait()
	return err
}
