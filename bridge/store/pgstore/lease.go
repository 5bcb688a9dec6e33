package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/internal/fence"
)

// Leases: exactly one replica drives a non-terminal document at a time
// (docs/scale-out.md, Leases and fencing). The documents row carries the
// lease: owner (a replica id), lease_epoch (bumped at every takeover) and
// lease_expires (the DATABASE's clock, so replicas' clocks need not agree).
//
//   - A Create takes the lease (epoch 1) in the INSERT.
//   - The renewer extends every lease this Store holds, in one UPDATE, every
//     RenewInterval.
//   - AcquireLeases takes over non-terminal documents whose lease expired
//     (or that have none) with epoch+1: the takeover scan of the bridge.
//   - Fencing: an update of a held document carries WHERE owner = me AND
//     lease_epoch = mine; when it matches no row because another replica
//     took over, Commit answers *store.LeaseLostError.
//   - Local deadline: the Store stops driving (the hook, then refusing
//     writes) at last successful renew start + LeaseDuration - LeaseMargin
//     on the local monotonic clock, before the lease can expire in the
//     database, when renewals fail (database unreachable).
//
// Updates of documents this Store does not hold (a document read by a
// replica that never drove it) are conditional on rev only, as before.

// heldLease is one document this Store drives.
type heldLease struct {
	epoch int64
	since time.Time // local time it was added (a renew started before may not see it)
}

// leases is the Store's lease state. mu guards everything below it.
type leases struct {
	me                        string
	log                       *slog.Logger
	lease, renewEvery, margin time.Duration

	mu       sync.Mutex
	held     map[string]heldLease
	lost     map[string]string // doc id -> why; writes are refused
	deadline time.Time         // stop driving at (local monotonic clock)
	timer    *time.Timer
	hook     func(ids []string)
	failing  bool          // renewals fail (logged once per outage)
	kick     chan struct{} // renew now (renewLoop)
}

func newReplicaID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (l *leases) init(o Options, now time.Time) {
	l.me, l.lease, l.renewEvery, l.margin, l.log = o.ReplicaID, o.LeaseDuration, o.RenewInterval, o.LeaseMargin, o.Logger
	l.held, l.lost = map[string]heldLease{}, map[string]string{}
	l.kick = make(chan struct{}, 1)
	l.deadline = now.Add(l.lease - l.margin)
	l.timer = time.AfterFunc(l.deadline.Sub(now), l.expire)
}

func (l *leases) secs() float64 { return l.lease.Seconds() }

// ReplicaID is the owner id this Store writes into the leases it holds.
func (s *Store) ReplicaID() string { return s.lease.me }

// SetLeaseLostHook sets the function told, without any Store lock held,
// which documents this Store stopped driving: taken over by another
// replica (found by the renewer or by a fenced write) or not renewed in
// time. The documents' later writes are refused with ErrLeaseLost.
func (s *Store) SetLeaseLostHook(f func(docIDs []string)) {
	s.lease.mu.Lock()
	s.lease.hook = f
	s.lease.mu.Unlock()
}

// HeldLeases reports the documents this Store currently drives.
func (s *Store) HeldLeases() []string {
	l := &s.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.held))
	for id := range l.held {
		out = append(out, id)
	}
	return out
}

// StopRenewing stops the renewer as a killed process would (for tests and
// drills): the database leases run out while this Store still believes it
// holds them, until its local deadline passes.
func (s *Store) StopRenewing() {
	if s.stopRenew != nil {
		s.stopRenew()
	}
}

// loseLocked moves ids from held to lost. Caller holds l.mu.
func (l *leases) loseLocked(ids []string, why string) {
	for _, id := range ids {
		delete(l.held, id)
		l.lost[id] = why
	}
}

// notify calls the hook with ids (no lock held).
func (l *leases) notify(ids []string) {
	if len(ids) == 0 {
		return
	}
	l.mu.Lock()
	h := l.hook
	l.mu.Unlock()
	if h != nil {
		h(ids)
	}
}

