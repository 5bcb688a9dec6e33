package quicpeer

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// The session core codes against these small interfaces (as moqtransport
// does); quicConn adapts quic-go to them. Keeping the surface this small is
// what lets the core be reasoned about without the transport's details.

// connection is one QUIC connection.
type connection interface {
	OpenStreamSync(ctx context.Context) (stream, error)
	AcceptStream(ctx context.Context) (stream, error)
	OpenUniStreamSync(ctx context.Context) (sendStream, error)
	AcceptUniStream(ctx context.Context) (receiveStream, error)
	// CloseWithError closes with a PipeStream code as the QUIC application
	// error code (Section 11.4).
	CloseWithError(code wire.ErrorCode, msg string) error
	// Context ends when the connection ends; its cause is the close error.
	Context() context.Context
	// NegotiatedProtocol is the ALPN protocol TLS selected.
	NegotiatedProtocol() string
}

// sendStream is the sending half of an entity stream (or stream 0).
type sendStream interface {
	io.Writer
	Close() error // FIN
	CancelWrite(code wire.ErrorCode)
	StreamID() int64
	// TryWriteAll queues all of p without waiting, or nothing: it fails
	// with errWouldBlock when the peer's flow-control credit does not
	// cover p (or the transport has no such write).
	TryWriteAll(p []byte) error
}

// receiveStream is the receiving half of an entity stream (or stream 0).
type receiveStream interface {
	io.Reader
	CancelRead(code wire.ErrorCode)
	StreamID() int64
	// SetReadDeadline makes a pending and later Reads fail with an error
	// that wraps os.ErrDeadlineExceeded once t passes (zero: no deadline).
	SetReadDeadline(t time.Time) error
}

// stream is a bidirectional stream (only stream 0 in PipeStream).
type stream interface {
	sendStream
	receiveStream
	// SetWriteDeadline makes a pending and later Writes fail with an
	// error that wraps os.ErrDeadlineExceeded once t passes (zero: none).
	SetWriteDeadline(t time.Time) error
}

// errWouldBlock is TryWriteAll's "not queued": wait for credit with Write.
var errWouldBlock = quic.ErrWouldBlock

type quicConn struct{ c *quic.Conn }

// controlUrgency is the RFC 9218 urgency of stream 0 (0 = most urgent, the
// default is 3): status updates go before entity data (Section 5.1.2).
const controlUrgency = 0

// OpenStreamSync and AcceptStream are used for stream 0 only; it gets the
// highest send priority.
func (q quicConn) OpenStreamSync(ctx context.Context) (stream, error) {
	s, err := q.c.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	s.SetPriority(controlUrgency, false)
	return quicStream{s}, nil
}

func (q quicConn) AcceptStream(ctx context.Context) (stream, error) {
	s, err := q.c.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	s.SetPriority(controlUrgency, false)
	return quicStream{s}, nil
}

func (q quicConn) OpenUniStreamSync(ctx context.Context) (sendStream, error) {
	s, err := q.c.OpenUniStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	return quicSend{s}, nil
}

func (q quicConn) AcceptUniStream(ctx context.Context) (receiveStream, error) {
	s, err := q.c.AcceptUniStream(ctx)
	if err != nil {
		return nil, err
	}
	return quicReceive{s}, nil
}

func (q quicConn) CloseWithError(code wire.ErrorCode, msg string) error {
	return q.c.CloseWithError(quic.ApplicationErrorCode(code), msg)
}

func (q quicConn) Context() context.Context { return q.c.Context() }

func (q quicConn) NegotiatedProtocol() string { return q.c.ConnectionState().TLS.NegotiatedProtocol }

type quicStream struct{ s *quic.Stream }

func (q quicStream) Read(p []byte) (int, error)      { return q.s.Read(p) }
func (q quicStream) Write(p []byte) (int, error)     { return q.s.Write(p) }
func (q quicStream) TryWriteAll(p []byte) error      { return q.s.TryWriteAll(p) }
func (q quicStream) Close() error                    { return q.s.Close() }
func (q quicStream) CancelWrite(code wire.ErrorCode) { q.s.CancelWrite(quic.StreamErrorCode(code)) }
func (q quicStream) CancelRead(code wire.ErrorCode)  { q.s.CancelRead(quic.StreamErrorCode(code)) }
func (q quicStream) StreamID() int64                 { return int64(q.s.StreamID()) }
func (q quicStream) SetReadDeadline(t time.Time) error {
	return q.s.SetReadDeadline(t)
}
func (q quicStream) SetWriteDeadline(t time.Time) error {
	return q.s.SetWriteDeadline(t)
}

type quicSend struct{ s *quic.SendStream }

func (q quicSend) Write(p []byte) (int, error)     { return q.s.Write(p) }
func (q quicSend) TryWriteAll(p []byte) error      { return q.s.TryWriteAll(p) }
func (q quicSend) Close() error                    { return q.s.Close() }
func (q quicSend) CancelWrite(code wire.ErrorCode) { q.s.CancelWrite(quic.StreamErrorCode(code)) }
func (q quicSend) StreamID() int64                 { return int64(q.s.StreamID()) }

type quicReceive struct{ s *quic.ReceiveStream }

func (q quicReceive) Read(p []byte) (int, error)     { return q.s.Read(p) }
func (q quicReceive) CancelRead(code wire.ErrorCode) { q.s.CancelRead(quic.StreamErrorCode(code)) }
func (q quicReceive) StreamID() int64                { return int64(q.s.StreamID()) }
func (q quicReceive) SetReadDeadline(t time.Time) error {
	return q.s.SetReadDeadline(t)
}

// streamAbort reports whether err is a stream cancellation (RESET_STREAM or
// STOP_SENDING) and its code; remote tells who cancelled.
func streamAbort(err error) (code wire.ErrorCode, remote, ok bool) {
	var se *quic.StreamError
	if errors.As(err, &se) {
		return wire.ErrorCode(se.ErrorCode), se.Remote, true
	}
	return 0, false, false
}

// ConnectionLost reports whether err ended a read or write because the
// whole connection closed (either side, any code, an idle timeout, a
// stateless reset), not because one stream was reset or stopped. A
// receiver must not blame the entity for it: the session's HandleClose
// follows and ends everything the session carried.
func ConnectionLost(err error) bool {
	var (
		ae *quic.ApplicationError
		ie *quic.IdleTimeoutError
		te *quic.TransportError
		sr *quic.StatelessResetError
		ce *CloseError
	)
	return errors.As(err, &ae) || errors.As(err, &ie) || errors.As(err, &te) || errors.As(err, &sr) || errors.As(err, &ce)
}

// closeCause turns the cause of a finished connection into the session's
// error: nil for a PIPESTREAM_NO_ERROR close by either side, a *CloseError for
// other application codes, else the transport error itself.
func closeCause(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		if ae.ErrorCode == 0 {
			return nil
		}
		return &CloseError{Code: wire.ErrorCode(ae.ErrorCode), Remote: ae.Remote, Reason: ae.ErrorMessage}
	}
	return err
}
