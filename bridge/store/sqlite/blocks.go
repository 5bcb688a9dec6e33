package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Events are stored as blocks (schema migration 6): one row of
// event_blocks per committing transaction (at most maxBlockEvents
// events: a larger group writes several; a group rerun with a savepoint
// per batch, after one failed, writes a block per batch), holding the
// events first_seq .. last_seq in seq order, event first_seq + i at
// index i. A group commit
// of many small documents thus writes one table row for all their events
// and one event_keys entry per distinct tenant and document of the block,
// where a row per event wrote a table row and two index entries each.
//
// A block row has two blobs, so that the metadata readers (EachEventMeta,
// EachEventRange, pruning) do not read the bodies' overflow pages:
//
//	head:   per event: varint time (Unix ns), bytes kind, bytes tenant,
//	        bytes doc_id, varint rev, varint since, varint body length
//	        (protowire varints and length-prefixed bytes)
//	bodies: the events' encoded bodies without their seq field, in order
//
// The seq field is appended on read (EventRecord.Body has it, as before).
// A decoder never allocates from a length it read: every length is
// checked against the bytes left in its blob (decodeHead).
//
// event_keys (kind, key, first_seq) finds a tenant's (keyTenant) or a
// document's (keyDoc) blocks without scanning the log; readers filter a
// block's events in Go, since a block may hold other tenants' events too.
// Pruning deletes whole blocks below the bound and rewrites the one block
// that straddles it without its earlier events, so every retained block
// starts at a retained event (no floor to consult on read).

// Kinds of event_keys rows.
const (
	keyTenant = 1
	keyDoc    = 2
)

// maxKeysPerInsert bounds the rows of one multi-row event_keys INSERT (3
// bound parameters each); the writer caches a statement per row count.
const maxKeysPerInsert = 64

// blockKey is one event_keys row of a block (without its first_seq).
type blockKey struct {
	kind int
	key  string
}

// blockBuilder encodes one block; reused across blocks by the writer.
type blockBuilder struct {
	first, next int64 // first seq, and the seq the next event must have
	head        []byte
	bodies      []byte
	keys        []blockKey
	seen        map[blockKey]struct{}
}

// reset starts a block at seq first.
func (b *blockBuilder) reset(first int64) {
	b.first, b.next = first, first
	b.head, b.bodies = b.head[:0], b.bodies[:0]
	b.keys = b.keys[:0]
	if b.seen == nil {
		b.seen = map[blockKey]struct{}{}
	}
	clear(b.seen)
}

// len is the number of events added since reset.
func (b *blockBuilder) len() int { return int(b.next - b.first) }

// add appends the event with seq seq, whose body without its seq field is
// body; seqs must follow each other.
func (b *blockBuilder) add(seq int64, e *encEvent, body []byte) error {
	if seq != b.next {
		return fmt.Errorf("store: event block at seq %d: event %d does not follow %d", b.first, seq, b.next-1)
	}
	b.next++
	b.head = appendHead(b.head, e, len(body))
	b.bodies = append(b.bodies, body...)
	b.addKey(keyTenant, e.tenant)
	if e.doc != "" {
		b.addKey(keyDoc, e.doc)
	}
	return nil
}

func (b *blockBuilder) addKey(kind int, key string) {
	k := blockKey{kind, key}
	if _, ok := b.seen[k]; ok {
		return
	}
	b.seen[k] = struct{}{}
	b.keys = append(b.keys, k)
}

// release drops buffers grown by an unusually large block, so one large
// group does not keep its memory for the writer's lifetime.
func (b *blockBuilder) release() {
	const keep = 1 << 20
	if cap(b.head)+cap(b.bodies) > keep {
		b.head, b.bodies = nil, nil
	}
	if len(b.seen) > 4096 {
		b.seen = nil
	}
	clear(b.keys[:cap(b.keys)])
}

func appendHead(head []byte, e *encEvent, bodyLen int) []byte {
	head = protowire.AppendVarint(head, uint64(e.timeNs))
	head = protowire.AppendString(head, e.kind)
	head = protowire.AppendString(head, e.tenant)
	head = protowire.AppendString(head, e.doc)
	head = protowire.AppendVarint(head, e.rev)
	head = protowire.AppendVarint(head, e.since)
	return protowire.AppendVarint(head, uint64(bodyLen))
}

