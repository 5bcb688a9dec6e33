package quicpeer_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func window(n uint64) pairOpts {
	return func(c, s *quicpeer.Config) { c.Offer.MaxWindowSize = u64(n) }
}

// complete sends PROCESSING then COMPLETE for id from s.
func complete(t *testing.T, s *quicpeer.Session, id uint32) {
	t.Helper()
	for _, st := range []wire.Status{wire.StatusProcessing, wire.StatusComplete} {
		if err := s.SendStatus(status(st, id)); err != nil {
			t.Fatalf("SendStatus(%v, %d): %v", st, id, err)
		}
	}
}

// Section 9.1: with a window of 4 the 5th AssignID waits until a terminal
// status resolves the oldest ID; the client then sends a cursor update
// STATUS(0xFFFFFFFF, UNSPECIFIED, C=1) that the server applies.
func TestBackpressureAndCursorUpdate(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m, window(4))
		ctx := context.Background()
		for want := uint32(1); want <= 4; want++ {
			if id, err := p.client.AssignID(ctx); err != nil || id != want {
				t.Fatalf("AssignID = %d, %v; want %d", id, err, want)
			}
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := p.client.AssignID(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("5th AssignID with a full window: %v, want to block until ctx ends", err)
		}
		got := make(chan uint32, 1)
		go func() {
			id, err := p.client.AssignID(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- id
		}()
		// Resolving 2 does not move the cursor (1 is still in flight).
		complete(t, p.server, 2)
		select {
		case id := <-got:
			t.Fatalf("AssignID returned %d although the cursor did not move", id)
		case <-time.After(100 * time.Millisecond):
		}
		complete(t, p.server, 1)
		if id := recv(t, got, "unblocked AssignID"); id != 5 {
			t.Fatalf("AssignID = %d, want 5", id)
		}
		// The server receives the cursor update (cursor 3: 1 and 2 resolved).
		deadline := time.After(waitFor)
		for {
			select {
			case f := <-p.sr.statuses:
				if f.EntityID != wire.ConnectionEntity {
					continue
				}
				if !f.HasCursor || f.Status != wire.StatusUnspecified {
					t.Fatalf("connection-level frame %+v is not a cursor update", f)
				}
				if f.Cursor == 3 {
					goto applied
				}
			case <-deadline:
				t.Fatal("no cursor update reached the server")
			}
		}
	applied:
		// Applied: the server forgot entity 1; a status for it is refused
		// as behind the cursor.
		err = p.server.SendStatus(status(wire.StatusProcessing, 1))
		if err == nil || !strings.Contains(err.Error(), "behind the cursor") {
			t.Fatalf("SendStatus for an ID behind the cursor: %v", err)
		}
	})
}

// Section 9.3: Checkpoint is acknowledged once every entity before
// checkpoint_entity_id is terminal, and times out otherwise.
func TestCheckpointSatisfiedAndTimeout(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m)
		ctx := context.Background()
		for range 3 {
			p.client.AssignID(ctx)
		}
		errc := make(chan error, 1)
		go func() {
			errc <- p.client.Checkpoint(ctx, &wire.CheckpointFrame{CheckpointID: "cp-1", SequenceNumber: 1, CheckpointEntityID: 3})
		}()
		req := recv(t, p.sr.checkpoints, "checkpoint request at the server")
		if req.CheckpointID != "cp-1" || req.CheckpointEntityID != 3 || req.Flags == nil || *req.Flags != 0 {
			t.Fatalf("request %+v", req)
		}
		complete(t, p.server, 1)
		select {
		case err := <-errc:
			t.Fatalf("checkpoint returned %v with entity 2 still in flight", err)
		case <-time.After(100 * time.Millisecond):
		}
		complete(t, p.server, 2)
		if err := recv(t, errc, "Checkpoint"); err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
		ack := recv(t, p.cr.checkpoints, "checkpoint ack at the client")
		if ack.Flags == nil || *ack.Flags != 1 || ack.CheckpointID != "cp-1" {
			t.Fatalf("ack %+v, want flags=1", ack)
		}
		// Entity 3 never completes: the checkpoint on 4 times out.
		p.client.AssignID(ctx)
		err := p.client.Checkpoint(ctx, &wire.CheckpointFrame{CheckpointID: "cp-2", SequenceNumber: 2, CheckpointEntityID: 4, TimeoutMs: u64(200)})
		if !errors.Is(err, quicpeer.ErrCheckpointTimeout) {
			t.Fatalf("Checkpoint: %v, want ErrCheckpointTimeout", err)
		}
	})
}

