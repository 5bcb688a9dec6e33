package peer

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Claim-check store (draft-02 Sections 6.6.3 and 10.6.2, docs/profile.md 6).
//
// Issued claims and redemptions are appended to <data-dir>/claims.jsonl, one
// JSON object per line, fsynced before the DEFERRED status or the redemption
// is acted on, so a restarted peer still knows every claim it issued and
// still rejects replays. Records are kept until claimRetentionGrace after
// their expiry (at least the expiry duration, Section 10.6.2); the file is
// compacted on open.

// Claim-store errors. ErrClaimNotFound covers unknown ids and replays
// (PIPESTREAM_CLAIM_NOT_FOUND, 0x0B); ErrClaimExpired maps to 0x0A.
var (
	ErrClaimNotFound = errors.New("claim check not found or already redeemed")
	ErrClaimExpired  = errors.New("claim check expired")
)

// ClaimRecord is what the peer persists to resume a deferred entity.
type ClaimRecord struct {
	ID        uint64            `json:"id"`
	DocID     string            `json:"doc,omitempty"`
	EntityID  uint32            `json:"entity"`
	ScopeID   uint32            `json:"scope"`
	ParentID  uint32            `json:"parent,omitempty"`
	Chunk     int               `json:"chunk"`
	SessionID string            `json:"session"`
	Expiry    time.Time         `json:"expiry"`
	Processor string            `json:"processor"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Plain: the deferred entity was a plain one (plain.go): its
	// redemption carries the raw content, not a PipeDoc envelope, and gets
	// the generic result form.
	Plain    bool `json:"plain,omitempty"`
	Redeemed bool `json:"-"`
	// Settled is set when the claim can no longer be redeemed for another
	// reason (its deferred entity was abandoned at expiry).
	Settled bool `json:"-"`
}

type claimLine struct {
	Op    string       `json:"op"` // "issue", "redeem", "settle"
	Claim *ClaimRecord `json:"claim,omitempty"`
	ID    uint64       `json:"id,omitempty"`
	At    time.Time    `json:"at"`
}

// ClaimStore is the persistent claim table. Safe for concurrent use; every
// state change is serialized by one mutex, which makes redemption exactly-once.
type ClaimStore struct {
	mu     sync.Mutex
	path   string
	f      *os.File
	claims map[uint64]*ClaimRecord
	now    func() time.Time
	log    *slog.Logger
}

// OpenClaimStore loads (and compacts) dir/claims.jsonl, creating it if needed.
func OpenClaimStore(dir string, log *slog.Logger, now func() time.Time) (*ClaimStore, error) {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	s := &ClaimStore{path: filepath.Join(dir, "claims.jsonl"), claims: map[uint64]*ClaimRecord{}, now: now, log: log}
	if err := s.load(); err != nil {
		return nil, err
	}
	if err := s.compact(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *ClaimStore) load() error {
	f, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("claims: open %s: %w", s.path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		var l claimLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			// A torn last line after a crash: the claim was never announced
			// (DEFERRED is sent after the fsync), so skipping it is safe.
			s.log.Warn("claims: skipping unreadable line", "file", s.path, "line", n, "err", err)
			continue
		}
		switch l.Op {
		case "issue":
			if l.Claim != nil && l.Claim.ID != 0 {
				s.claims[l.Claim.ID] = l.Claim
			}
		case "redeem":
			if c := s.claims[l.ID]; c != nil {
				c.Redeemed = true
			}
		case "settle":
			if c := s.claims[l.ID]; c != nil {
				c.Settled = true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("claims: read %s: %w", s.path, err)
	}
	return nil
}

// compact rewrites the file without records past their retention and opens
// it for appending.
func (s *ClaimStore) compact() error {
	cutoff := s.now().Add(-claimRetentionGrace)
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	w := bufio.NewWriter(f)
	pruned := 0
	for id, c := range s.claims {
		if c.Expiry.Before(cutoff) {
			delete(s.claims, id)
			pruned++
			continue
		}
		writeLine(w, claimLine{Op: "issue", Claim: c, At: s.now()})
		if c.Redeemed {
			writeLine(w, claimLine{Op: "redeem", ID: id, At: s.now()})
		}
		if c.Settled {
			writeLine(w, claimLine{Op: "settle", ID: id, At: s.now()})
		}
	}
	if err := errors.Join(w.Flush(), f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("claims: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	syncDir(filepath.Dir(s.path))
	if pruned > 0 {
		s.log.Info("claims: pruned expired claim records", "pruned", pruned, "kept", len(s.claims))
	}
	s.f, err = os.OpenFile(s.path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	return nil
}

func writeLine(w io.Writer, l claimLine) {
	b, _ := json.Marshal(l) // plain structs: cannot fail
	w.Write(append(b, '\n'))
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// append writes one line and fsyncs. Caller holds s.mu.
func (s *ClaimStore) append(l claimLine) error {
	if s.f == nil {
		return errors.New("claims: store closed")
	}
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("claims: append: %w", err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("claims: fsync: %w", err)
	}
	return nil
}

// newClaimID draws a non-zero 64-bit id from crypto/rand (Section 10.6.2).
func newClaimID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}

// Issue assigns a fresh claim id to c, persists it (fsync) and returns the
// stored record. c.Expiry must be set.
func (s *ClaimStore) Issue(c ClaimRecord) (*ClaimRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		id, err := newClaimID()
		if err != nil {
			return nil, fmt.Errorf("claims: random id: %w", err)
		}
		if _, dup := s.claims[id]; !dup {
			c.ID = id
			break
		}
	}
	rec := c
	if err := s.append(claimLine{Op: "issue", Claim: &rec, At: s.now()}); err != nil {
		return nil, err
	}
	s.claims[rec.ID] = &rec
	cp := rec
	return &cp, nil
}

// Redeem accepts claim id exactly once: it returns ErrClaimNotFound for an
// unknown or replayed claim, ErrClaimExpired past the expiry, else
// persists the redemption (fsync) and returns the record.
func (s *ClaimStore) Redeem(id uint64) (*ClaimRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[id]
	switch {
	case c == nil || c.Redeemed:
		return nil, fmt.Errorf("%w: claim %d", ErrClaimNotFound, id)
	case c.Settled || !s.now().Before(c.Expiry): // settled only happens at expiry
		return nil, fmt.Errorf("%w: claim %d expired at %s", ErrClaimExpired, id, c.Expiry.UTC().Format(time.RFC3339Nano))
	}
	if err := s.append(claimLine{Op: "redeem", ID: id, At: s.now()}); err != nil {
		return nil, err
	}
	c.Redeemed = true
	cp := *c
	return &cp, nil
}

// Settle marks an unredeemed claim as no longer redeemable (its entity was
// abandoned at expiry). It reports false when the claim was redeemed first.
func (s *ClaimStore) Settle(id uint64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[id]
	if c == nil || c.Redeemed {
		return false, nil
	}
	if c.Settled {
		return true, nil
	}
	if err := s.append(claimLine{Op: "settle", ID: id, At: s.now()}); err != nil {
		return false, err
	}
	c.Settled = true
	return true, nil
}

// Get returns a copy of the record of id.
func (s *ClaimStore) Get(id uint64) (ClaimRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.claims[id]; c != nil {
		return *c, true
	}
	return ClaimRecord{}, false
}

// Close closes the file.
func (s *ClaimStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
