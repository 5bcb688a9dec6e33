package eventlog

import "testing"

// TestTailReadFindsGapCoveringNext: the in-memory tail holds 1, 2, a gap
// item for 3..6, then 7. A subscriber whose next seq is inside the gap
// (4) reads the gap item, which announces it, not event 7 silently; one
// past the gap reads 7.
func TestTailReadFindsGapCoveringNext(t *testing.T) {
	tl := newTail(8, 1<<20)
	tl.publish([]*item{{seq: 1}, {seq: 2}, {seq: 3, gapTo: 6}, {seq: 7}})
	if tl.latestSeq() != 7 {
		t.Fatalf("latest %d, want 7", tl.latestSeq())
	}
	dst := make([]*item, 4)
	for _, c := range []struct {
		next, hint uint64
		wantSeq    uint64
		wantGap    bool
	}{
		{next: 3, wantSeq: 3, wantGap: true},
		{next: 4, wantSeq: 3, wantGap: true},
		{next: 6, hint: 3, wantSeq: 3, wantGap: true}, // a stale hint past the gap
		{next: 7, hint: 2, wantSeq: 7},
	} {
		n, _, res, _ := tl.read(c.next, c.hint, dst)
		if res != readItems || n == 0 {
			t.Fatalf("next %d: result %d, %d items", c.next, res, n)
		}
		if dst[0].seq != c.wantSeq || (dst[0].gapTo > 0) != c.wantGap {
			t.Fatalf("next %d: first item seq %d gapTo %d, want seq %d gap %v", c.next, dst[0].seq, dst[0].gapTo, c.wantSeq, c.wantGap)
		}
	}
}
