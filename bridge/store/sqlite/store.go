package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/pipestream/gateway/bridge/store"
)

// Store is the SQLite backend of the durable store (package doc). Safe for
// concurrent use. It implements store.Store (and so store.EventStore), whose
// doc comments are the contract; storetest checks it.
type Store struct {
	dir  string
	opts Options
	log  *slog.Logger

	wdb   *sql.DB   // one connection, owned by the writer goroutine
	wconn *sql.Conn // the writer's connection
	rdb   *sql.DB   // read-only pool
	// readBlocks and readKeyBlocks: ReadEvents' queries, prepared on rdb
	// (each read would otherwise parse one).
	readBlocks, readKeyBlocks *sql.Stmt

	stmts map[string]*sql.Stmt // writer's prepared statements (writer goroutine only)
	// pending and blk: the events of the open transaction not yet written,
	// and the encoder of their blocks (writer goroutine only).
	pending []pendingEvent
	blk     blockBuilder

	mu     sync.RWMutex // guards closed against sends on queue
	closed bool
	queue  chan *request
	done   chan struct{} // closed when the writer exits

	lastSeq   atomic.Uint64
	hook      atomic.Pointer[func([]store.EventRecord)]
	txns      atomic.Uint64
	batches   atomic.Uint64
	retries   atomic.Uint64
	stmtCount atomic.Uint64
	met       *metrics
}

// Options configure Open. Zero values take the defaults in params.go.
type Options struct {
	// Synchronous is the SQLite synchronous pragma: "FULL" (default) or
	// "NORMAL". With WAL, both survive kill -9 of the process (committed
	// frames are in the OS page cache); only FULL also survives power loss
	// or an OS crash, because it fsyncs the WAL at every commit. Group commit
	// amortizes that fsync over all batches of a transaction.
	Synchronous string
	// MaxGroupBatches bounds how many batches one transaction carries.
	MaxGroupBatches int
	// MaxGroupDelay is how long the writer waits for more batches after the
	// first one before committing (0: commit as soon as the queue is drained;
	// batching then comes from callers queueing while the previous
	// transaction syncs).
	MaxGroupDelay time.Duration
	// QueueDepth bounds queued batches; Commit blocks (honoring ctx) beyond it.
	QueueDepth int
	// ReadConns is the size of the read-only connection pool.
	ReadConns int
	// BusyTimeout is SQLite's busy_timeout.
	BusyTimeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registerer for metrics (nil: none): store_commit_batches (histogram of
	// batches per transaction), store_commit_seconds (transaction latency),
	// store_commit_transactions_total.
	Registerer prometheus.Registerer
}

func (o *Options) withDefaults() (Options, error) {
	r := *o
	switch strings.ToUpper(r.Synchronous) {
	case "":
		r.Synchronous = defaultSynchronous
	case "FULL", "NORMAL":
		r.Synchronous = strings.ToUpper(r.Synchronous)
	default:
		return r, fmt.Errorf("%w: Synchronous must be FULL or NORMAL, got %q", store.ErrInvalid, o.Synchronous)
	}
	if r.MaxGroupBatches <= 0 {
		r.MaxGroupBatches = defaultMaxGroupBatches
	}
	if r.MaxGroupDelay < 0 {
		return r, fmt.Errorf("%w: MaxGroupDelay must not be negative", store.ErrInvalid)
	}
	if r.QueueDepth <= 0 {
		r.QueueDepth = defaultQueueDepth
	}
	if r.ReadConns <= 0 {
		r.ReadConns = defaultReadConns
	}
	if r.BusyTimeout <= 0 {
		r.BusyTimeout = defaultBusyTimeout
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r, nil
}

func dsn(path string, opts Options, readOnly bool) string {
	var b strings.Builder
	b.WriteString(path)
	fmt.Fprintf(&b, "?_pragma=busy_timeout(%d)", opts.BusyTimeout.Milliseconds())
	b.WriteString("&_pragma=foreign_keys(1)")
	b.WriteString("&_pragma=synchronous(" + opts.Synchronous + ")")
	if readOnly {
		b.WriteString("&_pragma=query_only(1)")
	} else {
		b.WriteString("&_pragma=journal_mode(WAL)&_pragma=temp_store(MEMORY)")
	}
	return b.String()
}

// Open opens (creating if needed) <dir>/gateway.db, applies pending schema
// migrations (PRAGMA user_version), creates <dir>/spool and <dir>/results,
// and starts the writer goroutine. Close releases everything.
func Open(ctx context.Context, dir string, o Options) (*Store, error) {
	opts, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		return nil, fmt.Errorf("%w: data directory is empty", store.ErrInvalid)
	}
	if strings.ContainsAny(dir, "?#") {
		return nil, fmt.Errorf("%w: data directory %q must not contain '?' or '#'", store.ErrInvalid, dir)
	}
	for _, d := range []string{dir, filepath.Join(dir, spoolDir), filepath.Join(dir, resultDir)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("store: create %s: %w", d, err)
		}
	}
	path := filepath.Join(dir, dbFileName)
	s := &Store{dir: dir, opts: opts, log: opts.Logger, stmts: map[string]*sql.Stmt{}}
	fail := func(err error) (*Store, error) {
		if s.wconn != nil {
			s.wconn.Close()
		}
		if s.wdb != nil {
			s.wdb.Close()
		}
		if s.rdb != nil {
			s.closeReadStmts()
			s.rdb.Close()
		}
		return nil, err
	}
	s.wdb, err = sql.Open("sqlite", dsn(path, opts, false))
	if err != nil {
		return fail(fmt.Errorf("store: open %s: %w", path, err))
	}
	s.wdb.SetMaxOpenConns(1)
	s.wdb.SetMaxIdleConns(1)
	s.wdb.SetConnMaxLifetime(0)
	var mode string
	if err := s.wdb.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fail(fmt.Errorf("store: open %s: %w", path, err))
	}
	if !strings.EqualFold(mode, "wal") {
		return fail(fmt.Errorf("store: %s: journal_mode is %q, want wal (is the file system local?)", path, mode))
	}
	if err := migrate(ctx, s.wdb, s.log); err != nil {
		return fail(err)
	}
	if err := s.cleanTempPayloads(); err != nil {
		return fail(err)
	}
	s.rdb, err = sql.Open("sqlite", dsn(path, opts, true))
	if err != nil {
		return fail(fmt.Errorf("store: open %s read pool: %w", path, err))
	}
	s.rdb.SetMaxOpenConns(opts.ReadConns)
	s.rdb.SetMaxIdleConns(opts.ReadConns)
	var last int64
	if err := s.rdb.QueryRowContext(ctx, "SELECT value FROM meta WHERE key = 'last_seq'").Scan(&last); err != nil {
		return fail(fmt.Errorf("store: read last_seq: %w", err))
	}
	s.lastSeq.Store(uint64(last))
	if s.readBlocks, err = s.rdb.PrepareContext(ctx, readBlocksSQL); err != nil {
		return fail(fmt.Errorf("store: prepare event reads: %w", err))
	}
	if s.readKeyBlocks, err = s.rdb.PrepareContext(ctx, readKeyBlocksSQL); err != nil {
		return fail(fmt.Errorf("store: prepare event reads: %w", err))
	}
	s.wconn, err = s.wdb.Conn(ctx)
	if err != nil {
		return fail(fmt.Errorf("store: writer connection: %w", err))
	}
	s.met, err = newMetrics(opts.Registerer)
	if err != nil {
		return fail(err)
	}
	s.queue = make(chan *request, opts.QueueDepth)
	s.done = make(chan struct{})
	go s.writer()
	return s, nil
}

