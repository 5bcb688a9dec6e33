package quicpeer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

func headerScope(h *wire.EntityHeader) uint32 { return scopeOf(h.ScopeID) }

func headerParent(h *wire.EntityHeader) uint32 {
	if h.ParentID == nil {
		return 0
	}
	return *h.ParentID
}

// SetPolicy records the completion policy that governs root entity id and,
// through their parent-id, its children, before any of their streams are
// sent (a dehydrated document's root header travels last). The session
// needs it to know whether a FAILED entity may still be RETRYING (Layer 2)
// and so whether FAILED resolves its ID (Section 9.1). A header sent with
// SendEntity that carries a completion-policy registers it too.
func (s *Session) SetPolicy(id uint32, p *wire.CompletionPolicy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tr.register(0, id, 0, max(budgetOf(p), 0))
}

// SendEntity opens a unidirectional stream, writes the entity header and
// streams payload until EOF through a pooled buffer, then closes the stream
// (FIN). h.PayloadLength must be the exact payload size; h.Checksum, if
// set, must be its SHA-256 (the receiver verifies it; the sender does not).
// A short or long payload resets the stream with 0x05; cancelling ctx
// resets it with 0x00. Whenever this side aborts the stream (or refuses
// the entity because of the peer's GOAWAY: ErrGoAway) the session reports
// FAILED for the entity on stream 0; when the receiver stops the stream,
// the error carries its code (wire.CodeOf) and the receiver reports the
// status. On the client, root-scope IDs must come from AssignID. A header
// with a completion-policy registers it as SetPolicy does.
func (s *Session) SendEntity(ctx context.Context, h *wire.EntityHeader, payload io.Reader) error {
	if h == nil {
		return localErr(wire.CodeEntityInvalid, "nil entity header")
	}
	scope, id := headerScope(h), h.EntityID
	if scope != 0 && !s.negotiated.Layer1 {
		return localErr(wire.CodeLayerUnsupported, "entity %d in scope %d needs Layer 1, which was not negotiated", id, scope)
	}
	if s.framing.Load() == framingIs04 && !layer0Header(h) {
		return localErr(wire.CodeEntityInvalid, "entity %d: a draft-04 entity header has only entity-id, parent-id, layer, content-type, payload-length and checksum (no metadata, chunk-info, scope-id or completion-policy)", id)
	}
	s.mu.Lock()
	switch {
	case s.ctx.Err() != nil:
		s.mu.Unlock()
		return s.endedErr()
	case scope == 0 && s.goawayRecv && after(id, s.recvLast):
		last := s.recvLast
		s.mu.Unlock()
		// The entity will never be sent on this session: FAILED resolves
		// its ID on both ends so that both can drain.
		s.failEntity(scope, id, "above the peer's GOAWAY")
		return fmt.Errorf("%w: entity %d is above the peer's GOAWAY Last Entity ID %d", ErrGoAway, id, last)
	case scope == 0 && s.role == RoleClient && !s.tr.ids.InFlight(id):
		s.mu.Unlock()
		return localErr(wire.CodeEntityInvalid, "root entity %d was not assigned by AssignID (or is already resolved)", id)
	}
	s.mu.Unlock()
	if err := s.announceDraft04(h); err != nil {
		return err
	}
	s.mu.Lock()
	err := s.tr.register(scope, id, headerParent(h), budgetOf(h.CompletionPolicy))
	s.mu.Unlock()
	if err != nil {
		return err
	}
	st, err := s.conn.OpenUniStreamSync(ctx)
	if err != nil {
		s.failEntity(scope, id, "entity stream not opened")
		return fmt.Errorf("quicpeer: open entity stream for %d: %w", id, err)
	}
	err = s.writeEntity(ctx, st, h, payload)
	if err != nil {
		// When this endpoint aborted the stream it reports FAILED (the
		// receiver may not have seen the header, Section 5.3); when the
		// receiver stopped it, the receiver reports the status.
		if _, remote, ok := streamAbort(err); !ok || !remote {
			s.failEntity(scope, id, err.Error())
		}
	}
	return err
}

