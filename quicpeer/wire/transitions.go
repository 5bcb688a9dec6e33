package wire

// transitions is the table of Section 6.2.3 (the draft's "6.2.2a"): bit t
// of transitions[f] is set when f -> t is valid.
var transitions = [16]uint16{
	StatusPending:     bits(StatusProcessing, StatusDehydrating, StatusFailed, StatusSkipped, StatusAbandoned),
	StatusProcessing:  bits(StatusComplete, StatusFailed, StatusDehydrating, StatusCheckpoint, StatusYielded, StatusDeferred, StatusAbandoned),
	StatusDehydrating: bits(StatusRehydrating, StatusFailed, StatusAbandoned),
	StatusRehydrating: bits(StatusComplete, StatusFailed, StatusAbandoned),
	StatusCheckpoint:  bits(StatusProcessing),
	StatusYielded:     bits(StatusProcessing, StatusFailed, StatusDeferred, StatusAbandoned),
	StatusDeferred:    bits(StatusProcessing, StatusFailed, StatusSkipped, StatusAbandoned),
	StatusFailed:      bits(StatusRetrying, StatusAbandoned),
	StatusRetrying:    bits(StatusProcessing, StatusFailed, StatusAbandoned),
}

func bits(ss ...Status) uint16 {
	var m uint16
	for _, s := range ss {
		m |= 1 << s
	}
	return m
}

// ValidTransition reports whether from -> to is listed in the state table of
// Section 6.2.3. A repeated status (from == to) is not a transition and is
// not listed. PENDING is the implicit initial state (Section 6.2.3 notes):
// for the first status of an entity, pass from = StatusPending and accept
// to == StatusPending too. FAILED -> RETRYING is in the table, but valid
// only while the completion policy leaves retries (the caller checks that,
// see IsResolved). UNSPECIFIED is never part of a transition.
func ValidTransition(from, to Status) bool {
	if from > 0xF || to > 0xF {
		return false
	}
	return transitions[from]&(1<<to) != 0
}

// IsTerminal reports whether s has no outgoing transition: COMPLETE,
// SKIPPED, ABANDONED. FAILED is terminal only when no retry is left; see
// IsResolved.
func (s Status) IsTerminal() bool {
	return s == StatusComplete || s == StatusSkipped || s == StatusAbandoned
}

// IsResolved reports whether an entity in status s is resolved for cursor
// purposes (Section 9.1): a terminal status, or FAILED when retriesLeft is
// false. A FAILED entity that may still move to RETRYING MUST NOT be
// resolved.
func IsResolved(s Status, retriesLeft bool) bool {
	return s.IsTerminal() || (s == StatusFailed && !retriesLeft)
}

// CheckLayer returns *Error 0x0C when s is a Layer 2 status (YIELDED,
// DEFERRED, RETRYING, SKIPPED, ABANDONED) and Layer 2 was not negotiated
// (Section 6.2.3).
func CheckLayer(s Status, layer2 bool) error {
	if s.Layer() == 2 && !layer2 {
		return Errorf(CodeLayerUnsupported, "status %s needs Layer 2, which was not negotiated", s)
	}
	return nil
}

// CheckStatusFrame applies the frame-local rules a receiver enforces on a
// STATUS frame under the negotiated layers, in this order:
//   - a status code 0xD-0xF (unregistered) -> 0x05;
//   - UNSPECIFIED for an entity other than 0xFFFFFFFF, or a status other
//     than UNSPECIFIED for entity 0xFFFFFFFF -> 0x05 (Section 6.2.3, 5.1.4);
//   - entity 0 (NULL_ENTITY, Section 9.1) -> 0x05;
//   - a Layer 2 status without Layer 2 -> 0x0C;
//   - a scope other than 0 or a depth other than 0 without Layer 1 -> 0x0C
//     (docs/profile.md 3);
//   - YIELDED or DEFERRED with Layer 2 but without its extension -> 0x05.
//
// Transition validity needs per-entity state and is the caller's
// (ValidTransition).
func CheckStatusFrame(f *StatusFrame, layer1, layer2 bool) error {
	switch {
	case f.Status > StatusAbandoned:
		return Errorf(CodeEntityInvalid, "STATUS: status code 0x%X is not registered", uint8(f.Status))
	case f.Status == StatusUnspecified && f.EntityID != ConnectionEntity:
		return Errorf(CodeEntityInvalid, "STATUS: UNSPECIFIED for entity %d; only entity 0xFFFFFFFF may carry it", f.EntityID)
	case f.Status != StatusUnspecified && f.EntityID == ConnectionEntity:
		return Errorf(CodeEntityInvalid, "STATUS: %s for the connection-level entity 0xFFFFFFFF", f.Status)
	case f.EntityID == NullEntity:
		return Errorf(CodeEntityInvalid, "STATUS: entity 0 is the reserved NULL entity")
	}
	if err := CheckLayer(f.Status, layer2); err != nil {
		return err
	}
	if !layer1 && (f.ScopeID != 0 || f.Depth != 0) {
		return Errorf(CodeLayerUnsupported, "STATUS: scope %d depth %d need Layer 1, which was not negotiated", f.ScopeID, f.Depth)
	}
	if (f.Status == StatusYielded || f.Status == StatusDeferred) && !f.HasExt {
		return Errorf(CodeEntityInvalid, "STATUS: %s without its extension (E=0)", f.Status)
	}
	return nil
}
