package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// open opens a Store on dsn, closed at the end of the test.
func open(t testing.TB, dsn string) *pgstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgstore.Open(ctx, dsn, pgstore.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func doc(id, reqID string) *store.DocumentRecord {
	return &store.DocumentRecord{
		Tenant:   "acme",
		BodyHash: []byte("h-" + id),
		Doc: &gatewayv1.Document{Id: id, State: gatewayv1.State_PENDING, Rev: 1, RequestId: reqID,
			CreateTime: timestamppb.New(t0)},
	}
}

func event(docID, kind string) store.EventAppend {
	return store.EventAppend{Tenant: "acme", Event: &gatewayv1.Event{Kind: kind, DocumentId: docID, Time: timestamppb.New(t0)}}
}

// recorder collects hook deliveries.
type recorder struct {
	mu   sync.Mutex
	seqs []uint64
	wake chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{}, 1)} }

func (r *recorder) hook(evs []store.EventRecord) {
	r.mu.Lock()
	for _, e := range evs {
		r.seqs = append(r.seqs, e.Seq)
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// waitFor waits (event-driven, with a deadline) until n seqs arrived.
func (r *recorder) waitFor(t testing.TB, n int) []uint64 {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		got := append([]uint64(nil), r.seqs...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-r.wake:
		case <-deadline:
			t.Fatalf("hook got %d events within 30s, want %d", len(got), n)
		}
	}
}

// gapless fails unless seqs is exactly from, from+1, ..., from+len-1.
func gapless(t testing.TB, seqs []uint64, from uint64) {
	t.Helper()
	for i, s := range seqs {
		if s != from+uint64(i) {
			t.Fatalf("delivery %d is seq %d, want %d (gap, duplicate or reorder); all: %v", i, s, from+uint64(i), abbreviate(seqs))
		}
	}
}

func abbreviate(s []uint64) string {
	if len(s) > 40 {
		return fmt.Sprint(s[:20], "...", s[len(s)-20:])
	}
	return fmt.Sprint(s)
}

// The PostgreSQL store is a bridge.Store (and so an eventlog.Store).
var _ bridge.Store = (*pgstore.Store)(nil)