// verdictLocked is the fencing rule (bridge/store/internal/fence) for a
// write touching document id at now. Caller holds l.mu.
func (l *leases) verdictLocked(id string, now time.Time) fence.Verdict {
	w, lost := l.lost[id]
	h, held := l.held[id]
	return fence.Check(fence.Lease{Lost: lost, Why: w, Held: held, Epoch: h.epoch}, now, l.deadline)
}

// fence decides, before a Commit, which updates carry the lease condition
// (held documents: their epoch) and refuses a batch touching a document
// whose lease is lost or past the local deadline. A document refused at
// the deadline leaves held (lostByWrite): the renewer must not extend a
// lease nobody drives any more, so that it expires and a takeover scan
// (this replica's too, once its renewals work again) picks it up.
func (l *leases) fence(p *prepared, now time.Time) error {
	err := l.check(p, now)
	if err != nil {
		l.lostByWrite(err)
	}
	return err
}

// check is fence without the bookkeeping of a refusal.
func (l *leases) check(p *prepared, now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost []string
	why := ""
	for i := range p.updates {
		id := p.updates[i].rec.Doc.GetId()
		v := l.verdictLocked(id, now)
		if v.Refused {
			lost, why = append(lost, id), v.Why
			continue
		}
		if !v.Fenced {
			continue
		}
		if p.fence == nil {
			p.fence = map[string]int64{}
		}
		p.fence[id] = v.Epoch
	}
	if len(lost) == 0 {
		lost, why = l.fenceChildrenLocked(p, now)
	}
	if len(lost) > 0 {
		return &store.LeaseLostError{DocIDs: lost, Reason: why}
	}
	p.owner, p.leaseSecs = l.me, l.secs()
	return nil
}

// fenceChildrenLocked sets p.childFence: the held documents whose entity,
// digest, claim or inline payload rows the batch writes without updating
// the document itself. It returns those whose lease is lost or past the
// local deadline (the batch is refused). Caller holds l.mu.
func (l *leases) fenceChildrenLocked(p *prepared, now time.Time) (lost []string, why string) {
	seen := map[string]bool{}
	for i := range p.updates {
		seen[p.updates[i].rec.Doc.GetId()] = true // fenced by their UPDATE
	}
	if p.create != nil {
		seen[p.create.rec.Doc.GetId()] = true
	}
	check := func(id string) {
		if seen[id] {
			return
		}
		seen[id] = true
		v := l.verdictLocked(id, now)
		if v.Refused {
			lost, why = append(lost, id), v.Why
			return
		}
		if !v.Fenced {
			return
		}
		if p.childFence == nil {
			p.childFence = map[string]int64{}
		}
		p.childFence[id] = v.Epoch
	}
	b := p.b
	for i := range b.Entities {
		check(b.Entities[i].DocID)
	}
	for i := range b.Digests {
		check(b.Digests[i].DocID)
	}
	for i := range b.Claims {
		check(b.Claims[i].Claim.GetDocumentId())
	}
	for i := range b.Payloads {
		check(b.Payloads[i].DocID)
	}
	return lost, why
}

// childFenceSQL locks (FOR SHARE, until COMMIT: a takeover's UPDATE waits)
// and counts the rows of $2 still held by $1 at the epochs $3.
const childFenceSQL = `SELECT d.id FROM documents d
	JOIN unnest($2::text[], $3::bigint[]) AS h(id, epoch) ON d.id = h.id
	WHERE d.owner = $1 AND d.lease_epoch = h.epoch AND NOT d.terminal ORDER BY d.id FOR SHARE OF d`

// childFenceStatement is the fence check of p's child-only documents
// (childFenceSQL and its arguments) and how many rows it must return; n =
// 0 when the batch needs none.
func childFenceStatement(p *prepared) (sql string, args []any, n int64) {
	if len(p.childFence) == 0 {
		return "", nil, 0
	}
	ids := make([]string, 0, len(p.childFence))
	epochs := make([]int64, 0, len(p.childFence))
	for _, id := range slices.Sorted(maps.Keys(p.childFence)) { // lock order: by id (renewSQL)
		ids, epochs = append(ids, id), append(epochs, p.childFence[id])
	}
	return childFenceSQL, []any{p.owner, ids, epochs}, int64(len(ids))
}

