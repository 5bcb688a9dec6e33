package bridge

import (
	"sync/atomic"
	"time"
)

// Tunables of the bridge, one place, one rationale each.
const (
	// leaseScanInterval: the takeover scan (Leaser stores, lease.go). With
	// pgstore's 10 s lease a killed replica's documents are taken over
	// within 10 + 2 = 12 s (docs/scale-out.md).
	leaseScanInterval = 2 * time.Second
	// leaseAcquireBatch bounds the documents one scan takes over, so that
	// the replicas alive share a dead one's documents.
	leaseAcquireBatch = 100

	// defaultInlineThreshold: documents up to 1 MiB without a split strategy
	// go whole (docs/profile.md 4.1); one stream is cheaper than a tree.
	defaultInlineThreshold = 1 << 20
	// maxStoredInline: a whole document's content and a result up to 64 KiB
	// are committed inline in the store (bridge/store PayloadRecord) with
	// the batch that records the document or its terminal state, instead of
	// a spool or result file; a file costs ~1.1 ms of CPU to create plus an
	// fsync, a rename and a directory fsync each (docs/performance.md), a
	// 4 KiB row in a group commit a few microseconds. Larger payloads keep
	// their file: every inline byte goes through the WAL and a checkpoint.
	maxStoredInline = 64 << 10
	// maxHeldContentQueue: a document committed inline keeps its content in
	// memory for its first dispatch only while fewer documents than this
	// are queued (at most 1,024 x 64 KiB = 64 MiB held); behind a longer
	// queue it is read back from the store when its turn comes.
	maxHeldContentQueue = 1024
	// defaultMaxDocumentBytes caps a document at 4 GiB: the spool is a file,
	// memory stays flat, but disk is finite.
	defaultMaxDocumentBytes = 4 << 30
	// defaultMaxDispatchAttempts: profile 8 (--max-dispatch-attempts).
	defaultMaxDispatchAttempts = 5

	// defaultChunkBytes and maxChunkBytes: profile 4.2 default 1 MiB; 16 MiB
	// keeps one chunk (plus the one in flight) per document cheap in memory.
	defaultChunkBytes = 1 << 20
	maxChunkBytes     = 16 << 20
	// maxWholeBytes bounds a document sent whole with SPLIT_NONE: the PipeDoc
	// envelope carries the blob and is built in memory.
	maxWholeBytes = 64 << 20

	// maxMetadataEntries and maxMetadataBytes keep the entity header well
	// under the peer's header cap (64 KiB by default).
	maxMetadataEntries = 64
	maxMetadataBytes   = 16 << 10
	// maxRequestIDLen and maxDisplayNameLen bound free-form strings.
	maxRequestIDLen   = 128
	maxDisplayNameLen = 512
	maxContentTypeLen = 256

	// Redial backoff (profile 8): 100 ms doubling to 10 s, with jitter.
	redialMin = 100 * time.Millisecond
	redialMax = 10 * time.Second
	// shortSession: a session that ends within this long of its handshake
	// without the peer reporting on any document counts as a failed dial
	// (backoff, the other framing under auto; profile 8): a peer that
	// closes every session at once sees a few reconnects a second at most.
	shortSession = 3 * time.Second

	// maxConcurrentDispatch bounds documents being sent at once to one
	// peer; each holds at most one chunk buffer, and more would only
	// compete for the window. Per peer, so that sendings waiting on one
	// peer (one that stopped reading its stream 0 holds them until the
	// stream-0 write deadline) never hold up another's.
	maxConcurrentDispatch = 8
	// dialTimeout bounds one dial attempt (QUIC handshake + CAPABILITIES).
	dialTimeout = 10 * time.Second
	// flushInterval is the most a state change waits before its commit when
	// changes keep arriving; commits are batched (group commit) meanwhile.
	flushInterval = 2 * time.Millisecond
	// durableWait bounds how long a change that answers only once it is
	// durable (Cancel) waits for the flush that commits it.
	durableWait = 10 * time.Second
	// maxResultPartsAhead bounds how far a streamed result's part may
	// arrive ahead of the next one to append (profile 4.3.1). The peer sends
	// parts one after another, but their handlers start in any order (one
	// goroutine per stream; on a loaded machine tiny parts overtake each
	// other by hundreds), and every part between the next one and a later
	// one is an open stream: a peer that keeps to the session's
	// concurrent-stream limit (quicpeer's default 1024) can never be
	// further ahead. It was 64, which failed a 10,000-chunk document
	// whose parts were reordered by 72 (found by the console's tests).
	maxResultPartsAhead = 1024
	// flushHold: a document's progress (RUNNING, entity statuses) waits up
	// to this long for its next change before it is committed on its own;
	// a small document's progress then commits with its terminal state, one
	// document row write instead of three (docs/performance.md). Terminal
	// states, results, claims and digests never wait.
	flushHold = 25 * time.Millisecond
	// defaultCreateHold is Options.CreateHold's default: how long a small
	// document's creation waits to commit with its result (ridecreate.go).
	// A small document on an idle peer finishes in about a millisecond, in
	// 5 to 20 under the small-document benchmark's load; one that takes
	// longer has its Submit answered this much later, and costs what it
	// did before (two commits).
	defaultCreateHold = 20 * time.Millisecond
	// maxCreateHold bounds Options.CreateHold: every small Submit may wait
	// this long for a peer that does not answer.
	maxCreateHold = 5 * time.Second
	// claimSweepInterval is how often ISSUED claims past expiry are marked
	// EXPIRED.
	claimSweepInterval = 5 * time.Second
	// resultFinishGrace: after COMPLETE(root) without a result stream, the
	// document waits this long for the result before failing.
	resultFinishGrace = 30 * time.Second
	// defaultPeerWait bounds how long a document waits for a peer session
	// before it fails (Options.PeerWait, --peer-wait): long enough to ride
	// out a peer restart, short enough that nothing waits forever.
	defaultPeerWait = 5 * time.Minute
	// superviseInterval is how often waiting documents and entity timeouts
	// are checked; entity timeouts are enforced to within this.
	superviseInterval = time.Second
	// timeoutGrace: the gateway ends a profile entity this long after its
	// completion policy's timeout-ms, so that the peer, which enforces the
	// timeout itself (profile 5), acts first even on a loaded machine. A
	// plain peer's entities get no grace: the gateway is their enforcer.
	timeoutGrace = 10 * time.Second
	// pendingTimeoutFloor: an entity the peer never reported on gets at
	// least this long (a peer may queue entities before it starts them).
	pendingTimeoutFloor = 5 * time.Minute
	// plainSettleWait: without the profile, results are entities the peer
	// sends when it likes; after the last status that ends a document the
	// gateway waits this long for a result stream to start (or for the
	// peer's own rehydration of a dehydrated document) before it decides.
	plainSettleWait = time.Second
	// plainSettleLearned: the settle wait toward a peer that has shown it
	// returns no result (learnNoResultsAfter documents in a row ended with
	// their result absent, and it never sent an entity): the reference
	// draft-04 peer never does, and waiting a second per document for it
	// capped such a peer at one document a second. Short, not zero: a
	// result stream already on its way still gets read.
	plainSettleLearned  = 20 * time.Millisecond
	learnNoResultsAfter = 3
	// defaultDraft04Conns and maxDraft04Conns bound the connections open at
	// once to one draft-04 peer (Options.PeerDraft04Conns).
	defaultDraft04Conns = 4
	maxDraft04Conns     = 64
	// plainPartsDir (in the data dir) spools chunk results from a plain
	// peer until the document is rehydrated.
	plainPartsDir = "plain-parts"
)

