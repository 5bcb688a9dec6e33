package conformance

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// SendOptions configure Send (the contract's `send`).
type SendOptions struct {
	Connect     string // server UDP address HOST:PORT
	CAFile      string // PEM CA bundle that verifies the server
	ServerName  string // TLS server name; empty: the host of Connect
	EntityID    uint32
	ParentID    *uint32
	InputFile   string
	ContentType string // empty: application/octet-stream
	// MaxPayload refuses a larger input before connecting; <= 0 means
	// DefaultMaxPayload (what the reference accepts).
	MaxPayload int64
	// Timeout bounds the whole conversation; <= 0 means DefaultTimeout.
	Timeout time.Duration
	// Stdout gets "SENT ID LENGTH" on success; nil discards it.
	Stdout io.Writer
}

// Send sends the input file as one entity with the reference client
// conversation and returns nil once the server reported PROCESSING and
// COMPLETE for it, acknowledged the CHECKPOINT and echoed the GOAWAY. The
// input is streamed (read twice: once for its SHA-256, once onto the
// entity stream), never held in memory whole.
func Send(ctx context.Context, o SendOptions) error {
	if err := o.check(); err != nil {
		return err
	}
	in, size, sum, err := openInput(o.InputFile, o.MaxPayload)
	if err != nil {
		return err
	}
	defer in.Close()
	tc, err := o.tls()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	conn, err := quic.DialAddr(ctx, o.Connect, tc, quicConfig())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", o.Connect, err)
	}
	expired := perr(wire.CodeInternalError, "the conversation did not end within %v (--timeout)", o.Timeout)
	stop := context.AfterFunc(ctx, func() { closeWith(conn, expired) })
	defer stop()
	cc := &clientConn{conn: conn, o: &o}
	if err := cc.run(ctx, in, size, sum); err != nil {
		if ctx.Err() != nil {
			err = expired
		}
		closeWith(conn, err)
		return err
	}
	_ = conn.CloseWithError(quic.ApplicationErrorCode(wire.CodeNoError), "complete")
	if o.Stdout != nil {
		fmt.Fprintf(o.Stdout, "SENT %d %d\n", o.EntityID, size)
	}
	return nil
}

func (o *SendOptions) check() error {
	if o.MaxPayload <= 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ContentType == "" {
		o.ContentType = "application/octet-stream"
	}
	switch {
	case o.Connect == "":
		return errors.New("a server address is required (--connect HOST:PORT)")
	case o.CAFile == "":
		return errors.New("a CA certificate is required (--ca)")
	case o.InputFile == "":
		return errors.New("an input file is required (--input)")
	case !validEntityID(o.EntityID):
		return fmt.Errorf("--entity-id %d is reserved: use 1..%d", o.EntityID, uint32(maxEntityID))
	case o.ParentID != nil && !validEntityID(*o.ParentID):
		return fmt.Errorf("--parent-id %d is reserved: use 1..%d", *o.ParentID, uint32(maxEntityID))
	}
	return nil
}

func (o *SendOptions) tls() (*tls.Config, error) {
	b, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("read --ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--ca %s holds no PEM certificate", o.CAFile)
	}
	tc := tlsBase()
	tc.RootCAs, tc.ServerName = pool, o.ServerName
	return tc, nil
}