// childFenceCheck checks childFenceStatement's outcome in the pipeline: a
// missing row sends the commit to the step-by-step path (checkChildFence).
func childFenceCheck(n int64) func(br pgx.BatchResults) error {
	return func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil || tag.RowsAffected() != n {
			return errSlowPath
		}
		return nil
	}
}

// checkChildFence runs the fence check of p's child-only documents in tx
// (the step-by-step path): a document no longer held by this replica at
// its epoch fails the batch with a *store.LeaseLostError naming it.
func checkChildFence(ctx context.Context, tx pgx.Tx, p *prepared) error {
	sql, args, n := childFenceStatement(p)
	if n == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("pgstore: lease check: %w", err)
	}
	ok := map[string]bool{}
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { ok[id] = true; return nil }); err != nil {
		return fmt.Errorf("pgstore: lease check: %w", err)
	}
	var lost []string
	for id := range p.childFence {
		if !ok[id] {
			lost = append(lost, id)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return &store.LeaseLostError{DocIDs: lost, Reason: "taken over by another replica (or finished) before this write of its rows"}
}

// committed records what a successful Commit changed: a created document is
// held (epoch 1), a terminal one is released.
func (l *leases) committed(p *prepared, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.create != nil && !p.create.terminal {
		l.held[p.create.rec.Doc.GetId()] = heldLease{epoch: 1, since: now}
		if !now.Before(l.deadline) {
			l.kickRenewLocked() // the database answers again: renew now, not at the next tick
		}
	}
	for i := range p.updates {
		if p.updates[i].terminal {
			delete(l.held, p.updates[i].rec.Doc.GetId())
		}
	}
}

// renewLoop renews every RenewInterval, and at once when kicked (a
// commit succeeded while past the local deadline), until ctx ends.
func (s *Store) renewLoop(ctx context.Context) {
	t := time.NewTicker(s.lease.renewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.lease.kick:
		}
		s.renew(ctx)
	}
}

// kickRenewLocked asks the renewer for a renewal now. Caller holds l.mu.
func (l *leases) kickRenewLocked() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// renewSQL locks the rows in id order first (as a commit's updates are
// ordered, prepare), so a renewal and a group commit never deadlock.
const renewSQL = `WITH l AS (SELECT id FROM documents WHERE id = ANY($3::text[]) AND owner = $1 AND NOT terminal
		ORDER BY id FOR NO KEY UPDATE)
	UPDATE documents d SET lease_expires = clock_timestamp() + make_interval(secs => $2)
	FROM l WHERE d.id = l.id RETURNING d.id, d.lease_epoch`

// renew extends the held leases in one UPDATE. On success the local
// deadline moves to start + lease - margin; a held document the UPDATE did
// not find (with its epoch) was taken over and is lost.
func (s *Store) renew(ctx context.Context) {
	l := &s.lease
	start := time.Now()
	l.mu.Lock()
	ids := make([]string, 0, len(l.held))
	for id := range l.held {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, l.renewEvery)
	defer cancel()
	rows, err := s.pool.Query(rctx, renewSQL, l.me, l.secs(), ids)
	var got map[string]int64
	if err == nil {
		got = map[string]int64{}
		var id string
		var ep int64
		_, err = pgx.ForEachRow(rows, []any{&id, &ep}, func() error { got[id] = ep; return nil })
	}
	if err != nil {
		l.mu.Lock()
		first := !l.failing
		l.failing = true
		l.mu.Unlock()
		if first && ctx.Err() == nil {
			s.log.Warn("pgstore: renewing document leases failed; retrying every renew interval, stopping to drive them at the local deadline",
				"held", len(ids), "in", time.Until(l.deadlineNow()).Round(time.Millisecond), "err", err)
		}
		return
	}
	s.lease.notify(s.lease.renewed(start, got))
}

