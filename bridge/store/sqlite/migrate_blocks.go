package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
)

// migratePage is how many event rows eventsToBlocks reads per query.
const migratePage = 4096

// eventsToBlocks moves every row of the events table (schema 5) into
// event_blocks and event_keys, runs of consecutive seqs as blocks of up to
// maxBlockEvents events, each body without its trailing seq field, and
// drops the events table. The counters in meta (event_count, event_bytes:
// sizes with the seq field) stay as they are.
func eventsToBlocks(ctx context.Context, tx *sql.Tx) error {
	var b blockBuilder
	b.reset(0)
	after := int64(-1)
	for {
		n, err := migrateEventPage(ctx, tx, &b, &after)
		if err != nil {
			return err
		}
		if n < migratePage {
			break
		}
	}
	if err := b.write(ctx, tx.ExecContext); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "DROP TABLE events"); err != nil {
		return fmt.Errorf("drop events: %w", err)
	}
	return nil
}

// migrateEventPage adds the next migratePage events after *after to b,
// writing b out whenever it is full or the next seq does not follow.
func migrateEventPage(ctx context.Context, tx *sql.Tx, b *blockBuilder, after *int64) (int, error) {
	type row struct {
		seq  int64
		e    encEvent
		body []byte
	}
	var page []row
	rows, err := tx.QueryContext(ctx, `SELECT seq, time, kind, tenant, doc_id, rev, since, body FROM events
		WHERE seq > ? ORDER BY seq LIMIT ?`, *after, migratePage)
	if err != nil {
		return 0, fmt.Errorf("read events: %w", err)
	}
	for rows.Next() {
		var r row
		var rev, since int64
		if err := rows.Scan(&r.seq, &r.e.timeNs, &r.e.kind, &r.e.tenant, &r.e.doc, &rev, &since, &r.body); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read events: %w", err)
		}
		r.e.rev, r.e.since = uint64(rev), uint64(since)
		page = append(page, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read events: %w", err)
	}
	for i := range page {
		r := &page[i]
		field := appendSeqField(nil, uint64(r.seq))
		if r.seq < 1 || !bytes.HasSuffix(r.body, field) {
			return 0, fmt.Errorf("event %d: its body does not end with its seq field", r.seq)
		}
		if b.len() == maxBlockEvents || b.len() > 0 && r.seq != b.next {
			if err := b.write(ctx, tx.ExecContext); err != nil {
				return 0, err
			}
			b.reset(r.seq)
		}
		if b.len() == 0 {
			b.reset(r.seq)
		}
		if err := b.add(r.seq, &r.e, r.body[:len(r.body)-len(field)]); err != nil {
			return 0, err
		}
		*after = r.seq
	}
	return len(page), nil
}