// Section 6.5: the server's GOAWAY stops new IDs at the client, in-flight
// entities drain, then the connection closes with PIPESTREAM_NO_ERROR.
func TestGoAwayDrain(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m)
		ctx := context.Background()
		id, _ := p.client.AssignID(ctx)
		if err := p.client.SendEntity(ctx, header(id, 10, 1), newGen(10, 1)); err != nil {
			t.Fatal(err)
		}
		recv(t, p.sr.entities, "entity")
		late, _ := p.client.AssignID(ctx) // assigned, not yet sent when GOAWAY comes
		gerr := make(chan error, 1)
		go func() { gerr <- p.server.GoAway(ctx) }()
		if g := recv(t, p.cr.goaways, "GOAWAY at the client"); g.LastEntityID != id {
			t.Fatalf("GOAWAY Last %d, want %d", g.LastEntityID, id)
		}
		if _, err := p.client.AssignID(ctx); !errors.Is(err, quicpeer.ErrGoAway) {
			t.Fatalf("AssignID after GOAWAY: %v, want ErrGoAway", err)
		}
		if err := p.client.SendEntity(ctx, header(late, 1, 1), newGen(1, 1)); !errors.Is(err, quicpeer.ErrGoAway) {
			t.Fatalf("SendEntity above GOAWAY Last: %v, want ErrGoAway", err)
		}
		if f := nextStatus(t, p.sr); f.EntityID != late || f.Status != wire.StatusFailed {
			t.Fatalf("server got %+v, want FAILED for the unsent entity %d", f, late)
		}
		select {
		case err := <-gerr:
			t.Fatalf("GoAway returned %v before the entity was terminal", err)
		case <-time.After(100 * time.Millisecond):
		}
		complete(t, p.server, id)
		if err := recv(t, gerr, "GoAway"); err != nil {
			t.Fatalf("GoAway: %v", err)
		}
		if err := recv(t, p.cr.closed, "client HandleClose"); err != nil {
			t.Fatalf("client HandleClose(%v), want nil (graceful)", err)
		}
		if err := recv(t, p.sr.closed, "server HandleClose"); err != nil {
			t.Fatalf("server HandleClose(%v), want nil", err)
		}
	})
}

// The client's own GoAway (gateway shutdown) drains its window.
func TestClientGoAway(t *testing.T) {
	p := newPair(t, cborMode)
	ctx := context.Background()
	id, _ := p.client.AssignID(ctx)
	gerr := make(chan error, 1)
	go func() { gerr <- p.client.GoAway(ctx) }()
	if g := recv(t, p.sr.goaways, "GOAWAY at the server"); g.LastEntityID != id {
		t.Fatalf("GOAWAY Last %d, want %d", g.LastEntityID, id)
	}
	complete(t, p.server, id)
	if err := recv(t, gerr, "GoAway"); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, p.sr.closed, "server HandleClose"); err != nil {
		t.Fatalf("server HandleClose(%v)", err)
	}
}

// Layer 1/2 frames travel intact: SCOPE_DIGEST, BARRIER, STATUS with the
// Yield and Claim Check extensions; scope 0 digests are refused locally
// with 0x09; Layer 2 statuses are refused locally without Layer 2.
func TestLayer1And2Frames(t *testing.T) {
	run(t, allModes, func(t *testing.T, m mode) {
		p := newPair(t, m, layers(true, true))
		ctx := context.Background()
		id, _ := p.client.AssignID(ctx)
		if err := p.server.SendScopeDigest(wire.ScopeDigestFrame{ScopeID: 0}); codeOf(err) != wire.CodeScopeInvalid {
			t.Fatalf("SCOPE_DIGEST scope 0: %v, want 0x09", err)
		}
		if err := p.server.SendBarrier(wire.BarrierFrame{ScopeID: 0}); codeOf(err) != wire.CodeScopeInvalid {
			t.Fatalf("BARRIER scope 0: %v, want 0x09", err)
		}
		if err := p.server.SendStatus(status(wire.StatusProcessing, id)); err != nil {
			t.Fatal(err)
		}
		cext, dg := sendLayer1And2Frames(t, p.server, id)
		checkLayer1And2Frames(t, p.cr, id, cext, dg)
	})
	p := newPair(t, cborMode)
	id, _ := p.client.AssignID(context.Background())
	if err := p.client.SendStatus(status(wire.StatusSkipped, id)); codeOf(err) != wire.CodeLayerUnsupported {
		t.Fatalf("SKIPPED without Layer 2: %v, want 0x0C", err)
	}
	if err := p.client.SendScopeDigest(wire.ScopeDigestFrame{ScopeID: 3}); codeOf(err) != wire.CodeLayerUnsupported {
		t.Fatalf("SCOPE_DIGEST without Layer 1: %v, want 0x0C", err)
	}
}

