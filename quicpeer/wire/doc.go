// Package wire is the draft-krickert-pipestream-02 wire codec: the Unified
// Control Frame (UCF) framing of stream 0, the fixed frames (STATUS,
// SCOPE_DIGEST, BARRIER, GOAWAY), the variable frames (CAPABILITIES,
// CHECKPOINT), entity frames, the CBOR and Protobuf serialization formats,
// the status state machine, entity-ID/cursor arithmetic (Section 9.1) and
// the scope-digest Merkle root (Section 9.5).
//
// Every decoder returns a *Error carrying the draft's error code (Section
// 11.4) and never allocates from a length field before the bytes arrive.
package wire
