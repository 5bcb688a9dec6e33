// Package pgstore is the gateway's durable state on PostgreSQL (pgx v5,
// pooled): the same records and rules as the SQLite store
// (bridge/store/sqlite; both implement the neutral bridge/store's
// interfaces with its types), shared by any number of gateway replicas on
// one database. It does not link SQLite. See docs/scale-out.md.
//
// # Writes
//
// Every Commit is applied in one READ COMMITTED transaction on a pooled
// connection; concurrent Commits of one replica share one (group commit,
// group.go), commits of different replicas run concurrently. What must be
// exclusive is made so by the database, not by the process:
//
//   - Creates: INSERT ... ON CONFLICT DO NOTHING against the primary key and
//     the unique (tenant, request_id) index. A concurrent create with the
//     same request id on another connection waits for the first one, then
//     answers Duplicate (same body hash) or ErrConflict: request-id
//     idempotency holds across connections and replicas.
//   - Claims: RedeemClaim is one conditional UPDATE (state = ISSUED and not
//     expired). A second redemption waits on the row lock, re-checks the
//     condition against the committed row, and updates nothing: exactly one
//     redemption succeeds, whichever replica runs it.
//   - Updates are conditional on the stored rev (ErrStaleRev), as in SQLite.
//
// # Event sequence
//
// One sequence for the whole cluster, taken from a one-row counter (table
// meta) updated as the LAST statements of the committing transaction. The
// UPDATE holds the row's lock until COMMIT, so event-writing transactions
// take their seqs one after the other, each after the previous one
// committed: seq order is commit order. Therefore when seq n is visible to
// a reader, every seq below n is visible too, and a tail that reads "seq >
// last delivered" never skips a seq that commits later (the commit-order
// problem of a plain SEQUENCE, where nextval is taken early and commits
// late). Seqs never repeat (the counter is transactional and pruning keeps
// it) and stay below 2^53 (ErrSeqExhausted). The cost: event-writing
// transactions are serialised for one statement (the counter UPDATE with
// the INSERT of the events and the NOTIFY, commit.go) and the COMMIT;
// transactions without events are not. A group takes the counter once for
// all its batches' events.
//
// The transaction also sends NOTIFY pipestream_events with its last seq;
// PostgreSQL delivers notifications at commit, in commit order. Every Store
// keeps one extra connection on LISTEN; on a notification beyond what it
// delivered it reads the new events (seq > delivered) and passes them to the
// event hook (SetEventHook) in seq order; LastSeq follows. A replica's own
// Commit delivers its events itself before it returns (after reading any
// earlier seqs of other replicas not yet delivered). After a lost listener
// connection it reconnects and catches up by reading, so nothing is missed.
// No polling.
//
// # Leases
//
// Exactly one replica drives a non-terminal document: the one holding its
// lease (owner, lease_epoch, lease_expires in the documents row). A create
// takes it, a renewer extends every held lease in one UPDATE, AcquireLeases
// takes over expired ones with a new epoch, updates of held documents are
// fenced on (owner, epoch) and fail with store.ErrLeaseLost otherwise (so
// are batches of only their child rows, and the Sync that publishes a
// streamed payload), the Store stops driving at a local deadline when
// renewals fail, and Close hands the held leases back. See lease.go and
// docs/scale-out.md.
//
// # Retention positions
//
// SharePositions (positions.go) lets the event logs of all replicas prune
// the shared log by every replica's clients: eventlog.PositionSharer.
//
// # Migrations
//
// Open migrates the schema in one transaction holding a
// pg_advisory_xact_lock: replicas starting at once migrate one after the
// other; a database from a newer binary is refused.
//
// # Payloads
//
// Spool and result payloads live in PostgreSQL in PayloadChunkSize (256
// KiB) rows, written and read one chunk at a time (never whole in memory),
// at most MaxPayloadSize (64 GiB) each; see payload.go. Small inline
// payloads (Batch.Payloads) are one row, as in SQLite.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/puddle/v2"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pipestream/gateway/bridge/store"
)

