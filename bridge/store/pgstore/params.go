package pgstore

import "time"

// Tunables, each with the reason for its default.
const (
	// defaultMaxConns: per replica. Commits hold a connection for a few
	// round trips; reads one each; payload streams one per chunk read. 16
	// covers a 2-4 core replica; 10 replicas then need 170 connections
	// (docs/scale-out.md, sizing).
	defaultMaxConns = 16
	// PayloadChunkSize is the size of one stored chunk of a spool or result
	// payload: a writer and a reader hold at most one chunk in memory; each
	// chunk is one row (TOASTed out of line, uncompressed).
	PayloadChunkSize = 256 << 10
	// MaxPayloadSize bounds one payload: chunk numbers are INT (2^31) but
	// the gateway's --max-upload-bytes is far below; 64 GiB keeps a runaway
	// writer from filling the database.
	MaxPayloadSize = 64 << 30
	// staleBlobAge: a payload still being written after this long is left
	// over from a crashed replica; Open deletes it.
	staleBlobAge = 24 * time.Hour

	// The paging limits of the SQLite store (AIP-158, replay bounds).
	defaultPageSize   = 50
	maxPageSize       = 1000
	defaultEventLimit = 1000
	maxEventLimit     = 10000
	maxDocIDLen       = 128
)

// catchUpTimeout bounds the read of other replicas' events that a Commit
// does before delivering its own (tail.go).
const catchUpTimeout = 30 * time.Second

// idleInTxTimeout is the server's idle_in_transaction_session_timeout
// for the pool's sessions: a replica paused (SIGSTOP, a VM freeze) in the
// middle of an event-writing commit holds the counter row's lock, which
// every replica's event-writing commit and prune waits for; the server
// ends that session after this long, its transaction rolls back (seqs
// with it: no hole), and the cluster goes on. The store's transactions
// never wait for a client in between statements, so a healthy one is
// never this idle. A store URL that sets the parameter keeps its value.
const idleInTxTimeout = 5 * time.Second

// rollbackTimeout bounds the ROLLBACK of a failed pipelined commit (it
// runs also when the Commit's ctx has ended).
const rollbackTimeout = 10 * time.Second

// Lease timings (lease.go, docs/scale-out.md). A replica killed right after
// a renewal leaves leases valid for DefaultLeaseDuration; the takeover scan
// of another replica (bridge, every 2 s) finds them within one scan after
// that: takeover within 10 + 2 = 12 s of kill -9, below the 15 s target.
// A replica whose renewals fail stops driving 10 - 3 = 7 s after the start
// of its last good renewal, 3 s before any other replica can take over.
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultRenewInterval = 3 * time.Second
	DefaultLeaseMargin   = 3 * time.Second
)

// releaseTimeout bounds the UPDATE that hands the held leases back at
// Close (lease.go); when it fails the leases expire as after a crash.
const releaseTimeout = 5 * time.Second
