package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pipestream/gateway/bridge/store"
	"github.com/pipestream/gateway/bridge/store/sqlite"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func appendEvents(t *testing.T, s *sqlite.Store, n int) []uint64 {
	t.Helper()
	b := &store.Batch{}
	for range n {
		b.Events = append(b.Events, store.EventAppend{Tenant: "t", Event: newEvent("#info", "", 1)})
	}
	return mustCommit(t, s, b).Seqs
}

func TestSeqMonotonicAcrossReopenAndPrune(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openStore(t, dir, sqlite.Options{})
	if got := appendEvents(t, s, 3); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("first seqs %v, want [1 2 3]", got)
	}
	s.Close()

	s = openStore(t, dir, sqlite.Options{})
	if s.LastSeq() != 3 {
		t.Fatalf("LastSeq after reopen = %d, want 3", s.LastSeq())
	}
	if got := appendEvents(t, s, 2); fmt.Sprint(got) != "[4 5]" {
		t.Fatalf("seqs after reopen %v, want [4 5]", got)
	}
	pr, err := s.PruneEvents(ctx, 3)
	if err != nil || pr.Removed != 2 || pr.Bytes == 0 {
		t.Fatalf("PruneEvents(3) = %+v, %v; want 2 removed", pr, err)
	}
	st, err := s.EventStats(ctx)
	if err != nil || st.OldestSeq != 3 || st.LatestSeq != 5 || st.Count != 3 {
		t.Fatalf("EventStats = %+v, %v; want oldest 3 latest 5 count 3", st, err)
	}
	recs, _ := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	var total uint64
	for _, r := range recs {
		total += uint64(r.Size())
	}
	if total != st.Bytes {
		t.Fatalf("EventStats.Bytes = %d, retained bodies sum to %d", st.Bytes, total)
	}
	// Prune everything: the high-water mark must survive.
	if pr, err := s.PruneEvents(ctx, s.LastSeq()+1); err != nil || pr.Removed != 3 || pr.Bytes != total {
		t.Fatalf("prune all = %+v, %v; want 3 removed, %d bytes", pr, err, total)
	}
	st, _ = s.EventStats(ctx)
	if st != (store.EventStats{LatestSeq: 5}) {
		t.Fatalf("EventStats after pruning all = %+v, want only LatestSeq 5", st)
	}
	s.Close()

	s = openStore(t, dir, sqlite.Options{})
	if got := appendEvents(t, s, 1); fmt.Sprint(got) != "[6]" {
		t.Fatalf("seq after pruning all and reopening = %v, want [6]", got)
	}
}

func TestSeqExhaustion(t *testing.T) {
	if store.MaxSeq != 1<<53 {
		t.Fatalf("MaxSeq = %d, want 2^53", store.MaxSeq)
	}
	dir := t.TempDir()
	openStore(t, dir, sqlite.Options{}).Close()
	db, err := sql.Open("sqlite", filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE meta SET value = ? WHERE key = 'last_seq'", int64(store.MaxSeq-2)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := openStore(t, dir, sqlite.Options{})
	if got := appendEvents(t, s, 1); got[0] != store.MaxSeq-1 {
		t.Fatalf("seq %d, want 2^53-1", got[0])
	}
	if _, err := s.Commit(context.Background(), &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "", 1)}}}); !errors.Is(err, store.ErrSeqExhausted) {
		t.Fatalf("seq 2^53: err = %v, want ErrSeqExhausted", err)
	}
	if s.LastSeq() != store.MaxSeq-1 {
		t.Fatalf("LastSeq = %d after refused append", s.LastSeq())
	}
}

// TestGroupCommit: concurrent batches share transactions; a batch that fails
// its precondition is rolled back alone and leaves no gap in the seqs.
func TestGroupCommit(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := openStore(t, t.TempDir(), sqlite.Options{MaxGroupDelay: 20 * time.Millisecond, Registerer: reg})
	ctx := context.Background()
	mustCommit(t, s, &store.Batch{Create: newDoc("t", "d", base)})
	before := s.WriterStats()

	var hookSeqs []uint64
	s.SetEventHook(func(evs []store.EventRecord) {
		for _, e := range evs {
			hookSeqs = append(hookSeqs, e.Seq) // writer goroutine only
		}
	})
	const n = 200
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		got   []uint64
		stale int
		start = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			b := &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "", 1)}, {Tenant: "t", Event: newEvent("#info", "", 1)}}}
			if i%4 == 0 { // every 4th batch carries a stale update and must fail alone
				upd := newDoc("t", "d", base)
				upd.Doc.Rev = 9
				b.Updates = []store.DocumentUpdate{{Record: upd, PrevRev: 7}}
			}
			<-start
			res, err := s.Commit(ctx, b)
			mu.Lock()
			defer mu.Unlock()
			if errors.Is(err, store.ErrStaleRev) {
				stale++
				return
			}
			if err != nil {
				t.Errorf("Commit: %v", err)
				return
			}
			if res.Seqs[1] != res.Seqs[0]+1 {
				t.Errorf("seqs of one batch not consecutive: %v", res.Seqs)
			}
			got = append(got, res.Seqs...)
		})
	}
	close(start)
	wg.Wait()
	s.SetEventHook(nil)
	ws := s.WriterStats()
	txns, batches := ws.Transactions-before.Transactions, ws.Batches-before.Batches
	t.Logf("%d batches in %d transactions", batches, txns)
	if batches != n || txns >= n {
		t.Fatalf("%d batches in %d transactions: want %d batches in fewer transactions", batches, txns, n)
	}
	if stale != n/4 {
		t.Fatalf("%d stale batches failed, want %d", stale, n/4)
	}
	slices.Sort(got)
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("seqs have a gap or repeat at %d: %d", i, seq)
		}
	}
	if len(hookSeqs) != len(got) {
		t.Fatalf("hook saw %d events, committed %d", len(hookSeqs), len(got))
	}
	for i, seq := range hookSeqs {
		if seq != uint64(i+1) {
			t.Fatalf("hook events out of seq order at %d: %d", i, seq)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var hist *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() == "store_commit_batches" {
			hist = mf.GetMetric()[0].GetHistogram()
		}
	}
	if hist == nil || hist.GetSampleSum() != float64(ws.Batches) || hist.GetSampleCount() != ws.Transactions {
		t.Fatalf("store_commit_batches histogram = %v, want sum %d count %d", hist, ws.Batches, ws.Transactions)
	}
}