// Options configure Open. Zero values take the defaults in params.go.
type Options struct {
	// MaxConns bounds the pool of this Store (the LISTEN connection is
	// extra). 0: the URL's pool_max_conns if it has one, else
	// defaultMaxConns (16).
	MaxConns int32
	// Logger (default slog.Default()).
	Logger *slog.Logger

	// ReplicaID names this Store as the owner of the document leases it
	// holds (default: 16 random hex digits, new at every Open).
	ReplicaID string
	// LeaseDuration is how long a lease lasts without renewal (default
	// DefaultLeaseDuration, 10 s); another replica takes the document over
	// once it expired.
	LeaseDuration time.Duration
	// RenewInterval is how often the renewer extends every held lease, in
	// one UPDATE (default DefaultRenewInterval, 3 s).
	RenewInterval time.Duration
	// LeaseMargin: the Store stops driving its documents at last successful
	// renewal start + LeaseDuration - LeaseMargin, local monotonic clock
	// (default DefaultLeaseMargin, 3 s). RenewInterval must be below
	// LeaseDuration - LeaseMargin.
	LeaseMargin time.Duration
}

// fillLease applies the lease defaults and checks their order.
func (o *Options) fillLease() error {
	if o.ReplicaID == "" {
		o.ReplicaID = newReplicaID()
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = DefaultRenewInterval
	}
	if o.LeaseMargin == 0 {
		o.LeaseMargin = DefaultLeaseMargin
	}
	if o.LeaseMargin < 0 || o.RenewInterval <= 0 || o.RenewInterval >= o.LeaseDuration-o.LeaseMargin {
		return fmt.Errorf("%w: lease timings need 0 < RenewInterval < LeaseDuration - LeaseMargin and LeaseMargin >= 0 (got %v, %v, %v)",
			store.ErrInvalid, o.RenewInterval, o.LeaseDuration, o.LeaseMargin)
	}
	return nil
}

// Store is the PostgreSQL store. Safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	listenCfg *pgx.ConnConfig
	log       *slog.Logger
	tail      tail
	claims    claimNotes  // redemptions by other replicas (claimnotify.go)
	cancels   cancelNotes // cancel requests of other replicas (cancelnotify.go)

	mu     sync.RWMutex // guards closed against new calls
	closed bool
	wg     sync.WaitGroup // calls in flight
	cancel context.CancelFunc
	done   chan struct{} // closed when the listener exits

	txns    atomic.Uint64
	batches atomic.Uint64 // Commits
	retries atomic.Uint64 // pipelined groups rolled back and rerun
	group   grouper       // group commit (group.go)

	lease     leases
	stopRenew context.CancelFunc
	renewDone chan struct{}
}

