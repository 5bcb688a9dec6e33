// Package fence is the one lease-fencing rule of the store backends
// (docs/scale-out.md, Leases and fencing): given what a replica knows of
// one document's lease when a write touches it, whether the write is
// refused, carries the lease condition (the epoch the row must still
// have), or is conditional on the revision only.
//
// pgstore applies it to a Commit's document updates, to the documents
// whose child rows a Commit writes, and to a streamed payload's Sync. The
// SQLite backend has no leases (one process per data directory, by
// construction) and so never fences.
package fence

import "time"

// PastDeadline is the reason of a refusal at or after the replica's local
// deadline (its renewals failed).
const PastDeadline = "not renewed before the local deadline"

// Lease is what a replica knows of one document's lease.
type Lease struct {
	// Lost: the replica stopped driving the document (taken over, or not
	// renewed in time); Why says which.
	Lost bool
	Why  string
	// Held: the replica drives the document at Epoch.
	Held  bool
	Epoch int64
}

// Verdict is the rule's answer for one document.
type Verdict struct {
	// Refused: the write must not be applied (a *store.LeaseLostError with
	// Why as its reason).
	Refused bool
	Why     string
	// Fenced: the write carries the condition owner = this replica AND
	// lease_epoch = Epoch. Neither Refused nor Fenced: the replica does
	// not drive the document, and the write is conditional on the
	// revision only.
	Fenced bool
	Epoch  int64
}

// Check applies the rule at now, with the replica's local deadline: a
// lost lease is refused with the reason it was lost; a document the
// replica does not hold is not fenced; a held one is refused at or after
// the deadline (PastDeadline), else fenced at its epoch.
func Check(l Lease, now, deadline time.Time) Verdict {
	switch {
	case l.Lost:
		return Verdict{Refused: true, Why: l.Why}
	case !l.Held:
		return Verdict{}
	case !now.Before(deadline):
		return Verdict{Refused: true, Why: PastDeadline}
	}
	return Verdict{Fenced: true, Epoch: l.Epoch}
}
