package store

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// StripFields drops the given field numbers from an encoded message without
// decoding it (cheaper than a deep clone of the caller's message). Both
// backends store a document without its entity, digest and claim lists.
func StripFields(b []byte, drop ...protowire.Number) ([]byte, error) {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("store: re-encode document: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, fmt.Errorf("store: re-encode document: %w", protowire.ParseError(m))
		}
		keep := true
		for _, d := range drop {
			if num == d {
				keep = false
			}
		}
		if keep {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out, nil
}

// ClaimStateUpsertSQL is the SET clause for state and redeem_time of a
// claim upsert (ON CONFLICT ... DO UPDATE), shared by the backends: an
// upsert to CANCELLED (4) leaves a stored claim that is no longer ISSUED (1)
// as it is, so that a redemption committed first is never overwritten by
// the cancellation of its document (ClaimRecord).
const ClaimStateUpsertSQL = `state = CASE WHEN excluded.state = 4 AND claims.state <> 1 THEN claims.state ELSE excluded.state END,
		redeem_time = CASE WHEN excluded.state = 4 AND claims.state <> 1 THEN claims.redeem_time ELSE excluded.redeem_time END`