// execer runs a statement: the writer's cached exec or a transaction's
// ExecContext.
type execer func(ctx context.Context, q string, args ...any) (sql.Result, error)

// write inserts the block and its event_keys rows.
func (b *blockBuilder) write(ctx context.Context, exec execer) error {
	if b.len() == 0 {
		return nil
	}
	if _, err := exec(ctx, "INSERT INTO event_blocks (first_seq, last_seq, head, bodies) VALUES (?,?,?,?)",
		b.first, b.next-1, b.head, b.bodies); err != nil {
		return fmt.Errorf("store: append events: %w", err)
	}
	args := make([]any, 0, 3*min(len(b.keys), maxKeysPerInsert))
	for i := 0; i < len(b.keys); {
		n := min(len(b.keys)-i, maxKeysPerInsert)
		args = args[:0]
		for _, k := range b.keys[i : i+n] {
			args = append(args, k.kind, k.key, b.first)
		}
		if _, err := exec(ctx, insertKeysQueries[n], args...); err != nil {
			return fmt.Errorf("store: append event keys: %w", err)
		}
		i += n
	}
	return nil
}

// insertKeysQueries[n] is the INSERT of n event_keys rows.
var insertKeysQueries = func() []string {
	q := make([]string, maxKeysPerInsert+1)
	var b strings.Builder
	b.WriteString("INSERT INTO event_keys (kind, key, first_seq) VALUES ")
	for i := 1; i <= maxKeysPerInsert; i++ {
		if i > 1 {
			b.WriteString(",")
		}
		b.WriteString("(?,?,?)")
		q[i] = b.String()
	}
	return q
}()

// blockEvent is one event of a decoded block head. kind, tenant and doc
// are slices of the head; the body is bodies[off : off+n].
type blockEvent struct {
	timeNs            int64
	kind, tenant, doc []byte
	rev, since        uint64
	off, n            int
}

// errDamagedBlock reports a block whose blobs do not decode.
var errDamagedBlock = errors.New("store: event block is damaged")

// headReader consumes a block head; the first malformed field sets bad.
type headReader struct {
	b   []byte
	bad bool
}

func (r *headReader) varint() uint64 {
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *headReader) bytes() []byte {
	v, n := protowire.ConsumeBytes(r.b)
	if n < 0 {
		r.bad = true
		return nil
	}
	r.b = r.b[n:]
	return v
}

// decodeHead parses the head of the block first..last, whose bodies blob
// is bodiesLen bytes, into evs (reused). It fails unless the head holds
// exactly last-first+1 events whose bodies fill exactly bodiesLen bytes.
// Every length is bounded by the bytes left (protowire checks it), and evs
// grows by one per event parsed, never by a count read from the file.
func decodeHead(evs []blockEvent, first, last int64, head []byte, bodiesLen int) ([]blockEvent, error) {
	evs = evs[:0]
	want := last - first + 1
	r := headReader{b: head}
	off := 0
	for len(r.b) > 0 && !r.bad {
		if int64(len(evs)) >= want {
			r.bad = true
			break
		}
		e := blockEvent{timeNs: int64(r.varint()), kind: r.bytes(), tenant: r.bytes(), doc: r.bytes(),
			rev: r.varint(), since: r.varint()}
		n := r.varint()
		if r.bad || n > uint64(bodiesLen-off) {
			r.bad = true
			break
		}
		e.off, e.n = off, int(n)
		off += int(n)
		evs = append(evs, e)
	}
	if r.bad || int64(len(evs)) != want || off != bodiesLen {
		return evs[:0], fmt.Errorf("%w: block at seq %d (to %d, %d events decoded)", errDamagedBlock, first, last, len(evs))
	}
	return evs, nil
}

// seqFieldLen is the encoded size of an event's seq field.
func seqFieldLen(seq uint64) int {
	return protowire.SizeTag(eventFieldSeq) + protowire.SizeVarint(seq)
}

// appendSeqField appends the seq field of an encoded event.
func appendSeqField(b []byte, seq uint64) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, eventFieldSeq, protowire.VarintType), seq)
}