// renewed applies a successful renewal that started at start.
func (l *leases) renewed(start time.Time, got map[string]int64) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lost []string
	for id, h := range l.held {
		if h.since.After(start) {
			continue // added after the renewal read the table
		}
		if ep, ok := got[id]; !ok || ep != h.epoch {
			lost = append(lost, id)
		}
	}
	l.loseLocked(lost, "taken over by another replica")
	l.failing = false
	l.deadline = start.Add(l.lease - l.margin)
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = time.AfterFunc(time.Until(l.deadline), l.expire)
	return lost
}

func (l *leases) deadlineNow() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// expire runs at the local deadline: unless a renewal moved it meanwhile,
// every held document is lost.
func (l *leases) expire() {
	l.mu.Lock()
	if time.Now().Before(l.deadline) {
		l.mu.Unlock()
		return
	}
	ids := make([]string, 0, len(l.held))
	for id := range l.held {
		ids = append(ids, id)
	}
	l.loseLocked(ids, "not renewed before the local deadline (database unreachable?)")
	l.mu.Unlock()
	if len(ids) > 0 {
		l.log.Warn("pgstore: document leases not renewed before the local deadline; stopped driving them", "docs", len(ids))
	}
	l.notify(ids)
}

const acquireSQL = `UPDATE documents SET owner = $1, lease_epoch = lease_epoch + 1,
	lease_expires = clock_timestamp() + make_interval(secs => $2)
	WHERE id IN (SELECT id FROM documents WHERE NOT terminal
		AND (owner IS NULL OR lease_expires < clock_timestamp())
		ORDER BY create_time, id LIMIT $3 FOR UPDATE SKIP LOCKED)
	RETURNING id, lease_epoch`

// AcquireLeases takes over up to limit non-terminal documents whose lease
// expired or that have no owner (written before leases, or by a replica
// that released them), with a new epoch, and returns them as
// ListNonTerminal does (oldest first, without entities). The caller drives
// them from now on. Nothing is taken while this Store is past its local
// deadline (its renewals fail).
func (s *Store) AcquireLeases(ctx context.Context, limit int) ([]*store.DocumentRecord, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.wg.Done()
	l := &s.lease
	l.mu.Lock()
	past := !time.Now().Before(l.deadline)
	l.mu.Unlock()
	if past || limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, acquireSQL, l.me, l.secs(), limit)
	if err != nil {
		return nil, mapErr("acquire leases", err)
	}
	taken := map[string]int64{}
	var id string
	var ep int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &ep}, func() error { taken[id] = ep; return nil }); err != nil {
		return nil, mapErr("acquire leases", err)
	}
	if len(taken) == 0 {
		return nil, nil
	}
	now := time.Now()
	ids := make([]string, 0, len(taken))
	l.mu.Lock()
	for id, ep := range taken {
		l.held[id] = heldLease{epoch: ep, since: now}
		delete(l.lost, id)
		ids = append(ids, id)
	}
	l.mu.Unlock()
	recs, err := collect(ctx, s.pool, "read acquired documents", scanDocOnly,
		"SELECT "+docCols+" FROM documents WHERE id = ANY($1::text[]) ORDER BY create_time, id", ids)
	if err != nil {
		return nil, fmt.Errorf("pgstore: read acquired documents (their leases stay held until they expire): %w", err)
	}
	return recs, nil
}

// leaseLost classifies an update of a fenced document that matched no row.
func leaseLost(ctx context.Context, tx pgx.Tx, id, tenant, me string, epoch int64) error {
	var owner *string
	var ep int64
	err := tx.QueryRow(ctx, "SELECT owner, lease_epoch FROM documents WHERE id = $1 AND tenant = $2", id, tenant).Scan(&owner, &ep)
	if err != nil {
		return nil // not found or unreadable: the caller's rev check reports it
	}
	if owner == nil || *owner != me || ep != epoch {
		o := "nobody"
		if owner != nil {
			o = *owner
		}
		return &store.LeaseLostError{DocIDs: []string{id},
			Reason: fmt.Sprintf("held by replica %s at epoch %d, this replica %s had epoch %d", o, ep, me, epoch)}
	}
	return nil
}

