package adversary_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Claim-check attacks (draft-02 Section 10.6.2, docs/profile.md 6): a
// redemption stream names its claim in pipestream.claim-id. Forged ids are
// PIPESTREAM_CLAIM_NOT_FOUND (0x0B), a replay of a redeemed claim too, an
// expired claim PIPESTREAM_CLAIM_EXPIRED (0x0A). The refusal comes before
// the payload is read, so it shows on a stream the adversary keeps open.

// deferredClaim has a well-behaved session send a document that the fault
// processor defers with a claim valid for ttl; it returns the claim id and
// the entity's payload (what a redemption carries).
func deferredClaim(t *testing.T, tg *target, content string, ttl time.Duration) (uint64, []byte) {
	t.Helper()
	g := dialGood(t, tg)
	md := map[string]string{peer.MetaProcessor: "fault", peer.MetaFault: peer.FaultDefer, peer.MetaClaimTTL: strconv.FormatInt(ttl.Milliseconds(), 10)}
	id := g.send(t, []byte(content), md)
	var f wire.StatusFrame
	g.waitFor(t, "DEFERRED with a claim check", func() bool {
		var ok bool
		f, ok = g.last(id)
		return ok && f.Status == wire.StatusDeferred
	})
	cc, err := f.ClaimCheck()
	if err != nil || cc.ClaimID == 0 {
		t.Fatalf("claim check extension %+v: %v", cc, err)
	}
	return cc.ClaimID, envelope(t, g.sess.Negotiated().Format, id, []byte(content))
}

// redeemOpen starts a redemption stream for claim on r and leaves it open
// (no FIN), so that the peer's STOP_SENDING code is observable.
func redeemOpen(t *testing.T, r *raw, id uint32, claim uint64, payload []byte) wire.ErrorCode {
	t.Helper()
	sum := sha256.Sum256(payload)
	hb := header(t, &wire.EntityHeader{EntityID: id, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: sum[:],
		Metadata: profileMD(map[string]string{peer.MetaClaimID: strconv.FormatUint(claim, 10)})})
	st := r.entityStream(uint32(len(hb)), hb)
	st.Write(payload[:len(payload)/2])
	return stopCode(t, st)
}

func TestClaimForgery(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	// A real claim exists, so the store is not empty.
	real, _ := deferredClaim(t, tg, "genuinely deferred", time.Hour)
	r := dialRaw(t, tg, allLayers())
	var b [8]byte
	for i := range 20 {
		rand.Read(b[:])
		forged := binary.BigEndian.Uint64(b[:])
		if forged == real {
			continue
		}
		id := uint32(i + 1)
		if code := redeemOpen(t, r, id, forged, []byte("forged redemption payload")); code != wire.CodeClaimNotFound {
			t.Fatalf("forged claim %d: stream stopped with %s, want %s", forged, code, wire.CodeClaimNotFound)
		}
		r.waitStatus(id, wire.StatusFailed)
	}
	// Neighbours of the real id are no better.
	for i, forged := range []uint64{real + 1, real - 1, real ^ 1<<63} {
		if code := redeemOpen(t, r, uint32(100+i), forged, []byte("x")); code != wire.CodeClaimNotFound {
			t.Errorf("claim id %d next to a real one: %s, want %s", forged, code, wire.CodeClaimNotFound)
		}
	}
	// Not a number at all.
	hb := header(t, &wire.EntityHeader{EntityID: 200, PayloadLength: 1, Metadata: profileMD(map[string]string{peer.MetaClaimID: "../../1"})})
	st := r.entityStream(uint32(len(hb)), hb)
	if code := stopCode(t, st); code != wire.CodeEntityInvalid {
		t.Errorf("non-numeric claim id: %s, want %s", code, wire.CodeEntityInvalid)
	}
	r.alive("after 24 forged redemptions")
	completeDocument(t, tg, "after claim forgery")
}

func TestClaimReplay(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	claim, payload := deferredClaim(t, tg, "redeem me once", time.Hour)
	r := dialRaw(t, tg, allLayers())
	sum := sha256.Sum256(payload)
	r.sendEntity(&wire.EntityHeader{EntityID: 1, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: sum[:],
		Metadata: profileMD(map[string]string{peer.MetaClaimID: strconv.FormatUint(claim, 10)})}, payload)
	r.waitStatus(1, wire.StatusComplete)
	for i := range 3 {
		if code := redeemOpen(t, r, uint32(2+i), claim, payload); code != wire.CodeClaimNotFound {
			t.Errorf("replay %d of a redeemed claim: %s, want %s", i+1, code, wire.CodeClaimNotFound)
		}
	}
	// A replay from another connection fares no better.
	r2 := dialRaw(t, tg, allLayers())
	if code := redeemOpen(t, r2, 1, claim, payload); code != wire.CodeClaimNotFound {
		t.Errorf("replay from a second connection: %s, want %s", code, wire.CodeClaimNotFound)
	}
	r.alive("after replays")
	completeDocument(t, tg, "after claim replay")
}

func TestClaimExpired(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	claim, payload := deferredClaim(t, tg, "too late", 300*time.Millisecond)
	time.Sleep(600 * time.Millisecond)
	r := dialRaw(t, tg, allLayers())
	if code := redeemOpen(t, r, 1, claim, payload); code != wire.CodeClaimExpired {
		t.Errorf("expired claim: %s, want %s", code, wire.CodeClaimExpired)
	}
	r.waitStatus(1, wire.StatusFailed)
	// Still expired (not "not found", not accepted) on a second try.
	if code := redeemOpen(t, r, 2, claim, payload); code != wire.CodeClaimExpired {
		t.Errorf("expired claim, second try: %s, want %s", code, wire.CodeClaimExpired)
	}
	r.alive("after expired redemptions")
	completeDocument(t, tg, "after an expired claim")
}
