package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// takeoverDocs is how many held documents the takeover measurement moves.
const takeoverDocs = 8

// takeoverTimeout bounds each wait of the takeover measurement (the
// default lease lasts 10 s).
const takeoverTimeout = 90 * time.Second

// takeoverPoll is how often the takeover measurement reads the database;
// it is the resolution of the times it reports.
const takeoverPoll = 50 * time.Millisecond

// takeover measures the takeover of a killed gateway's documents: two
// gateways with the default lease timings on the --store database, A and
// B; takeoverDocs documents submitted to A whose processing the fault
// processor defers (a claim check, so they stay in flight, held by A);
// then A is killed with SIGKILL (no lease release) and the bench reads the
// database until B holds every document (lease epoch 2) and its new
// attempts are deferred again (a second claim each), redeems the first
// claims through B, and reads until every document is terminal. Times are
// since the kill.
func (b *runner) takeover(ctx context.Context) (Result, error) {
	o := b.o
	o.GRPCAddr, o.HTTPAddr = "", ""
	o.PprofAddr = "" // two gateways at once: they cannot share the address
	a, err := connectGateway(ctx, o, "--store", b.o.Store)
	if err != nil {
		return Result{}, fmt.Errorf("gateway A: %w", err)
	}
	defer a.close()
	gb, err := connectGateway(ctx, o, "--store", b.o.Store)
	if err != nil {
		return Result{}, fmt.Errorf("gateway B: %w", err)
	}
	defer gb.close()
	conn, err := pgx.Connect(ctx, b.o.Store)
	if err != nil {
		return Result{}, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())

	ids, err := submitHeld(ctx, a)
	if err != nil {
		return Result{}, fmt.Errorf("%w\n%s", err, a.logTail())
	}
	claims, err := waitClaims(ctx, conn, ids)
	if err != nil {
		return Result{}, fmt.Errorf("%w\n%s", err, a.logTail())
	}
	if err := a.cmd.Process.Kill(); err != nil {
		return Result{}, fmt.Errorf("kill gateway A: %w", err)
	}
	<-a.exited
	killed := time.Now()
	first, all, err := waitCount(ctx, conn, ids, "SELECT count(*) FROM documents WHERE id = ANY($1) AND lease_epoch >= 2", killed)
	if err != nil {
		return Result{}, fmt.Errorf("takeover: %w\n%s", err, gb.logTail())
	}
	// B's attempt is deferred again with a claim of its own; the first
	// claim resumes through it, so it must be stored first.
	if _, _, err := waitCount(ctx, conn, ids, `SELECT count(*) FROM (SELECT doc_id FROM claims
		WHERE doc_id = ANY($1) AND state = 1 GROUP BY doc_id HAVING count(*) >= 2) c`, killed); err != nil {
		return Result{}, fmt.Errorf("the new attempts' claim checks: %w\n%s", err, gb.logTail())
	}
	for _, c := range claims {
		if _, err := gb.docs.RedeemClaimCheck(gb.ctx(ctx), &gatewayv1.RedeemClaimCheckRequest{ClaimId: c}); err != nil {
			return Result{}, fmt.Errorf("redeem claim %s through B: %w\n%s", c, err, gb.logTail())
		}
	}
	_, terminal, err := waitCount(ctx, conn, ids, "SELECT count(*) FROM documents WHERE id = ANY($1) AND terminal", killed)
	if err != nil {
		return Result{}, fmt.Errorf("finish: %w\n%s", err, gb.logTail())
	}
	b.note("store: takeover after kill -9 of a gateway holding %d deferred documents (default lease timings): the first taken over (lease epoch 2) after %.1f s, all after %.1f s, all terminal after %.1f s (the first attempts' claims redeemed through the other gateway once all were taken over and deferred again); read from the database every %s",
		len(ids), first.Seconds(), all.Seconds(), terminal.Seconds(), takeoverPoll)
	return Result{Phase: "store", Path: fmt.Sprintf("takeover after kill -9, %d held docs, all at lease epoch 2", len(ids)),
		Unit: "s", Rate: all.Seconds(), Count: int64(len(ids)), Seconds: all.Seconds(),
		Note: fmt.Sprintf("first taken over %.1f s, all %.1f s, all terminal %.1f s after the kill", first.Seconds(), all.Seconds(), terminal.Seconds())}, nil
}

// submitHeld submits takeoverDocs small documents to g for the fault
// processor, which defers them with a claim check of 5 minutes.
func submitHeld(ctx context.Context, g *gatewayProc) ([]string, error) {
	ids := make([]string, 0, takeoverDocs)
	for i := range takeoverDocs {
		doc, err := g.docs.SubmitDocument(g.ctx(ctx), &gatewayv1.SubmitDocumentRequest{
			Content: patternBlock[:4096], ContentType: "application/octet-stream",
			Split:    &gatewayv1.SplitOptions{Processor: "fault"},
			Metadata: map[string]string{"pipestream.fault": "defer", "pipestream.claim-ttl-ms": "300000"},
		})
		if err != nil {
			return nil, fmt.Errorf("submit held document %d: %w", i, err)
		}
		ids = append(ids, doc.GetId())
	}
	return ids, nil
}

// waitClaims waits until every document of ids has an ISSUED claim (its
// processing is deferred, the document in flight) and returns the claims.
func waitClaims(ctx context.Context, conn *pgx.Conn, ids []string) ([]string, error) {
	deadline := time.Now().Add(takeoverTimeout)
	for {
		rows, err := conn.Query(ctx, "SELECT min(claim_id) FROM claims WHERE doc_id = ANY($1) AND state = $2 GROUP BY doc_id",
			ids, int32(gatewayv1.ClaimCheck_ISSUED))
		if err != nil {
			return nil, fmt.Errorf("read claims: %w", err)
		}
		claims, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read claims: %w", err)
		}
		if len(claims) == len(ids) {
			return claims, nil
		}
		if err := pause(ctx, deadline, "the held documents' claim checks ("+strconv.Itoa(len(claims))+" of "+strconv.Itoa(len(ids))+")"); err != nil {
			return nil, err
		}
	}
}

// waitCount reads sql (a count over $1 = ids) until it reaches len(ids) and
// returns when it first was positive and when it reached len(ids), since
// t0.
func waitCount(ctx context.Context, conn *pgx.Conn, ids []string, sql string, t0 time.Time) (first, all time.Duration, err error) {
	deadline := time.Now().Add(takeoverTimeout)
	for {
		var n int
		if err := conn.QueryRow(ctx, sql, ids).Scan(&n); err != nil {
			return 0, 0, err
		}
		now := time.Since(t0)
		if n > 0 && first == 0 {
			first = now
		}
		if n == len(ids) {
			return first, now, nil
		}
		if err := pause(ctx, deadline, strconv.Itoa(n)+" of "+strconv.Itoa(len(ids))+" documents"); err != nil {
			return 0, 0, err
		}
	}
}

// pause waits takeoverPoll, or fails past deadline or when ctx ends.
func pause(ctx context.Context, deadline time.Time, what string) error {
	if time.Now().After(deadline) {
		return fmt.Errorf("not within %s: %s", takeoverTimeout, what)
	}
	t := time.NewTimer(takeoverPoll)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
