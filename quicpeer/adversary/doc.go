// Package adversary holds no code: its tests (package adversary_test) are
// the raw-QUIC adversary suite against the processing peer
// (docs/security.md, docs/architecture.md, "Security and limits"). A hand-driven quic-go client
// (TLS 1.3, ALPN pipestream/1, the peer's pinned certificate) puts on the
// wire what a correct quicpeer session never sends: unknown and oversized
// frames, truncated control streams, invalid transitions, entity 0,
// unregistered status codes, depth bombs, lying header lengths and
// checksums, forged, replayed and expired claim checks, and slowloris
// streams. Each test asserts the documented PipeStream error code
// (draft-02 Section 11.4) and that a second, well-behaved session
// completes a document during or after the attack.
package adversary