// TestKill9 runs a subprocess that commits in a loop and prints every
// acknowledged commit, SIGKILLs it at a random point, and checks that every
// acknowledged document and seq survived and that seqs continue above them.
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a subprocess")
	}
	dir := t.TempDir()
	target := 50 + rand.IntN(300)
	acks := commitUntilKilled(t, dir, target)
	t.Logf("killed after %d acknowledged commits (target %d)", len(acks), target)
	s := openStore(t, dir, sqlite.Options{})
	maxSeq := checkAcksSurvived(t, s, acks)
	if s.LastSeq() < maxSeq {
		t.Fatalf("LastSeq %d below acknowledged seq %d", s.LastSeq(), maxSeq)
	}
	next := appendEvents(t, s, 1)[0]
	if next <= maxSeq {
		t.Fatalf("next seq %d repeats an acknowledged seq (max %d)", next, maxSeq)
	}
	ctx := context.Background()
	if open, err := s.ListNonTerminal(ctx); err != nil || len(open) < len(acks) {
		t.Fatalf("ListNonTerminal = %d docs, %v; want at least %d", len(open), err, len(acks))
	}
	// The snapshot total commits with the rows it sums: exact after the kill.
	if got, err := s.SnapshotBytes(ctx); err != nil || got != scanSnapshotBytes(t, rawDB(t, dir)) {
		t.Fatalf("SnapshotBytes after kill -9 = %d, %v; a scan sums %d", got, err, scanSnapshotBytes(t, rawDB(t, dir)))
	}
}

// killAck is one commit the helper subprocess acknowledged: its document
// and the seqs of its two events.
type killAck struct {
	doc  string
	seqs [2]uint64
}

// commitUntilKilled runs the committing subprocess on dir and SIGKILLs it
// once it acknowledged target commits; it returns every acknowledgement
// read (a line cut by the kill is skipped).
func commitUntilKilled(t *testing.T, dir string, target int) []killAck {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acks []killAck
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		a, ok := parseKillAck(sc.Text())
		if !ok {
			continue
		}
		acks = append(acks, a)
		if !killed && len(acks) >= target {
			if err := cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killed = true
		}
	}
	werr := cmd.Wait()
	if !killed {
		t.Fatalf("helper exited before the kill: %v", werr)
	}
	return acks
}

// parseKillAck reads one "ack <doc> <seq> <seq>" line.
func parseKillAck(line string) (killAck, bool) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "ack" {
		return killAck{}, false
	}
	s1, err1 := strconv.ParseUint(f[2], 10, 64)
	s2, err2 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil {
		return killAck{}, false
	}
	return killAck{f[1], [2]uint64{s1, s2}}, true
}

// checkAcksSurvived checks that every acknowledged document and event is
// in s, and returns the highest acknowledged seq.
func checkAcksSurvived(t *testing.T, s *sqlite.Store, acks []killAck) uint64 {
	t.Helper()
	ctx := context.Background()
	var maxSeq uint64
	for _, a := range acks {
		rec, err := s.GetDocument(ctx, "t", a.doc, false)
		if err != nil {
			t.Fatalf("acknowledged document %s lost: %v", a.doc, err)
		}
		if rec.Doc.GetState() != gatewayv1.State_PENDING {
			t.Fatalf("document %s state %v", a.doc, rec.Doc.GetState())
		}
		for _, seq := range a.seqs {
			recs, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true, From: seq, Limit: 1})
			if err != nil || len(recs) != 1 || recs[0].Seq != seq || recs[0].DocID != a.doc {
				t.Fatalf("acknowledged event %d of %s lost: %v, %v", seq, a.doc, recs, err)
			}
			maxSeq = max(maxSeq, seq)
		}
	}
	return maxSeq
}