// Close stops intake (later calls get ErrClosed), commits every batch already
// queued, stops the writer and closes the database. Idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	<-s.done // the writer commits everything queued, then exits
	var errs []error
	for _, st := range s.stmts {
		if err := st.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.wconn.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.closeReadStmts(); err != nil {
		errs = append(errs, err)
	}
	if err := s.rdb.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.wdb.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("store: close: %v", errs)
	}
	return nil
}

// SetEventHook installs fn (nil removes it). After each transaction commits,
// and before any of its Commit callers return, the writer goroutine calls fn
// once with every event of that transaction in ascending seq order. fn owns
// the slice. fn runs on the writer goroutine: it must not block and must not
// call Commit (that would deadlock); hand the events to a buffered publisher.
// This is how the event log publishes live events in seq order.
func (s *Store) SetEventHook(fn func([]store.EventRecord)) {
	if fn == nil {
		s.hook.Store(nil)
		return
	}
	s.hook.Store(&fn)
}

// WriterStats reports group-commit counters.
func (s *Store) WriterStats() store.WriterStats {
	return store.WriterStats{Transactions: s.txns.Load(), Batches: s.batches.Load(),
		Retries: s.retries.Load(), Statements: s.stmtCount.Load()}
}

// LastSeq is the highest seq committed so far (0 before the first event).
func (s *Store) LastSeq() uint64 { return s.lastSeq.Load() }

// fromNanos inverts nanos.
func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// The SQLite backend implements the neutral interfaces (bridge/store).
var (
	_ store.Store            = (*Store)(nil)
	_ store.EventMetaReader  = (*Store)(nil)
	_ store.EventRangeReader = (*Store)(nil)
)

// closeReadStmts closes the read pool's prepared statements.
func (s *Store) closeReadStmts() error {
	var err error
	for _, st := range []*sql.Stmt{s.readBlocks, s.readKeyBlocks} {
		if st != nil {
			err = errors.Join(err, st.Close())
		}
	}
	return err
}
