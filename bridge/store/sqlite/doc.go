// Package sqlite is the default backend of the durable store
// (bridge/store): documents, entities, scope digests, claim checks,
// idempotency records and the sequenced event log in one SQLite file
// (modernc.org/sqlite, pure Go) under the data directory; streamed payloads
// are files next to it (payload.go). See docs/architecture.md for where
// state lives.
//
// # Writes
//
// Every write goes through Commit (or PruneEvents), which hands a Batch to a
// single writer goroutine. The writer drains its queue and applies many
// batches in ONE transaction (group commit): a batch whose precondition
// fails (stale revision, claim already redeemed, idempotency conflict...) is
// rolled back alone and its caller gets the error, while the other batches
// of the group commit. (The writer runs a group without savepoints first;
// only if a batch fails does it roll back and rerun the group with each
// batch inside its own SAVEPOINT, WriterStats.Retries.) Commit returns only
// after the transaction is durable (see Options.Synchronous), so "Commit
// returned nil" is the point at which a submission may be acknowledged.
//
// # Durability
//
// WAL mode with synchronous=FULL by default: COMMIT fsyncs the WAL, so a
// batch whose Commit returned survives kill -9, an OS crash and power loss
// (given a disk that honors fsync). synchronous=NORMAL (Options.Synchronous)
// skips that fsync (the WAL is synced only at checkpoints): committed data
// still survives kill -9 of the process, because it is in the OS page cache,
// but the last transactions can be lost (never corrupted) on power loss or an
// OS crash. Group commit makes FULL cheap under load: one fsync covers every
// batch of a transaction. One process per data directory: the seq high-water
// mark is read inside each write transaction, so a second writer could not
// reuse seqs, but LastSeq and the event hook would miss its writes.
//
// # Event sequence numbers
//
// Events in a Batch get seq numbers inside the writer transaction: seq =
// last_seq+1, starting at 1, strictly below 2^53. last_seq lives in the meta
// table and is updated in the same transaction, so seqs never repeat, not
// after kill -9 and not after pruning every event. Seqs are assigned in queue
// order, so the seqs of one batch are consecutive and ascending.
//
// # Event log
//
// Events are stored as blocks (schema migration 6, blocks.go): one
// event_blocks row per writer transaction (at most maxBlockEvents events)
// with the events' fields in a compact head blob and their bodies in a
// second blob, and one event_keys row per distinct tenant and document of
// the block, through which a tenant's or document's reads find their
// blocks. Pruning deletes whole blocks and rewrites the one straddling its
// bound, so the first retained block starts at the oldest retained seq.
//
// # Snapshot size
//
// SnapshotBytes (the retention byte cap, read by every retention pass) is
// a running total in meta ('snapshot_bytes'), kept by triggers on documents
// and digests (schema migration 5, which seeds it with one scan). A trigger
// runs inside the statement that changes the row, so the total commits or
// rolls back (savepoints included) with the rows it sums: exact at every
// commit, after kill -9 and for rows written by any connection to the file.
// An in-memory counter seeded at open would cost a scan of every document
// row at each start (seconds at a million documents) and miss rows written
// around the writer.
//
// # Reads
//
// Reads use a separate pool of read-only connections (WAL readers never block
// the writer). Every read by id takes a tenant and answers ErrNotFound for a
// row that belongs to another tenant.
//
// # Streamed payloads
//
// CreatePayload returns a PayloadWriter on a temporary file in
// <dir>/spool (content) or <dir>/results (result); Sync fsyncs it, renames
// it to <doc-id>.bin and fsyncs the directory. OpenPayload returns the file
// itself (a PayloadReader whose WriteTo is the file's), so serving a result
// copies no more than before the interface. The bridge syncs a payload
// before the Commit that records the document, and both before it
// acknowledges the submission.
package sqlite