// writeEntity writes header, payload and FIN on st; on failure the stream
// is reset (or was stopped by the peer).
func (s *Session) writeEntity(ctx context.Context, st sendStream, h *wire.EntityHeader, payload io.Reader) error {
	id := h.EntityID
	// An in-memory payload (*bytes.Reader) goes out with the header: one
	// stream write for a small entity instead of two, so the connection
	// packs them into one packet with one wake-up. Any other reader may
	// block (a file, a spool, a caller's stream, one that signals its
	// first Read): the header goes first, as soon as the stream is open,
	// so the receiver's header timeout never waits on the payload.
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf, err := wire.AppendEntityHeader((*bp)[:0], s.codec, h)
	if err != nil {
		st.CancelWrite(wire.CodeOf(err))
		return s.sendErr(ctx, id, err)
	}
	if done, err := s.writeSmallEntity(ctx, st, h, buf, payload); done {
		return err
	}
	if ctx.Done() != nil { // a context that can never end needs no watcher
		stop := context.AfterFunc(ctx, func() { st.CancelWrite(wire.CodeNoError) })
		defer stop()
	}
	head := len(buf) // header octets not written yet
	if _, inMemory := payload.(*bytes.Reader); !inMemory {
		if _, err := st.Write(buf); err != nil {
			return s.sendErr(ctx, id, err)
		}
		buf, head = (*bp)[:0], 0
	}
	var sent uint64
	for {
		if cap(buf)-head < minPayloadRead { // a header that (almost) fills the buffer goes alone
			if _, err := st.Write(buf[:head]); err != nil {
				return s.sendErr(ctx, id, err)
			}
			buf, head = (*bp)[:0], 0
		}
		n, rerr := payload.Read(buf[head:cap(buf)])
		if n > 0 {
			sent += uint64(n)
			if sent > h.PayloadLength {
				st.CancelWrite(wire.CodeEntityInvalid)
				return localErr(wire.CodeEntityInvalid, "entity %d: payload is longer than payload-length %d", id, h.PayloadLength)
			}
			if _, err := st.Write(buf[:head+n]); err != nil {
				return s.sendErr(ctx, id, err)
			}
			head = 0
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			st.CancelWrite(wire.CodeInternalError)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("quicpeer: entity %d: reading payload: %w", id, rerr)
		}
	}
	if head > 0 && sent == h.PayloadLength { // an empty in-memory payload: the header alone
		if _, err := st.Write(buf[:head]); err != nil {
			return s.sendErr(ctx, id, err)
		}
	}
	if ctx.Err() != nil { // cancelled while the payload was read: the stream is reset
		return ctx.Err()
	}
	if sent != h.PayloadLength {
		st.CancelWrite(wire.CodeEntityInvalid)
		return localErr(wire.CodeEntityInvalid, "entity %d: payload is %d octets, payload-length says %d", id, sent, h.PayloadLength)
	}
	if err := st.Close(); err != nil {
		return s.sendErr(ctx, id, err)
	}
	return nil
}

// smallEntityBytes bounds the entity frames writeSmallEntity queues
// whole: quic-go's pooled STREAM frame holds a packet's worth (1452
// octets); a longer queued write would be copied into a frame of its own.
const smallEntityBytes = 1452

// writeSmallEntity sends an entity whose header (buf) and in-memory
// payload fit one packet without waiting: queued whole with the FIN
// (TryWriteAll, Close), nothing can block, so no watcher of ctx is
// registered (a cancel can only come before the queueing, which is
// checked). done is false when it did not apply (another reader, a
// payload that does not match payload-length, a larger entity, no credit
// for it now): nothing was written and the caller's path takes over.
func (s *Session) writeSmallEntity(ctx context.Context, st sendStream, h *wire.EntityHeader, buf []byte, payload io.Reader) (done bool, err error) {
	br, ok := payload.(*bytes.Reader)
	if !ok || uint64(br.Len()) != h.PayloadLength || len(buf)+br.Len() > smallEntityBytes {
		return false, nil
	}
	head, n := len(buf), br.Len()
	off := br.Size() - int64(n)
	if _, err := br.ReadAt(buf[head:head+n], off); err != nil && n > 0 {
		return false, nil
	}
	if ctx.Err() != nil {
		st.CancelWrite(wire.CodeNoError)
		return true, ctx.Err()
	}
	if err := st.TryWriteAll(buf[:head+n]); err != nil {
		if errors.Is(err, errWouldBlock) {
			return false, nil
		}
		return true, s.sendErr(ctx, h.EntityID, err)
	}
	_, _ = br.Seek(0, io.SeekEnd) // consumed, as the streaming path leaves it
	if err := st.Close(); err != nil {
		return true, s.sendErr(ctx, h.EntityID, err)
	}
	return true, nil
}

