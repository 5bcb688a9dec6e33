// Package peer is the PipeStream processing peer (the QUIC server side of
// docs/profile.md): it accepts sessions with quicpeer, processes whole
// documents 1:1 and gateway-dehydrated documents N:1 (buffering orphan
// children) for entities marked pipestream.profile = 1, serves every other
// entity as a plain draft-02 entity (1:1, or N:1 under a parent announced
// DEHYDRATING, with one generic result stream: plain.go), runs processors (passthrough, textstats, sentences, fault),
// nests with Layer 1 scopes and SCOPE_DIGEST, applies completion policies
// (retries, skip, defer, timeouts), issues Yield tokens and claim checks
// (persisted in the data dir, redeemed exactly once), spools child outputs
// to <data-dir>/work so that memory stays flat for any document size, and
// shuts down with GOAWAY and a bounded drain (deferred entities do not hold
// it: their claims outlive the session).
//
// Embedding (the gateway's default mode):
//
//	srv, err := peer.Start(peer.Options{DataDir: dir})   // 127.0.0.1:0
//	addr, pin := srv.Addr().String(), srv.CertPEM()
//	defer srv.Shutdown(ctx)
//
// Standalone (`gateway peer`): peer.Run(ctx, opts) until ctx ends.
package peer
