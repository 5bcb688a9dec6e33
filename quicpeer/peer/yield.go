package peer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"sync"
	"time"
)

// Yield tokens (draft-02 Sections 6.6.2 and 10.6.1). A token is opaque to
// the gateway; the peer issues it in the YIELDED Yield extension and
// resumes the entity itself. Layout (105 octets):
//
//	ver(1)=1 | entity-id(4) | scope-id(4) | nonce(16) | session-binding(16) |
//	state-checksum(32) | HMAC-SHA-256 over the preceding octets(32)
//
// session-binding is the first 16 octets of SHA-256(session ID). A token is
// accepted once, only for the same session and entity, and only if the
// SHA-256 of the continuation state the peer holds equals state-checksum
// (stopping-point validation, Section 9.7).

const yieldTokenLen = 1 + 4 + 4 + 16 + 16 + 32 + 32

// Yield token errors.
var (
	ErrYieldTokenInvalid  = errors.New("yield token invalid (malformed, forged, or for another session or entity)")
	ErrYieldTokenConsumed = errors.New("yield token already consumed or expired")
	ErrYieldStateMismatch = errors.New("yield token state checksum does not match the held state")
)

type yieldEntry struct {
	state   []byte
	expires time.Time
}

// yieldBook issues and consumes yield tokens. Safe for concurrent use.
type yieldBook struct {
	key [32]byte
	now func() time.Time

	mu          sync.Mutex
	outstanding map[[16]byte]*yieldEntry
}

func newYieldBook(now func() time.Time) *yieldBook {
	if now == nil {
		now = time.Now
	}
	b := &yieldBook{now: now, outstanding: map[[16]byte]*yieldEntry{}}
	rand.Read(b.key[:]) // crypto/rand.Read never fails (Go 1.24+)
	return b
}

func sessionBinding(sessionID string) [32]byte { return sha256.Sum256([]byte(sessionID)) }

// issue returns a token for (session, entity, scope) binding state. The book
// keeps state until the token is consumed or yieldTokenTTL passes.
func (b *yieldBook) issue(sessionID string, entity, scope uint32, state []byte) []byte {
	tok := make([]byte, 0, yieldTokenLen)
	tok = append(tok, 1)
	tok = binary.BigEndian.AppendUint32(tok, entity)
	tok = binary.BigEndian.AppendUint32(tok, scope)
	var nonce [16]byte
	rand.Read(nonce[:])
	tok = append(tok, nonce[:]...)
	sb := sessionBinding(sessionID)
	tok = append(tok, sb[:16]...)
	sum := sha256.Sum256(state)
	tok = append(tok, sum[:]...)
	m := hmac.New(sha256.New, b.key[:])
	m.Write(tok)
	tok = m.Sum(tok)

	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	for k, e := range b.outstanding { // bounded by live yields; prune lazily
		if now.After(e.expires) {
			delete(b.outstanding, k)
		}
	}
	b.outstanding[nonce] = &yieldEntry{state: append([]byte(nil), state...), expires: now.Add(yieldTokenTTL)}
	return tok
}

// consume validates tok for (session, entity, scope) and returns the held
// continuation state. A token is consumed by its first validation attempt
// that gets past the MAC and binding checks, whatever the outcome.
func (b *yieldBook) consume(tok []byte, sessionID string, entity, scope uint32) ([]byte, error) {
	if len(tok) != yieldTokenLen || tok[0] != 1 {
		return nil, ErrYieldTokenInvalid
	}
	body, mac := tok[:yieldTokenLen-32], tok[yieldTokenLen-32:]
	m := hmac.New(sha256.New, b.key[:])
	m.Write(body)
	if !hmac.Equal(m.Sum(nil), mac) {
		return nil, ErrYieldTokenInvalid
	}
	sb := sessionBinding(sessionID)
	if binary.BigEndian.Uint32(body[1:]) != entity || binary.BigEndian.Uint32(body[5:]) != scope ||
		subtle.ConstantTimeCompare(body[25:41], sb[:16]) != 1 {
		return nil, ErrYieldTokenInvalid
	}
	var nonce [16]byte
	copy(nonce[:], body[9:25])
	b.mu.Lock()
	e := b.outstanding[nonce]
	delete(b.outstanding, nonce)
	b.mu.Unlock()
	if e == nil || b.now().After(e.expires) {
		return nil, ErrYieldTokenConsumed
	}
	sum := sha256.Sum256(e.state)
	if subtle.ConstantTimeCompare(sum[:], body[41:73]) != 1 {
		return nil, ErrYieldStateMismatch
	}
	return e.state, nil
}
