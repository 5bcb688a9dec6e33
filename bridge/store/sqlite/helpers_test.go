package sqlite_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// killEnv makes the test binary run as the kill -9 helper process.
const killEnv = "STORE_KILL9_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(killEnv); dir != "" {
		os.Exit(killHelper(dir))
	}
	goleak.VerifyTestMain(m)
}

var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func openStore(t testing.TB, dir string, opts sqlite.Options) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newDoc(tenant, id string, created time.Time) *store.DocumentRecord {
	return &store.DocumentRecord{
		Tenant: tenant,
		Doc: &gatewayv1.Document{
			Name: "documents/" + id, Id: id, State: gatewayv1.State_PENDING, Rev: 1,
			ContentType: "text/plain", CreateTime: timestamppb.New(created), UpdateTime: timestamppb.New(created),
		},
		BodyHash:       []byte("hash-" + id),
		ContentPayload: true,
	}
}

func newEvent(kind, docID string, rev uint64) *gatewayv1.Event {
	return &gatewayv1.Event{Time: timestamppb.New(base), Kind: kind, DocumentId: docID, Rev: rev, Since: rev - 1}
}

func mustCommit(t testing.TB, s *sqlite.Store, b *store.Batch) store.CommitResult {
	t.Helper()
	res, err := s.Commit(context.Background(), b)
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	return res
}

// killHelper commits documents with events from 4 goroutines until killed,
// printing "ack <doc-id> <seq> <seq>" after each acknowledged commit.
func killHelper(dir string) int {
	s, err := sqlite.Open(context.Background(), dir, sqlite.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper open:", err)
		return 2
	}
	out := make(chan string, 64)
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				res, err := s.Commit(context.Background(), &store.Batch{
					Create: newDoc("t", id, time.Now()),
					Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#document", id, 1)}, {Tenant: "t", Event: newEvent("#status", id, 2)}},
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "helper commit:", err)
					os.Exit(3)
				}
				out <- fmt.Sprintf("ack %s %d %d\n", id, res.Seqs[0], res.Seqs[1])
			}
		}()
	}
	w := bufio.NewWriter(os.Stdout)
	for line := range out {
		w.WriteString(line)
		w.Flush() // each ack reaches the parent as soon as it is acknowledged
	}
	return 0
}
