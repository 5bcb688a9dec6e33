package pgstore

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// claimsChannel is the NOTIFY channel of redemptions: a replica that
// redeems a claim tells the replica driving the claim's document, which
// resumes the deferred entity at its peer (docs/scale-out.md, Claims
// across replicas). The payload is "<replica id> <claim id> <doc id>".
const claimsChannel = "pipestream_claims"

// claimNotes holds the hook told of redemptions committed by other
// replicas.
type claimNotes struct {
	hook atomic.Pointer[func(docID, claimID string)]
}

// SetClaimRedeemedHook sets the function told of every claim another
// replica redeemed on a document this Store holds the lease of (the
// bridge resumes the entity): after the redeeming transaction committed,
// and again for every such claim when the listener connection is
// re-established (notifications sent while it was down are lost). It is
// called from the listener goroutine and must not block; it may be told
// of one claim more than once.
func (s *Store) SetClaimRedeemedHook(f func(docID, claimID string)) {
	if f == nil {
		s.claims.hook.Store(nil)
		return
	}
	s.claims.hook.Store(&f)
}

// notifyRedeemed queues the redemption's notification in the redeeming
// transaction: PostgreSQL delivers it at COMMIT, and never for a
// transaction that rolled back.
func notifyRedeemed(ctx context.Context, tx pgx.Tx, me, claimID, docID string) error {
	_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", claimsChannel, me+" "+claimID+" "+docID)
	return err
}

// claimNotified hands a claimsChannel notification of another replica to
// the hook when this Store holds the document.
func (s *Store) claimNotified(payload string) {
	parts := strings.SplitN(payload, " ", 3)
	if len(parts) != 3 || parts[0] == s.lease.me {
		return // malformed, or our own redemption (the bridge resumed it)
	}
	s.tellRedeemed(parts[2], parts[1])
}

func (s *Store) tellRedeemed(docID, claimID string) {
	f := s.claims.hook.Load()
	if f == nil || !s.holds(docID) {
		return
	}
	(*f)(docID, claimID)
}

// holds reports whether this Store holds docID's lease.
func (s *Store) holds(docID string) bool {
	s.lease.mu.Lock()
	defer s.lease.mu.Unlock()
	_, ok := s.lease.held[docID]
	return ok
}

// redeemedOfHeldSQL lists the claims in state $2 of the non-terminal
// documents replica $1 owns. The documents are an InitPlan array and
// their claims are read through claims_doc ("= ANY"). The ids are cast
// to the collation of claims.doc_id (documents.id is "C"): compared in
// "C", as the old join compared them, claims_doc cannot serve the
// comparison, and the planner hashed the owned documents and read every
// claim of the history to probe them, 203,500 rows for none at 200,000
// documents (TestRedeemedOfHeldScansOnlyHeldClaims).
const redeemedOfHeldSQL = `SELECT doc_id, claim_id FROM claims
	WHERE doc_id = ANY(ARRAY(SELECT id COLLATE "default" FROM documents WHERE owner = $1 AND NOT terminal)) AND state = $2`

// redeemedOfHeld tells the hook of every REDEEMED claim of a non-terminal
// document this replica owns: after a listener reconnect, the
// notifications it missed. The bridge ignores claims it knows redeemed.
func (s *Store) redeemedOfHeld(ctx context.Context, conn *pgx.Conn) error {
	if s.claims.hook.Load() == nil {
		return nil
	}
	rows, err := conn.Query(ctx, redeemedOfHeldSQL, s.lease.me, int32(gatewayv1.ClaimCheck_REDEEMED))
	if err != nil {
		return err
	}
	var docs, ids []string
	for rows.Next() {
		var doc, id string
		if err := rows.Scan(&doc, &id); err != nil {
			rows.Close()
			return err
		}
		docs, ids = append(docs, doc), append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range docs {
		s.tellRedeemed(docs[i], ids[i])
	}
	return nil
}