// sendErr explains why writing an entity stream failed: the caller's ctx,
// the peer stopping the stream (its code), or the connection.
func (s *Session) sendErr(ctx context.Context, id uint32, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if code, remote, ok := streamAbort(err); ok && remote {
		return &peerStopped{pe: &wire.Error{Code: code, Msg: fmt.Sprintf("entity %d: peer stopped the entity stream", id)}, cause: err}
	}
	if s.conn.Context().Err() != nil {
		if e := s.Err(); e != nil {
			return e
		}
	}
	return fmt.Errorf("quicpeer: entity %d: %w", id, err)
}

// peerStopped is the error of an entity stream the receiver stopped: a
// *wire.Error with the receiver's code that also unwraps to the
// *quic.StreamError.
type peerStopped struct {
	pe    *wire.Error
	cause error
}

func (e *peerStopped) Error() string   { return e.pe.Error() }
func (e *peerStopped) Unwrap() []error { return []error{e.pe, e.cause} }

// acceptLoop accepts entity streams once the capability exchange is done
// and hands each to a worker (workers.go).
func (s *Session) acceptLoop() {
	defer s.loops.Done()
	w := newEntityWorkers(s.handleIncoming)
	defer w.close()
	for {
		rs, err := s.conn.AcceptUniStream(s.ctx)
		if err != nil {
			return
		}
		w.dispatch(rs)
	}
}

// handleIncoming reads an entity header (negotiated format, header cap,
// Limits.HeaderTimeout), applies the stream-level rules and hands the
// entity to the Handler.
func (s *Session) handleIncoming(rs receiveStream) {
	_ = rs.SetReadDeadline(time.Now().Add(s.cfg.Limits.HeaderTimeout))
	h, err := wire.ReadEntityHeader(rs, s.codec, s.cfg.Limits.MaxHeaderBytes)
	if err != nil {
		var pe *wire.Error
		switch _, _, reset := streamAbort(err); {
		case reset:
			// reset before the header: nothing to report
		case errors.Is(err, os.ErrDeadlineExceeded):
			rs.CancelRead(wire.CodeEntityInvalid)
			s.log.Warn("rejected entity stream", "stream", rs.StreamID(), "err",
				fmt.Sprintf("entity header incomplete after %v (Limits.HeaderTimeout)", s.cfg.Limits.HeaderTimeout))
		case errors.As(err, &pe):
			rs.CancelRead(pe.Code)
			s.log.Warn("rejected entity stream", "stream", rs.StreamID(), "err", err)
		default:
			rs.CancelRead(wire.CodeNoError)
		}
		return
	}
	_ = rs.SetReadDeadline(time.Time{})
	scope, id := headerScope(h), h.EntityID
	if scope != 0 && !s.negotiated.Layer1 {
		s.closeFor(localErr(wire.CodeLayerUnsupported, "entity %d in scope %d needs Layer 1, which was not negotiated", id, scope))
		return
	}
	if h.PayloadLength > s.cfg.Limits.MaxPayloadBytes {
		s.reject(rs, scope, id, localErr(wire.CodeEntityTooLarge, "entity %d: payload-length %d exceeds the limit %d", id, h.PayloadLength, s.cfg.Limits.MaxPayloadBytes))
		return
	}
	s.mu.Lock()
	if scope == 0 && s.goawaySent && after(id, s.sentLast) {
		last := s.sentLast
		s.mu.Unlock()
		s.reject(rs, scope, id, localErr(wire.CodeEntityInvalid, "entity %d is above our GOAWAY Last Entity ID %d", id, last))
		return
	}
	if scope == 0 && s.role == RoleServer && (!s.seenRoot || after(id, s.maxSeenRoot)) {
		s.seenRoot, s.maxSeenRoot = true, id
	}
	if scope == 0 && s.role == RoleServer && s.framing.Load() == framingIs04 {
		s.tr.anchorPeerCursor(id)
	}
	if s.untrackedResultLocked(h) {
		// A peer without the profile may return a result as a new entity
		// of its own numbering whose parent-id names ours (docs/profile.md
		// 9.2): it is delivered, but it is no entity of the client's ID
		// space, so it is neither tracked nor counted in the window.
		err = nil
	} else {
		err = s.tr.register(scope, id, headerParent(h), budgetOf(h.CompletionPolicy))
	}
	if err == nil && scope == 0 {
		s.noteWindowLocked()
	}
	s.mu.Unlock()
	if err != nil {
		s.reject(rs, scope, id, err)
		return
	}
	// One allocation for the entity, its payload reader and the hashing
	// reader under it.
	box := &incomingBox{in: incomingPayload{s: s, rs: rs, scope: scope, id: id}}
	in := &box.in
	in.pr.Init(rs, h)
	box.e = IncomingEntity{Header: h, Payload: in, Abort: in.abort}
	s.handler.HandleEntity(s, &box.e)
	in.finish()
}

