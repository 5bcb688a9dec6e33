package conformance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// ServeOptions configure Serve (the contract's `serve`).
type ServeOptions struct {
	Bind      string // UDP address; port 0 picks a free one (see ReadyFile)
	CertFile  string // PEM certificate chain
	KeyFile   string // PEM private key
	OutputDir string // receives ID.bin and ID.parent; created if absent
	ReadyFile string // receives "HOST:PORT\n" once listening; optional
	// Once: return after the first connection, with its outcome.
	Once bool
	// MaxPayload refuses larger entity payloads (0x06) before reading
	// them; <= 0 means DefaultMaxPayload.
	MaxPayload int64
	// Timeout bounds one connection's conversation; <= 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// Stdout gets the reference's progress lines ("READY ADDR",
	// "RECEIVED ID LENGTH"); nil discards them.
	Stdout io.Writer
	// Log gets one line per refused connection; nil discards them.
	Log *slog.Logger
}

// Received describes one stored entity.
type Received struct {
	EntityID uint32
	ParentID *uint32
	Length   int64
}

func (o *ServeOptions) defaults() {
	if o.MaxPayload <= 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Serve listens on o.Bind and runs the reference server conversation on
// each connection, one connection at a time (as the reference does). With
// o.Once it returns after the first connection: nil when its entity was
// stored and the conversation completed, else the refusal (and an error
// when ctx ends before any connection arrived). Without it,
// a refused connection is logged and serving goes on until ctx ends (then
// Serve returns nil).
func Serve(ctx context.Context, o ServeOptions) error {
	o.defaults()
	if o.OutputDir == "" {
		return errors.New("an output directory is required (--output-dir)")
	}
	if err := os.MkdirAll(o.OutputDir, 0o755); err != nil {
		return fmt.Errorf("create the output directory: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return fmt.Errorf("load --cert %s and --key %s: %w", o.CertFile, o.KeyFile, err)
	}
	tc := tlsBase()
	tc.Certificates = []tls.Certificate{cert}
	ln, err := quic.ListenAddr(o.Bind, tc, quicConfig())
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.Bind, err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	if o.ReadyFile != "" {
		if err := writeFileAtomic(o.ReadyFile, []byte(addr+"\n")); err != nil {
			return fmt.Errorf("write the ready file: %w", err)
		}
	}
	fmt.Fprintf(o.Stdout, "READY %s\n", addr)
	return acceptLoop(ctx, ln, &o)
}

func acceptLoop(ctx context.Context, ln *quic.Listener, o *ServeOptions) error {
	for {
		conn, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil && o.Once {
				return errors.New("stopped before a connection arrived (--once)")
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		rec, err := handle(ctx, conn, o)
		if err == nil {
			fmt.Fprintf(o.Stdout, "RECEIVED %d %d\n", rec.EntityID, rec.Length)
		} else {
			o.Log.Warn("connection refused", "remote", conn.RemoteAddr().String(), "code", wire.CodeOf(err).String(), "err", err)
		}
		if o.Once {
			return err
		}
	}
}

// handle runs one connection's conversation; on a refusal it closes the
// connection with the refusal's code. After a complete conversation it
// gives the client up to 5 s to close, as the reference does.
func handle(ctx context.Context, conn *quic.Conn, o *ServeOptions) (Received, error) {
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// a timeout or shutdown closes the connection, which unblocks every
	// read and write of the conversation
	expired := perr(wire.CodeInternalError, "the conversation did not end within %v (--timeout), or the server is shutting down", o.Timeout)
	stop := context.AfterFunc(cctx, func() { closeWith(conn, expired) })
	defer stop()
	sc := &serverConn{conn: conn, o: o}
	rec, err := sc.run(cctx)
	if err != nil && cctx.Err() != nil {
		err = expired
	}
	if err != nil {
		closeWith(conn, err)
		return rec, err
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-conn.Context().Done():
	case <-t.C:
	case <-cctx.Done():
	}
	_ = conn.CloseWithError(quic.ApplicationErrorCode(wire.CodeNoError), "complete")
	return rec, nil
}

type serverConn struct {
	conn *quic.Conn
	o    *ServeOptions
	c    *control
}

func (sc *serverConn) run(ctx context.Context) (Received, error) {
	ctl, err := sc.conn.AcceptStream(ctx)
	if err != nil {
		return Received{}, perr(wire.CodeFrameError, "no stream 0 from the client: %v", err)
	}
	sc.c = newControl(ctl)
	if err := sc.capabilities(); err != nil {
		return Received{}, err
	}
	id, err := sc.pending()
	if err != nil {
		return Received{}, err
	}
	rec, tmp, err := sc.receive(ctx, id)
	if err != nil {
		return rec, err
	}
	if err := sc.c.writeStatus(wire.StatusProcessing, id); err != nil {
		os.Remove(tmp)
		return rec, err
	}
	if err := commit(sc.o.OutputDir, tmp, rec); err != nil {
		return rec, wire.Errorf(wire.CodeInternalError, "store entity %d: %v", id, err)
	}
	if err := sc.c.writeStatus(wire.StatusComplete, id); err != nil {
		return rec, err
	}
	return rec, sc.finish(id)
}

// capabilities reads the client's CAPABILITIES and answers with the
// negotiated set, then a heartbeat (steps 1 and 2).
func (sc *serverConn) capabilities() error {
	f, err := sc.c.next("CAPABILITIES")
	if err != nil {
		return err
	}
	if f.Type != wire.FrameCapabilities {
		return perr(wire.CodeFrameError, "first frame must be CAPABILITIES, got 0x%02X", byte(f.Type))
	}
	peer, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCapabilities(f.Body)
	if err != nil {
		return err
	}
	if err := wire.ValidateCapabilities(peer); err != nil {
		return err
	}
	if err := sc.c.writeCapabilities(negotiated(peer)); err != nil {
		return err
	}
	return sc.c.writeHeartbeat()
}

// pending reads the entity announcement: STATUS PENDING(id).
func (sc *serverConn) pending() (uint32, error) {
	s, err := sc.c.status("STATUS PENDING")
	if err != nil {
		return 0, err
	}
	if s.Status != wire.StatusPending || !validEntityID(s.EntityID) {
		return 0, perr(wire.CodeEntityInvalid, "the first entity status must be PENDING for an entity 1..%d, got %s for %d", uint32(maxEntityID), s.Status, s.EntityID)
	}
	return s.EntityID, nil
}

// receive reads the entity stream into a temporary file in the output
// directory and verifies it whole (header, payload-length, checksum); it
// returns the temporary file's path. Nothing is allocated from a length
// the client sent: the header is read in a bounded buffer, the payload
// copied in fixed chunks, and a payload-length above MaxPayload is refused
// before the payload is read.
func (sc *serverConn) receive(ctx context.Context, id uint32) (Received, string, error) {
	us, err := sc.conn.AcceptUniStream(ctx)
	if err != nil {
		return Received{}, "", perr(wire.CodeFrameError, "no entity stream for entity %d: %v", id, err)
	}
	h, err := wire.ReadEntityHeader(us, wire.CodecFor(wire.FormatCBOR), maxEntityHeader)
	if err != nil {
		return Received{}, "", refuseStream(us, streamErr(err))
	}
	rec := Received{EntityID: h.EntityID, ParentID: h.ParentID}
	if err := sc.checkHeader(h, id); err != nil {
		return rec, "", refuseStream(us, err)
	}
	tmp, err := os.CreateTemp(sc.o.OutputDir, "."+strconv.FormatUint(uint64(id), 10)+".bin.*.partial")
	if err != nil {
		return rec, "", wire.Errorf(wire.CodeInternalError, "create a file for entity %d: %v", id, err)
	}
	n, err := io.Copy(tmp, wire.NewPayloadReader(us, h))
	if err == nil {
		err = tmp.Chmod(0o644) // CreateTemp makes 0600; ID.bin is an ordinary output file
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return rec, "", refuseStream(us, streamErr(err))
	}
	rec.Length = n
	return rec, tmp.Name(), nil
}

// checkHeader applies what the codec leaves to the conversation: the
// entity is the one announced, its IDs are not reserved, it is in the
// root scope, and its payload fits MaxPayload.
func (sc *serverConn) checkHeader(h *wire.EntityHeader, id uint32) error {
	switch {
	case h.EntityID != id:
		return perr(wire.CodeEntityInvalid, "PENDING announced entity %d, the entity stream carries %d", id, h.EntityID)
	case !validEntityID(h.EntityID):
		return perr(wire.CodeEntityInvalid, "entity-id %d is reserved", h.EntityID)
	case h.ParentID != nil && !validEntityID(*h.ParentID):
		return perr(wire.CodeEntityInvalid, "parent-id %d is reserved", *h.ParentID)
	case h.ScopeID != nil && *h.ScopeID != 0:
		return perr(wire.CodeLayerUnsupported, "scope-id %d needs Layer 1, which was not negotiated", *h.ScopeID)
	case h.PayloadLength > uint64(sc.o.MaxPayload):
		return perr(wire.CodeEntityTooLarge, "payload-length %d exceeds the limit %d (--max-payload)", h.PayloadLength, sc.o.MaxPayload)
	}
	return nil
}

// streamErr keeps a codec refusal's code; a transport failure while the
// entity stream is read is PIPESTREAM_FRAME_ERROR, as in the reference.
func streamErr(err error) error {
	var we *wire.Error
	if errors.As(err, &we) {
		return err
	}
	return perr(wire.CodeFrameError, "entity stream: %v", err)
}

// refuseStream stops the entity stream with err's code and returns err.
func refuseStream(us *quic.ReceiveStream, err error) error {
	us.CancelRead(quic.StreamErrorCode(wire.CodeOf(err)))
	return err
}

// finish runs the conversation's tail after COMPLETE: an optional
// CHECKPOINT (acknowledged once satisfied), an optional connection-level
// cursor update, and GOAWAY, echoed with the same Last Entity ID; then
// stream 0 is finished. A client that ends stream 0 or closes the
// connection with 0x00 instead ends it gracefully too.
func (sc *serverConn) finish(id uint32) error {
	next := nextEntityID(id)
	sc.c.eofOK = true
	for {
		f, err := sc.c.next("CHECKPOINT, cursor update or GOAWAY")
		if err != nil {
			return gracefulEnd(err)
		}
		switch f.Type {
		case wire.FrameCheckpoint:
			err = sc.checkpoint(f.Body, next)
		case wire.FrameStatus:
			err = cursorUpdate(&f.Status, next)
		case wire.FrameGoAway:
			return sc.goaway(f.GoAway.LastEntityID, id)
		default:
			err = perr(wire.CodeFrameError, "unexpected frame 0x%02X after COMPLETE", byte(f.Type))
		}
		if err != nil {
			return err
		}
	}
}

// gracefulEnd maps the end of stream 0 or a 0x00 close by the client to
// success.
func gracefulEnd(err error) error {
	if err == io.EOF || closedByPeerWithNoError(err) {
		return nil
	}
	return err
}

// checkpoint acknowledges a CHECKPOINT (flags 1, the other members
// echoed) when it is satisfied: every entity before checkpoint-entity-id
// is resolved, which holds for any ID up to next (the connection's one
// entity is COMPLETE). A later ID could never be satisfied on this
// connection (0x05, as in the reference).
func (sc *serverConn) checkpoint(body []byte, next uint32) error {
	cp, err := wire.CodecFor(wire.FormatCBOR).UnmarshalCheckpoint(body)
	if err != nil {
		return err
	}
	switch {
	case cp.ScopeID != nil && *cp.ScopeID != 0:
		return perr(wire.CodeLayerUnsupported, "CHECKPOINT scope-id %d needs Layer 1", *cp.ScopeID)
	case cp.Flags != nil && *cp.Flags != 0:
		return perr(wire.CodeEntityInvalid, "CHECKPOINT request with flags %d, want 0", *cp.Flags)
	case cp.CheckpointEntityID != next && !wire.IsBefore(cp.CheckpointEntityID, next):
		return perr(wire.CodeEntityInvalid, "checkpoint barrier is not satisfied: checkpoint-entity-id %d is after %d", cp.CheckpointEntityID, next)
	}
	ack := *cp
	one := uint64(checkpointAck)
	ack.Flags = &one
	return sc.c.writeCheckpoint(&ack)
}

// cursorUpdate accepts the connection-level cursor update (up to next).
func cursorUpdate(s *wire.StatusFrame, next uint32) error {
	if s.Status != wire.StatusUnspecified || !s.HasCursor {
		return perr(wire.CodeEntityInvalid, "unexpected STATUS %s for entity %d after COMPLETE; want a connection-level cursor update", s.Status, s.EntityID)
	}
	if s.Cursor != next && !wire.IsBefore(s.Cursor, next) {
		return perr(wire.CodeEntityInvalid, "cursor update to %d passes entities never sent (next is %d)", s.Cursor, next)
	}
	return nil
}

// goaway echoes the client's GOAWAY, which must name the connection's
// entity, and finishes stream 0.
func (sc *serverConn) goaway(last, id uint32) error {
	if last != id {
		return perr(wire.CodeFrameError, "GOAWAY names entity %d, want %d", last, id)
	}
	if err := sc.c.writeGoAway(id); err != nil {
		return err
	}
	return sc.c.s.Close()
}

// commit moves the verified payload to ID.bin, after writing ID.parent
// ("PARENT\n") when the entity has a parent-id (or removing a stale one
// when it has none), so that ID.bin appears last and whole.
func commit(dir, tmp string, rec Received) error {
	base := filepath.Join(dir, strconv.FormatUint(uint64(rec.EntityID), 10))
	var err error
	if rec.ParentID != nil {
		err = writeFileAtomic(base+".parent", []byte(strconv.FormatUint(uint64(*rec.ParentID), 10)+"\n"))
	} else if rerr := os.Remove(base + ".parent"); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = rerr
	}
	if err == nil {
		err = os.Rename(tmp, base+".bin")
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// writeFileAtomic writes b to path through a temporary file in the same
// directory and a rename, so a reader sees the whole content or nothing.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
