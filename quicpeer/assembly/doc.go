// Package assembly keeps the Assembly Manifest of draft-krickert-pipestream-02
// Section 9.2 (parent -> children, their statuses and the completion policy)
// and the rehydration-readiness queue of Section 9.6 (a pairing heap: O(1)
// insert and decrease-key, amortized O(log n) extract-min).
//
// The manifest is local state, never sent on the wire. Nothing here is safe
// for concurrent use; the session serializes access.
package assembly