// reject aborts an entity stream with err's code and reports FAILED for
// it. A rejected entity is not tracked (it may be what a limit refused), so
// the FAILED is written without a state check.
func (s *Session) reject(rs receiveStream, scope, id uint32, err error) {
	rs.CancelRead(wire.CodeOf(err))
	s.log.Warn("rejected entity", "entity", id, "scope", scope, "err", err)
	s.mu.Lock()
	_, tracked := s.tr.scopes[scope][id]
	f := wire.StatusFrame{Status: wire.StatusFailed, EntityID: id, ScopeID: scope, Depth: s.tr.depthOf(scope)}
	s.mu.Unlock()
	if tracked {
		s.failEntity(scope, id, err.Error())
		return
	}
	if s.negotiated.Layer1 || (scope == 0 && f.Depth == 0) {
		s.wmu.Lock()
		s.wbuf = f.Append(s.wbuf[:0])
		_ = s.writeLocked()
		s.wmu.Unlock()
	}
}

// incomingBox holds an IncomingEntity and its Payload in one allocation.
type incomingBox struct {
	in incomingPayload
	e  IncomingEntity
}

// incomingPayload is IncomingEntity.Payload: the wire PayloadReader plus
// the Transport Error Mapping (Section 5.3) for whatever Read reports.
type incomingPayload struct {
	s         *Session
	rs        receiveStream
	pr        wire.PayloadReader
	scope, id uint32
	mu        sync.Mutex
	ended     bool // EOF seen, or the stream was aborted
}

// Read reads payload octets. A checksum mismatch aborts the stream with
// 0x04 and a length mismatch with 0x05 (STOP_SENDING), and the session
// reports FAILED on stream 0; so does a stream the sender reset.
func (p *incomingPayload) Read(b []byte) (int, error) {
	n, err := p.pr.Read(b)
	if err == nil {
		return n, nil
	}
	p.mu.Lock()
	first := !p.ended
	p.ended = true
	p.mu.Unlock()
	if err == io.EOF || !first {
		return n, err
	}
	var pe *wire.Error
	switch {
	case errors.As(err, &pe):
		p.rs.CancelRead(pe.Code)
		p.s.failEntity(p.scope, p.id, err.Error())
	default:
		if code, remote, ok := streamAbort(err); ok && remote {
			p.s.failEntity(p.scope, p.id, "sender reset the entity stream with "+code.String())
		}
	}
	return n, err
}

// abort stops the stream with code (STOP_SENDING). The caller reports the
// entity's status itself.
func (p *incomingPayload) abort(code wire.ErrorCode) {
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	p.rs.CancelRead(code)
}

// finish releases a stream the Handler left unread.
func (p *incomingPayload) finish() {
	p.mu.Lock()
	ended := p.ended
	p.ended = true
	p.mu.Unlock()
	if !ended {
		p.rs.CancelRead(wire.CodeNoError)
	}
}