// lostByWrite records documents a fenced write found taken over.
func (l *leases) lostByWrite(err error) {
	var e *store.LeaseLostError
	if !errors.As(err, &e) {
		return
	}
	l.mu.Lock()
	var ids []string
	for _, id := range e.DocIDs {
		if _, ok := l.held[id]; ok {
			ids = append(ids, id)
		}
	}
	l.loseLocked(ids, e.Reason)
	l.mu.Unlock()
	l.notify(ids)
}

// releaseSQL hands leases back: only rows this replica still holds at the
// epoch it holds them (a document taken over meanwhile is not touched).
// owner NULL makes the row acquirable at once by any replica's next scan.
const releaseSQL = `UPDATE documents d SET owner = NULL, lease_expires = clock_timestamp()
	FROM unnest($2::text[], $3::bigint[]) AS h(id, epoch)
	WHERE d.id = h.id AND d.owner = $1 AND d.lease_epoch = h.epoch AND NOT d.terminal`

// releaseLeases runs at Close, after every call in flight ended and the
// renewer stopped: the bridge has stopped writing for the documents, so it
// hands their leases back in one fenced UPDATE (bounded by releaseTimeout)
// and forgets them. Leases past the local deadline are not held any more
// and are not touched. A failed release is logged: the leases then expire
// as after a crash.
func (s *Store) releaseLeases() {
	l := &s.lease
	l.mu.Lock()
	ids := make([]string, 0, len(l.held))
	epochs := make([]int64, 0, len(l.held))
	for id, h := range l.held {
		ids, epochs = append(ids, id), append(epochs, h.epoch)
	}
	past := !time.Now().Before(l.deadline)
	l.held = map[string]heldLease{}
	l.mu.Unlock()
	if len(ids) == 0 || past {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	tag, err := s.pool.Exec(ctx, releaseSQL, l.me, ids, epochs)
	if err != nil {
		s.log.Warn("pgstore: releasing document leases at close failed; they expire as after a crash", "held", len(ids), "err", err)
		return
	}
	s.log.Info("pgstore: released document leases at close", "released", tag.RowsAffected(), "held", len(ids))
}

// leaseFence is the lease check of one streamed payload's Sync: the
// document's epoch when this Store holds its lease (fenced), else nothing.
type leaseFence struct {
	me, id string
	epoch  int64
	fenced bool
}

// payloadFence decides the lease check of a Sync of docID's payload: none
// when this Store does not drive docID (an upload before its Create, a
// replica that never held it), a refusal when its lease is lost or past
// the local deadline, else the epoch the row must still carry.
func (l *leases) payloadFence(docID string, now time.Time) (leaseFence, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.verdictLocked(docID, now)
	switch {
	case v.Refused:
		return leaseFence{}, &store.LeaseLostError{DocIDs: []string{docID}, Reason: v.Why}
	case !v.Fenced:
		return leaseFence{}, nil
	}
	return leaseFence{me: l.me, id: docID, epoch: v.Epoch, fenced: true}, nil
}

// check runs in the Sync transaction: the document row must still name
// this replica at the epoch (locked FOR SHARE until COMMIT, so a takeover
// waits for the Sync and then supersedes its payload with its own).
func (f leaseFence) check(ctx context.Context, tx pgx.Tx) error {
	if !f.fenced {
		return nil
	}
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM documents WHERE id = $1 AND owner = $2 AND lease_epoch = $3 AND NOT terminal FOR SHARE`,
		f.id, f.me, f.epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return &store.LeaseLostError{DocIDs: []string{f.id},
			Reason: fmt.Sprintf("taken over by another replica (or finished) before this payload of epoch %d was published", f.epoch)}
	}
	if err != nil {
		return fmt.Errorf("pgstore: lease check: %w", err)
	}
	return nil
}
