package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
)

// testEventSeqs: concurrent commits get seqs from 1, consecutive within a
// batch, every seq exactly once; the hook sees each commit's events once,
// in ascending order across calls, before its Commit returns; LastSeq is
// the highest.
func testEventSeqs(t *testing.T, b Backend) {
	s, _ := open(t, b)
	var (
		mu     sync.Mutex
		hooked []uint64
	)
	s.SetEventHook(func(recs []store.EventRecord) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			hooked = append(hooked, r.Seq)
		}
	})
	defer s.SetEventHook(nil)
	const workers, batches, per = 8, 10, 3
	var wg sync.WaitGroup
	errs := make(chan error, workers*batches)
	for w := range workers {
		wg.Go(func() {
			for i := range batches {
				id := fmt.Sprintf("w%d-%d", w, i)
				bt := &store.Batch{Create: newDoc("t", id, base)}
				for e := range per {
					bt.Events = append(bt.Events, store.EventAppend{Tenant: "t", Event: newEvent("#status", id, uint64(e+1))})
				}
				res, err := s.Commit(context.Background(), bt)
				if err != nil {
					errs <- err
					return
				}
				if len(res.Seqs) != per {
					errs <- fmt.Errorf("%s: %d seqs for %d events", id, len(res.Seqs), per)
					return
				}
				for k := 1; k < per; k++ {
					if res.Seqs[k] != res.Seqs[k-1]+1 {
						errs <- fmt.Errorf("%s: seqs %v are not consecutive", id, res.Seqs)
						return
					}
				}
				mu.Lock()
				seen := slices.Contains(hooked, res.Seqs[per-1])
				mu.Unlock()
				if !seen {
					errs <- fmt.Errorf("%s: Commit returned before the hook saw seq %d", id, res.Seqs[per-1])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	const n = workers * batches * per
	mu.Lock()
	defer mu.Unlock()
	for i, seq := range hooked {
		if seq != uint64(i+1) {
			t.Fatalf("hook saw seqs %v...; want 1..%d each once, ascending", hooked[:i+1], n)
		}
	}
	if len(hooked) != n || s.LastSeq() != n {
		t.Fatalf("hook saw %d events, LastSeq %d; want %d", len(hooked), s.LastSeq(), n)
	}
}

// testReadEvents: replay from a cursor, paging by Limit, and the tenant,
// document and kind filters; Body decodes to the event with its seq.
func testReadEvents(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	for i := range 6 {
		tenant := []string{"a", "b"}[i%2]
		id := fmt.Sprintf("d%d", i%3)
		kind := []string{"#document", "#status"}[i/3]
		mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: tenant, Event: newEvent(kind, id, uint64(i+1))}}})
	}
	read := func(q store.EventQuery) []uint64 {
		t.Helper()
		recs, err := s.ReadEvents(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, r := range recs {
			ev, err := r.Decode()
			if err != nil || ev.GetSeq() != r.Seq || ev.GetKind() != r.Kind || r.Size() != len(r.Body) {
				t.Fatalf("event %d: body %v, %v", r.Seq, ev, err)
			}
			out = append(out, r.Seq)
		}
		return out
	}
	cases := []struct {
		name string
		q    store.EventQuery
		want []uint64
	}{
		{"all from 0", store.EventQuery{AllTenants: true}, []uint64{1, 2, 3, 4, 5, 6}},
		{"cursor 4", store.EventQuery{AllTenants: true, From: 4}, []uint64{4, 5, 6}},
		{"limit", store.EventQuery{AllTenants: true, From: 2, Limit: 2}, []uint64{2, 3}},
		{"tenant a", store.EventQuery{Tenant: "a"}, []uint64{1, 3, 5}},
		{"doc d1", store.EventQuery{AllTenants: true, DocID: "d1"}, []uint64{2, 5}},
		{"kind", store.EventQuery{Tenant: "b", Kinds: []string{"#status"}}, []uint64{4, 6}},
		{"past the end", store.EventQuery{AllTenants: true, From: 7}, nil},
	}
	for _, c := range cases {
		if got := read(c.q); !slices.Equal(got, c.want) {
			t.Errorf("%s: seqs %v, want %v", c.name, got, c.want)
		}
	}
	// A page of up to 10000 events is honored whole (the log's replay).
	big := &store.Batch{}
	for i := range 2500 {
		big.Events = append(big.Events, store.EventAppend{Tenant: "c", Event: newEvent("#info", "", uint64(i+1))})
	}
	mustCommit(t, s, big)
	if got := read(store.EventQuery{Tenant: "c", Limit: 2400}); len(got) != 2400 || got[0] != 7 || got[2399] != 2406 {
		t.Fatalf("Limit 2400 of 2500 events: %d events", len(got))
	}
}

// testRetention: PruneEvents removes what lies below the cut and reports
// it; EventStats follows; seqs continue after every event was pruned.
func testRetention(t *testing.T, b Backend) {
	s, _ := open(t, b)
	ctx := context.Background()
	var sizes []uint64
	for i := range 5 {
		mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", fmt.Sprintf("d%d", i), 1)}}})
	}
	recs, err := s.ReadEvents(ctx, store.EventQuery{AllTenants: true})
	if err != nil || len(recs) != 5 {
		t.Fatalf("ReadEvents = %d, %v", len(recs), err)
	}
	var total uint64
	for _, r := range recs {
		sizes = append(sizes, uint64(r.Size()))
		total += uint64(r.Size())
	}
	st, err := s.EventStats(ctx)
	if err != nil || st != (store.EventStats{OldestSeq: 1, LatestSeq: 5, Count: 5, Bytes: total}) {
		t.Fatalf("EventStats = %+v, %v; want oldest 1 latest 5 count 5 bytes %d", st, err, total)
	}
	res, err := s.PruneEvents(ctx, 3)
	if err != nil || res.Removed != 2 || res.Bytes != sizes[0]+sizes[1] {
		t.Fatalf("PruneEvents(3) = %+v, %v; want 2 removed, %d bytes", res, err, sizes[0]+sizes[1])
	}
	st, err = s.EventStats(ctx)
	if err != nil || st.OldestSeq != 3 || st.LatestSeq != 5 || st.Count != 3 || st.Bytes != total-res.Bytes {
		t.Fatalf("EventStats after prune = %+v, %v", st, err)
	}
	if got, _ := s.ReadEvents(ctx, store.EventQuery{AllTenants: true}); len(got) != 3 || got[0].Seq != 3 {
		t.Fatalf("retained events start at %v", got)
	}
	if _, err := s.PruneEvents(ctx, 100); err != nil {
		t.Fatal(err)
	}
	st, err = s.EventStats(ctx)
	if err != nil || st != (store.EventStats{LatestSeq: 5}) {
		t.Fatalf("EventStats after pruning all = %+v, %v; want only LatestSeq 5", st, err)
	}
	res2 := mustCommit(t, s, &store.Batch{Events: []store.EventAppend{{Tenant: "t", Event: newEvent("#info", "x", 1)}}})
	if res2.Seqs[0] != 6 || s.LastSeq() != 6 {
		t.Fatalf("seq after pruning everything = %v (LastSeq %d), want 6", res2.Seqs, s.LastSeq())
	}
}