// IsURL reports whether a --store value selects this backend
// (postgres:// or postgresql://).
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Open connects to the database at url (postgres://user:pass@host:port/db
// ?sslmode=...), migrates the schema, removes payloads a crashed replica
// left half-written, and starts the event listener. Close releases
// everything.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := opts.fillLease(); err != nil {
		return nil, err
	}
	if opts.MaxConns < 0 {
		return nil, fmt.Errorf("%w: MaxConns must not be negative", store.ErrInvalid)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: store URL: %v (want postgres://user:password@host:port/database)", store.ErrInvalid, err)
	}
	switch {
	case opts.MaxConns > 0:
		cfg.MaxConns = opts.MaxConns
	case !strings.Contains(url, "pool_max_conns="):
		cfg.MaxConns = defaultMaxConns
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(idleInTxTimeout.Milliseconds(), 10)
	}
	s := &Store{listenCfg: cfg.ConnConfig.Copy(), log: opts.Logger, done: make(chan struct{})}
	s.tail.s = s
	s.lease.init(opts, time.Now())
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("pgstore: connect: %w", err)
	}
	if err := s.start(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) start(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: connect to %s: %w", s.listenCfg.Host, err)
	}
	if err := migrate(ctx, s.pool); err != nil {
		return err
	}
	if err := s.removeStaleBlobs(ctx); err != nil {
		return err
	}
	var last int64
	if err := s.pool.QueryRow(ctx, "SELECT last_seq FROM meta WHERE id = 1").Scan(&last); err != nil {
		return fmt.Errorf("pgstore: read last_seq: %w", err)
	}
	s.tail.delivered.Store(uint64(last))
	s.tail.reported.Store(uint64(last))
	lctx, cancel := context.WithCancel(context.Background())
	s.tail.ctx = lctx
	ready := make(chan error, 1)
	go func() {
		defer close(s.done)
		s.tail.listen(lctx, ready)
	}()
	select {
	case err := <-ready:
		if err != nil {
			cancel()
			<-s.done
			return fmt.Errorf("pgstore: event listener: %w", err)
		}
	case <-ctx.Done():
		cancel()
		<-s.done
		return ctx.Err()
	}
	s.cancel = cancel
	rctx, stop := context.WithCancel(lctx)
	s.stopRenew, s.renewDone = stop, make(chan struct{})
	go func() {
		defer close(s.renewDone)
		s.renewLoop(rctx)
	}()
	return nil
}

// enter registers a call in flight; ErrClosed after Close.
func (s *Store) enter() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.ErrClosed
	}
	s.wg.Add(1)
	return nil
}

// Close waits for the calls in flight, stops the renewer, hands back the
// leases this Store still holds (releaseLeases: another replica takes
// those documents over at its next scan instead of after the lease),
// stops the listener and closes the pool. Later calls get ErrClosed.
// Idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.stopRenew()
	<-s.renewDone
	s.releaseLeases()
	s.withdrawPositions()
	s.cancel()
	<-s.done
	s.lease.mu.Lock()
	if s.lease.timer != nil {
		s.lease.timer.Stop()
	}
	s.lease.mu.Unlock()
	s.pool.Close()
	return nil
}

// WriterStats reports commit counters: Transactions counts every
// transaction Commits ran (a group is one; a pipelined group that rolled
// back and its reruns count each), Batches the Commits, Retries the
// pipelined groups rolled back and rerun (group.go).
func (s *Store) WriterStats() store.WriterStats {
	return store.WriterStats{Transactions: s.txns.Load(), Batches: s.batches.Load(), Retries: s.retries.Load()}
}

// MaxConns is the size bound of the connection pool (see Options).
func (s *Store) MaxConns() int32 { return s.pool.Config().MaxConns }

// Ping checks that the database answers (for /healthz).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	return nil
}

var errPayloadDone = errors.New("pgstore: payload already finished")

// mapErr wraps a database error of what: a closed pool is ErrClosed, a
// full disk (SQLSTATE 53100) wraps syscall.ENOSPC (the bridge waits and
// retries on it), a missing document (foreign key) is ErrNotFound, a lost
// or refused connection (a database restart) is ErrUnavailable.
func mapErr(what string, err error) error {
	switch {
	case errors.Is(err, puddle.ErrClosedPool):
		return fmt.Errorf("pgstore: %s: %w", what, store.ErrClosed)
	case sqlState(err) == "53100":
		return fmt.Errorf("pgstore: %s: %w (%v)", what, syscall.ENOSPC, err)
	case sqlState(err) == "23503":
		return fmt.Errorf("pgstore: %s: %w: no such document (%v)", what, store.ErrNotFound, err)
	case unavailable(err):
		return fmt.Errorf("pgstore: %s: %w (%v)", what, store.ErrUnavailable, err)
	}
	return fmt.Errorf("pgstore: %s: %w", what, err)
}

// The PostgreSQL backend implements the neutral interfaces (bridge/store).
var (
	_ store.Store            = (*Store)(nil)
	_ store.EventMetaReader  = (*Store)(nil)
	_ store.EventRangeReader = (*Store)(nil)
)
