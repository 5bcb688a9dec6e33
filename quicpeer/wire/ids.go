package wire

// Entity-ID arithmetic of Section 9.1 and the circular order of Section 9.3.
// IDs live in 1..IDModulus-1; 0 is NULL_ENTITY and 0xFFFFFFFF is
// CONNECTION_LEVEL.

// modDist returns (b - a) mod IDModulus for a, b in 0..IDModulus-1.
func modDist(a, b uint32) uint32 {
	return uint32((uint64(b) + uint64(IDModulus) - uint64(a)%uint64(IDModulus)) % uint64(IDModulus))
}

// NextID returns the ID after lastAssigned: (lastAssigned + 1) mod
// 0xFFFFFFFD, skipping 0 (Section 9.1).
func NextID(lastAssigned uint32) uint32 {
	n := uint32((uint64(lastAssigned) + 1) % uint64(IDModulus))
	if n == NullEntity {
		n = 1
	}
	return n
}

// WindowSize returns (lastAssigned - cursor) mod 0xFFFFFFFD, the window
// formula of Section 9.1.
func WindowSize(cursor, lastAssigned uint32) uint32 { return modDist(cursor, lastAssigned) }

// IsBefore is is_before(a, b) = ((b - a + MAX) % MAX) < (MAX / 2) of Section
// 9.3, literally: note that IsBefore(a, a) is true, so a caller asking
// "strictly less than" also checks a != b.
func IsBefore(a, b uint32) bool { return modDist(a, b) < IDModulus/2 }

// MaxSafeWindow is the largest window the circular order of Section 9.3 can
// order: two in-flight IDs must be less than MAX/2 apart. It is also the
// effective default max-window-size (the draft's 2^31 exceeds it by 2).
const MaxSafeWindow = IDModulus / 2 // 0x7FFFFFFE

// IDSpace assigns entity IDs of one ID space (the root scope owned by the
// gateway, or a scope owned by the peer) and tracks the cursor (Section 9.1).
//
// In-flight IDs are cursor .. last_assigned in circular order. The resolved
// set holds only IDs resolved ahead of the cursor and is pruned as the
// cursor advances, so it never exceeds the window. Which statuses resolve an
// ID is the caller's decision: call Resolve for COMPLETE, SKIPPED,
// ABANDONED, and FAILED only when no retry is left (IsResolved); a FAILED
// entity that may still retry MUST NOT be resolved.
//
// An IDSpace is not safe for concurrent use.
type IDSpace struct {
	cursor    uint32 // oldest unresolved ID, or the next ID when none is in flight
	last      uint32
	maxWindow uint32
	inFlight  uint32
	resolved  map[uint32]struct{}
}

// NewIDSpace returns an empty ID space whose first ID is 1. maxWindow is the
// negotiated max-window-size; 0 or values above MaxSafeWindow mean
// MaxSafeWindow.
func NewIDSpace(maxWindow uint32) *IDSpace {
	if maxWindow == 0 || maxWindow > MaxSafeWindow {
		maxWindow = MaxSafeWindow
	}
	return &IDSpace{cursor: 1, last: 0, maxWindow: maxWindow, resolved: make(map[uint32]struct{})}
}

// NewIDSpaceAfter is NewIDSpace whose first ID is NextID(lastAssigned), for
// continuing an ID space (and for exercising the wrap at 0xFFFFFFFC).
func NewIDSpaceAfter(maxWindow, lastAssigned uint32) *IDSpace {
	s := NewIDSpace(maxWindow)
	s.last = lastAssigned % IDModulus
	s.cursor = NextID(s.last)
	return s
}

// Assign returns a new ID, or false when the window is full (backpressure:
// (new_id - cursor) mod MAX >= max_window, Section 9.1).
func (s *IDSpace) Assign() (uint32, bool) {
	n := NextID(s.last)
	if s.inFlight > 0 && modDist(s.cursor, n) >= s.maxWindow {
		return 0, false
	}
	if s.inFlight == 0 {
		s.cursor = n
	}
	s.last = n
	s.inFlight++
	return n, true
}

// InFlight reports whether id is assigned and not yet passed by the cursor.
func (s *IDSpace) InFlight(id uint32) bool {
	if s.inFlight == 0 || id == NullEntity || id >= IDModulus {
		return false
	}
	return modDist(s.cursor, id) <= modDist(s.cursor, s.last)
}

// Resolve marks id resolved. When id is the cursor, the cursor advances past
// every contiguous resolved ID; it returns the cursor and whether it moved.
// IDs that are not in flight, or already resolved, are ignored.
func (s *IDSpace) Resolve(id uint32) (cursor uint32, advanced bool) {
	if !s.InFlight(id) {
		return s.cursor, false
	}
	if _, dup := s.resolved[id]; dup {
		return s.cursor, false
	}
	if id != s.cursor {
		s.resolved[id] = struct{}{}
		return s.cursor, false
	}
	s.inFlight--
	s.cursor = NextID(s.cursor)
	for s.inFlight > 0 {
		if _, ok := s.resolved[s.cursor]; !ok {
			break
		}
		delete(s.resolved, s.cursor)
		s.inFlight--
		s.cursor = NextID(s.cursor)
	}
	return s.cursor, true
}

// Cursor returns the cursor: the oldest unresolved ID, or the next ID to
// assign when nothing is in flight. IDs behind it may be recycled.
func (s *IDSpace) Cursor() uint32 { return s.cursor }

// LastAssigned returns the last assigned ID (0 before the first).
func (s *IDSpace) LastAssigned() uint32 { return s.last }

// Outstanding returns the number of assigned, unpassed IDs (resolved ones
// ahead of the cursor included).
func (s *IDSpace) Outstanding() uint32 { return s.inFlight }

// MaxWindow returns the effective window.
func (s *IDSpace) MaxWindow() uint32 { return s.maxWindow }