// sendLayer1And2Frames sends, after a PROCESSING for root entity id, a
// YIELDED and a DEFERRED status with their extensions, a nested scope 7 at
// depth 1 with its digest, and a barrier releasing it; it returns the claim
// check extension and the digest sent.
func sendLayer1And2Frames(t *testing.T, s *quicpeer.Session, id uint32) (cext []byte, dg wire.ScopeDigestFrame) {
	t.Helper()
	yext := wire.AppendYieldExt(nil, wire.YieldExtension{Reason: 1, Token: []byte("opaque continuation")})
	if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusYielded, EntityID: id, HasExt: true, Ext: yext}); err != nil {
		t.Fatal(err)
	}
	cext = wire.AppendClaimCheckExt(nil, wire.ClaimCheckExtension{ClaimID: 42, ExpiryMicros: 1_800_000_000_000_000})
	if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusDeferred, EntityID: id, HasExt: true, Ext: cext}); err != nil {
		t.Fatal(err)
	}
	// A nested scope 7 at depth 1, then its digest and a barrier.
	if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusProcessing, EntityID: 1, ScopeID: 7, Depth: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.SendStatus(wire.StatusFrame{Status: wire.StatusComplete, EntityID: 1, ScopeID: 7, Depth: 1}); err != nil {
		t.Fatal(err)
	}
	root := wire.MerkleRoot([]wire.Leaf{{EntityID: 1, Status: wire.StatusComplete}})
	dg = wire.ScopeDigestFrame{ScopeID: 7, Processed: 1, Succeeded: 1, MerkleRoot: root}
	if err := s.SendScopeDigest(dg); err != nil {
		t.Fatal(err)
	}
	if err := s.SendBarrier(wire.BarrierFrame{Released: true, ScopeID: 7, ParentEntityID: id}); err != nil {
		t.Fatal(err)
	}
	return cext, dg
}

// checkLayer1And2Frames checks that what sendLayer1And2Frames sent arrived
// intact and in order.
func checkLayer1And2Frames(t *testing.T, cr *recorder, id uint32, cext []byte, dg wire.ScopeDigestFrame) {
	t.Helper()
	nextStatus(t, cr) // PROCESSING
	y := nextStatus(t, cr)
	if yy, err := y.Yield(); err != nil || y.Status != wire.StatusYielded || yy.Reason != 1 || string(yy.Token) != "opaque continuation" {
		t.Fatalf("yield %+v %+v %v", y, yy, err)
	}
	d := nextStatus(t, cr)
	if cc, err := d.ClaimCheck(); err != nil || cc.ClaimID != 42 || cc.ExpiryMicros != 1_800_000_000_000_000 || !bytes.Equal(d.Ext, cext) {
		t.Fatalf("claim check %+v %+v %v", d, cc, err)
	}
	if s := nextStatus(t, cr); s.ScopeID != 7 || s.Depth != 1 {
		t.Fatalf("scoped status %+v", s)
	}
	nextStatus(t, cr)
	if got := recv(t, cr.digests, "SCOPE_DIGEST"); got != dg {
		t.Fatalf("digest %+v, want %+v", got, dg)
	}
	if got := recv(t, cr.barriers, "BARRIER"); !got.Released || got.ScopeID != 7 || got.ParentEntityID != id {
		t.Fatalf("barrier %+v", got)
	}
}

