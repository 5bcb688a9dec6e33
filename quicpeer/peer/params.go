package peer

import "time"

// Tunables of the processing peer, one place, one rationale each.
const (
	// defaultDrainTimeout bounds GOAWAY drain on shutdown: long enough for
	// in-flight chunks to finish, short enough for a SIGTERM grace period.
	defaultDrainTimeout = 15 * time.Second
	// defaultOrphanDocs caps documents known only through children (no root
	// envelope, no DEHYDRATING yet) per session, so unsolicited children
	// cannot grow memory without bound (profile 3, 4.2).
	defaultOrphanDocs = 256
	// defaultOrphanChildren caps children buffered for such documents per session.
	defaultOrphanChildren = 4096
	// defaultMaxEntityBytes caps a whole document (root with blob) the peer
	// buffers: the gateway sends SPLIT_NONE documents whole up to 64 MiB.
	defaultMaxEntityBytes = 64 << 20
	// defaultMaxChunkBytes caps a dehydration child: the gateway's chunks
	// are at most 16 MiB (profile 4.2).
	defaultMaxChunkBytes = 16 << 20
	// defaultPayloadBudget bounds the entity payloads held in memory at
	// once (read, processing, not yet spooled): one maximum-size chunk or 16
	// default 1 MiB chunks; streams beyond it wait unread, so QUIC flow
	// control holds the sender back and the peer's memory stays flat.
	defaultPayloadBudget = 16 << 20
	// envelopeBufferBytes: whole-document envelopes up to this size are
	// read into recycled buffers (small documents dominate churn; larger
	// ones are rare enough to allocate).
	envelopeBufferBytes = 16 << 10
	// spoolBufferBytes is the one buffer used to hash and stream spooled
	// child outputs into a result.
	spoolBufferBytes = 64 << 10
	// defaultChildrenPerMB is the amplification ratio of draft-02 Section 10.4.
	defaultChildrenPerMB = 1000
	// amplificationFloorBytes: a parent smaller than this is treated as this
	// large when applying the children-per-MB ratio, so a 2 KiB paragraph may
	// still split into a few sentences (the ratio targets bombs, not prose).
	amplificationFloorBytes = 1 << 20
	// defaultPolicyTimeout, defaultMaxRetries, defaultRetryDelay are the
	// completion-policy defaults of draft-02 Section 8.3.
	defaultPolicyTimeout = 300 * time.Second
	defaultMaxRetries    = 3
	defaultRetryDelay    = time.Second
	// yieldResumeDelay is how long the fault processor stays YIELDED before
	// the peer resumes it: visible to observers, negligible for tests.
	yieldResumeDelay = 20 * time.Millisecond
	// yieldTokenTTL bounds how long an unconsumed yield token stays valid.
	yieldTokenTTL = 10 * time.Minute
	// claimRetentionGrace keeps a claim record this long past its expiry so
	// a late redemption is answered CLAIM_EXPIRED (0x0A) rather than
	// CLAIM_NOT_FOUND; draft-02 Section 10.6 requires at least the expiry.
	claimRetentionGrace = time.Hour
	// topWords is how many words textstats reports.
	topWords = 10
	// maxDistinctWords caps the per-entity word map of textstats (memory bound
	// on adversarial input); words beyond it still count in totals.
	maxDistinctWords = 100_000
	// maxSeamWordBytes bounds the partial words textstats keeps at each
	// chunk edge to rejoin words cut by a boundary; longer words are not
	// natural-language words and are corrected by count only.
	maxSeamWordBytes = 1024
	// maxRetryDelay caps retry-delay-ms from a peer-supplied policy.
	maxRetryDelay = time.Minute
)
