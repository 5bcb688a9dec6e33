// Package conformance implements the standalone command contract of the
// public PipeStream reference suite (ai-pipestream/pipestream-quic-protocol-rfc,
// conformance/README.md, "Standalone command contract"), so that this
// project's binary can stand in the reference's Layer 0 interop matrix next
// to its Java, Rust and C++ implementations:
//
//	gateway conformance serve --bind HOST:PORT --cert C --key K --output-dir D --ready-file F [--once]
//	gateway conformance send --connect HOST:PORT --ca CA --server-name N --entity-id ID [--parent-id P] --input FILE [--content-type T]
//
// Both run the reference's Layer 0 conversation under draft-04 framing
// (every control frame Type + 4-octet Length + payload; docs/profile.md
// 1.2), one entity per connection:
//
//	client                                server
//	CAPABILITIES (six Layer 0 members) ->
//	                                   <- CAPABILITIES (the negotiated set), heartbeat
//	heartbeat, STATUS PENDING(id),
//	entity stream (header + payload)   ->
//	                                   <- STATUS PROCESSING(id), COMPLETE(id)
//	CHECKPOINT(id+1, flags 0)          ->
//	                                   <- CHECKPOINT ACK (flags 1)
//	cursor update (id+1), GOAWAY(id)   ->
//	                                   <- GOAWAY(id), FIN on stream 0
//	close 0x00
//
// The server writes OUTPUT-DIR/ID.bin only after the whole entity stream
// was read and its payload-length and SHA-256 checksum verified (the
// payload is streamed into a temporary file that is renamed into place),
// and OUTPUT-DIR/ID.parent ("PARENT\n") when the header carries a
// parent-id. The ready file receives "HOST:PORT\n", the bound address,
// written atomically once the listener is up; the reference's driver reads
// it to find the port of --bind 127.0.0.1:0.
//
// The codec is the project's own (quicpeer/wire); nothing of the quicpeer
// session is used, so the conversation is exactly the reference's and
// nothing else. Exact in what it sends (canonical CBOR, the six
// CAPABILITIES members, an entity header of at most six members), liberal
// in what it accepts (any valid CBOR, unknown members ignored; the
// CHECKPOINT and the cursor update are optional for a client).
package conformance
