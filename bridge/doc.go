// Package bridge turns API submissions into PipeStream dehydration over a
// quicpeer session, maps STATUS frames back into document and entity state,
// stores results and claim checks, and feeds the event log.
//
// # Documents and dispatch attempts
//
// A submitted document is committed first (Upload: the record, the creation
// event and the content in one Create batch) and then dispatched: sent to
// the peer, whole or as chunk entities under a root, on one session. One
// such sending and everything the peer answers to it is a dispatch attempt,
// the idea the package turns on. In memory a document is a docRun
// (docrun.go) that holds what lives as long as the document (identity,
// plan, durable record, claims, the outbox of uncommitted changes), and its
// newest attempt (attempt.go) that holds everything that belongs to one
// sending: the session, the entities and scope digests the peer reported,
// the root entity, the result being received, the timers, the plain-peer
// state, the session mappings made for it.
//
// A document gets a new attempt, made whole by newAttemptLocked and never
// reset in place, whenever it is dispatched again:
//
//   - after a retry: sending to the peer failed, the completion policy's
//     on-timeout RETRY, or a local failure such as a full disk while
//     storing the result (not counted);
//   - after the peer was lost: the session closed with the document in
//     flight (abortAttemptLocked, then the queue);
//   - after GOAWAY: streams not all sent on the draining session are sent
//     again on the next one (not counted against MaxDispatchAttempts);
//   - after a gateway restart: recovery queues every non-terminal document
//     (recover.go), whose next attempt continues the stored generation;
//   - after a takeover (stores shared by several gateways, lease.go): the
//     takeover scan recovers a document whose lease expired the same way.
//
// With a store shared by several gateways (a Leaser, lease.go) a document
// is driven only while its lease is held; a lost lease (reported by the
// store, or a flush refused with store.ErrLeaseLost) drops the document
// from memory without retrying: another gateway drives it now.
//
// An aborted attempt has ended (it runs on no session) but stays the
// document's newest until the next one replaces it. Attempts are numbered
// by a generation persisted in the record (DocumentRecord.Private): entity
// and scope digest rows are keyed by (document, generation), so a new
// attempt's rows supersede the older ones instead of overwriting them, and
// the outbox keys its pending rows the same way, so a change outlives the
// attempt that made it.
//
// Sending goroutines, result streams, timers and session callbacks hold the
// *attempt they work for. Under the document's lock they ask whether it is still the
// document's by pointer: attempt.current (the newest, not ended, document
// not finished) before sending or applying a status, attempt.newest (the
// newest, document not finished) for results and timers. A callback from an
// older attempt finds d.att != a and drops what it brought (the race rule
// of profile 3). Claims remember the attempt they were issued to; a claim
// of an earlier attempt stays redeemable through the current attempt's
// claim for the same chunk (claims.go).
//
// # Who may call whom
//
// Behaviour about one document is a method of the docRun or of its
// attempt. They reach the docEnv (bridge.go: store, event log, metrics,
// options, wake-ups, control outboxes) and the registry behind it
// (registry.go: documents, queue, peers, sessions; leaf methods), never
// the Bridge, whose methods are the API and the loops that call down into
// documents (TestDocumentCodeStaysDown keeps it so). Each document has its
// own mutex (docRun.mu), taken before the registry's mu, never under it;
// doclock.go has the helpers and the rules (docs/architecture.md,
// "Concurrency").
//
// # Peer modes
//
// What differs between a profile peer, a plain draft-02 peer and a
// draft-04 peer (how an attempt sends, which entity a result answers, how
// the document finishes) is its session's peerMode (mode.go): profileMode
// (mode_profile.go), plainMode and draft04Mode (mode_plain.go). Result
// attribution lives in each mode's attributeRegLocked, one place per mode.
//
// # Commits
//
// Every change to a document bumps its revision and adds an event to its
// outbox (outbox.go) with the entity, digest and claim rows it touched.
// The Create batch (submit.go) and the background flusher (persist.go)
// take the outbox through one path (takeChangesLocked); a failed flush
// puts what it took back in front of newer changes. The Bridge's mutex
// guards all of this; the store's fsync never runs under it, and neither
// does a network write: a stream-0 frame decided under it is queued on the
// session's control outbox (ctrlout.go) and written after it.
//
// See docs/architecture.md for the layers and the life of a document.
package bridge