// redeemAckTimeout: after sending a redemption, Redeem waits this long for
// the peer's next status of the redeemed entity before it returns with
// the redemption pending (the document's wait reason says so, and the
// answer is recorded when it comes: redeemPending). The peer answers
// PROCESSING once the payload is in (milliseconds; the payload budget may
// delay it under load). Atomic so tests can shorten it while other
// tests' bridges still run (export_test.go).
var redeemAckTimeout = newAtomicDuration(10 * time.Second)

// drainPollInterval: during Close, how often the bridge checks whether a
// session's GOAWAY drain waits only on documents deferred behind durable
// claims (then it ends the drain; a claim may wait for days).
const drainPollInterval = 50 * time.Millisecond

// storeRetryDelay: a dispatch that could not read its content because the
// store was unavailable (a database restart) is retried after this long,
// so an outage costs one attempt a second per document, not a busy loop.
const storeRetryDelay = time.Second

// controlWriteTimeout bounds one stream-0 write on the bridge's sessions
// (quicpeer.Limits.ControlWriteTimeout; 0: quicpeer's default, 10 s): a
// peer that stops reading its control stream loses its session after it,
// and its documents are dispatched again. A variable so tests can change
// it.
var controlWriteTimeout atomicDuration

// atomicDuration is a time.Duration that tests may change while bridges
// read it.
type atomicDuration struct{ v atomic.Int64 }

func newAtomicDuration(d time.Duration) *atomicDuration {
	a := &atomicDuration{}
	a.v.Store(int64(d))
	return a
}

func (a *atomicDuration) Load() time.Duration   { return time.Duration(a.v.Load()) }
func (a *atomicDuration) Store(d time.Duration) { a.v.Store(int64(d)) }