// docs/profile.md 3 race rule: a status for an entity this endpoint already
// moved to a terminal state (a cancel crossing a COMPLETE) is ignored and
// not delivered, not a protocol error. A raw client forces the crossing.
func TestCrossingTerminalStatusesAreIgnored(t *testing.T) {
	sr := newRecorder()
	ln, err := quicpeer.Listen("127.0.0.1:0", baseConfig(t, cborMode, sr, true))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw := dialRaw(t, ln.Addr().String(), defaultCaps())
	s, err := ln.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	raw.status(status(wire.StatusProcessing, 1))
	if f := nextStatus(t, sr); f.Status != wire.StatusProcessing {
		t.Fatalf("got %+v", f)
	}
	if err := s.SendStatus(status(wire.StatusFailed, 1)); err != nil { // the server cancels
		t.Fatal(err)
	}
	raw.status(status(wire.StatusComplete, 1)) // crossing COMPLETE from the client
	raw.write(checkpointFrame(t, &wire.CheckpointFrame{CheckpointID: "alive", SequenceNumber: 1, CheckpointEntityID: 2}))
	for {
		f, err := raw.cr.Next()
		if err != nil {
			t.Fatalf("connection died after a crossing status: %v", err)
		}
		if f.Type == wire.FrameCheckpoint {
			break // acknowledged: the session is alive and entity 1 counts as terminal
		}
	}
	select {
	case f := <-sr.statuses:
		t.Fatalf("ignored status was delivered: %+v", f)
	default:
	}
	if err := s.SendStatus(status(wire.StatusProcessing, 1)); codeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("local invalid transition: %v, want an 0x05 error and nothing sent", err)
	}
}

// Section 5.1.4: heartbeats keep stream 0 alive; without them, 3 x
// keepalive of stream-0 silence closes with PIPESTREAM_IDLE_TIMEOUT.
func TestHeartbeatAndIdle(t *testing.T) {
	ka := uint64(100)
	short := func(c, s *quicpeer.Config) { c.Offer.KeepaliveTimeoutMs, s.Offer.KeepaliveTimeoutMs = &ka, &ka }
	p := newPair(t, cborMode, short, func(c, s *quicpeer.Config) { c.Heartbeat, s.Heartbeat = true, true })
	time.Sleep(600 * time.Millisecond) // 6 x keepalive
	if p.client.Err() != nil || p.server.Err() != nil {
		t.Fatalf("heartbeats did not keep the session: %v %v", p.client.Err(), p.server.Err())
	}
	q := newPair(t, cborMode, short, func(c, s *quicpeer.Config) { c.Heartbeat = true })
	if err := recv(t, q.cr.closed, "idle close"); codeOf(err) != wire.CodeIdleTimeout {
		t.Fatalf("client HandleClose(%v), want PIPESTREAM_IDLE_TIMEOUT", err)
	}
	if err := recv(t, q.sr.closed, "idle close at server"); codeOf(err) != wire.CodeIdleTimeout {
		t.Fatalf("server HandleClose(%v), want PIPESTREAM_IDLE_TIMEOUT from the peer", err)
	}
}

// Section 6.2.3 notes, 9.1: FAILED -> RETRYING only while the completion
// policy leaves retries; a FAILED that may retry does not resolve its ID,
// the last FAILED does.
func TestRetryBudget(t *testing.T) {
	p := newPair(t, cborMode, layers(true, true), window(1))
	ctx := context.Background()
	id, _ := p.client.AssignID(ctx)
	retry, one := wire.ActionRetry, uint32(1)
	h := header(id, 3, 1)
	h.CompletionPolicy = &wire.CompletionPolicy{OnFailure: &retry, MaxRetries: &one}
	if err := p.client.SendEntity(ctx, h, newGen(3, 1)); err != nil {
		t.Fatal(err)
	}
	recv(t, p.sr.entities, "entity")
	send := func(sts ...wire.Status) {
		t.Helper()
		for _, st := range sts {
			if err := p.server.SendStatus(status(st, id)); err != nil {
				t.Fatalf("SendStatus(%v): %v", st, err)
			}
			if f := nextStatus(t, p.cr); f.Status != st {
				t.Fatalf("client got %v, want %v", f.Status, st)
			}
		}
	}
	send(wire.StatusProcessing, wire.StatusFailed)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := p.client.AssignID(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AssignID after a FAILED with a retry left: %v, want to wait", err)
	}
	send(wire.StatusRetrying, wire.StatusProcessing, wire.StatusFailed)
	if _, err := p.client.AssignID(ctx); err != nil {
		t.Fatalf("AssignID after the last FAILED: %v", err)
	}
	if err := p.server.SendStatus(status(wire.StatusRetrying, id)); codeOf(err) != wire.CodeEntityInvalid {
		t.Fatalf("RETRYING with no retry left: %v, want 0x05", err)
	}
}