// openInput opens the input, checks its size against max and hashes it;
// the file is left at offset 0.
func openInput(path string, max int64) (*os.File, int64, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("open --input: %w", err)
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err == nil && st.Size() > max {
		err = fmt.Errorf("--input is %d octets, more than the %d an entity may carry (--max-payload)", st.Size(), max)
	}
	h := sha256.New()
	var n int64
	if err == nil {
		n, err = io.Copy(h, f)
	}
	if err == nil && n != st.Size() {
		err = fmt.Errorf("--input changed while it was read (%d octets, then %d)", st.Size(), n)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	return f, n, h.Sum(nil), nil
}

type clientConn struct {
	conn *quic.Conn
	o    *SendOptions
	c    *control
}

func (cc *clientConn) run(ctx context.Context, in io.Reader, size int64, sum []byte) error {
	ctl, err := cc.conn.OpenStreamSync(ctx)
	if err != nil {
		return fmt.Errorf("open stream 0: %w", err)
	}
	cc.c = newControl(ctl)
	if err := cc.capabilities(); err != nil {
		return err
	}
	if err := cc.sendEntity(ctx, in, size, sum); err != nil {
		return err
	}
	if err := cc.statuses(); err != nil {
		return err
	}
	return cc.finish()
}

// capabilities offers the six Layer 0 members and refuses an answer that
// grants more (steps 1 and 2).
func (cc *clientConn) capabilities() error {
	if err := cc.c.writeCapabilities(offer()); err != nil {
		return err
	}
	f, err := cc.c.next("the server's CAPABILITIES")
	if err != nil {
		return err
	}
	if f.Type != wire.FrameCapabilities {
		return perr(wire.CodeFrameError, "the server did not answer CAPABILITIES (frame 0x%02X)", byte(f.Type))
	}
	caps, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(f.Body)
	if err != nil {
		return err
	}
	return checkAnswer(caps)
}

// sendEntity announces the entity (heartbeat, STATUS PENDING) and sends
// it on its own stream: header of the six Layer 0 members, the payload.
func (cc *clientConn) sendEntity(ctx context.Context, in io.Reader, size int64, sum []byte) error {
	id := cc.o.EntityID
	if err := cc.c.writeHeartbeat(); err != nil {
		return err
	}
	if err := cc.c.writeStatus(wire.StatusPending, id); err != nil {
		return err
	}
	us, err := cc.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return fmt.Errorf("open the entity stream: %w", err)
	}
	h := wire.EntityHeader{EntityID: id, ParentID: cc.o.ParentID, ContentType: cc.o.ContentType,
		PayloadLength: uint64(size), Checksum: sum}
	if err := wire.WriteEntityHeader(us, wire.CodecFor(wire.FormatCBOR), &h); err != nil {
		return fmt.Errorf("write the entity header: %w", err)
	}
	n, err := io.Copy(us, io.LimitReader(in, size))
	if err == nil && n != size {
		err = fmt.Errorf("--input shrank while it was sent (%d of %d octets)", n, size)
	}
	if err != nil {
		us.CancelWrite(quic.StreamErrorCode(wire.CodeInternalError))
		return fmt.Errorf("send the payload: %w", err)
	}
	return us.Close()
}

// statuses waits for PROCESSING then COMPLETE of the entity.
func (cc *clientConn) statuses() error {
	id := cc.o.EntityID
	for _, want := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
		s, err := cc.c.status("STATUS " + want.String())
		if err != nil {
			return err
		}
		if s.EntityID == id && s.Status == wire.StatusFailed {
			return fmt.Errorf("the server reported FAILED for entity %d", id)
		}
		if s.EntityID != id || s.Status != want {
			return perr(wire.CodeEntityInvalid, "unexpected STATUS %s for entity %d, want %s for %d", s.Status, s.EntityID, want, id)
		}
	}
	return nil
}

// finish: CHECKPOINT for the next ID and its acknowledgement, the cursor
// update, GOAWAY and its echo; then stream 0 is finished.
func (cc *clientConn) finish() error {
	id := cc.o.EntityID
	next := nextEntityID(id)
	zero := uint64(0)
	cp := wire.CheckpointFrame{CheckpointID: fmt.Sprintf("entity-%d", id), SequenceNumber: 1, CheckpointEntityID: next, Flags: &zero}
	if err := cc.c.writeCheckpoint(&cp); err != nil {
		return err
	}
	if err := cc.checkpointAck(&cp); err != nil {
		return err
	}
	if err := cc.c.writeCursor(next); err != nil {
		return err
	}
	if err := cc.c.writeGoAway(id); err != nil {
		return err
	}
	f, err := cc.c.next("the GOAWAY echo")
	if err != nil {
		return err
	}
	if f.Type != wire.FrameGoAway || f.GoAway.LastEntityID != id {
		return perr(wire.CodeFrameError, "invalid GOAWAY acknowledgement (frame 0x%02X, last entity %d), want GOAWAY(%d)", byte(f.Type), f.GoAway.LastEntityID, id)
	}
	return cc.c.s.Close()
}

func (cc *clientConn) checkpointAck(cp *wire.CheckpointFrame) error {
	f, err := cc.c.next("the CHECKPOINT acknowledgement")
	if err != nil {
		return err
	}
	if f.Type != wire.FrameCheckpoint {
		return perr(wire.CodeFrameError, "expected the CHECKPOINT acknowledgement, got frame 0x%02X", byte(f.Type))
	}
	ack, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCheckpoint(f.Body)
	if err != nil {
		return err
	}
	if ack.CheckpointID != cp.CheckpointID || ack.SequenceNumber != cp.SequenceNumber ||
		ack.CheckpointEntityID != cp.CheckpointEntityID || ack.Flags == nil || *ack.Flags != checkpointAck {
		return perr(wire.CodeEntityInvalid, "invalid CHECKPOINT acknowledgement %+v", *ack)
	}
	return nil
}
