package gateway

import "testing"

// TestNegotiateStream: the stream routes' form follows Accept: NDJSON
// unless SSE or JSON is named and not outranked; a generated client's
// Accept (every type the spec lists, JSON first) gets the JSON page.
func TestNegotiateStream(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   streamForm
	}{
		{nil, formNDJSON},
		{[]string{"*/*"}, formNDJSON},
		{[]string{"application/*"}, formNDJSON},
		{[]string{"application/x-ndjson"}, formNDJSON},
		{[]string{"application/json"}, formPage},
		{[]string{"text/event-stream"}, formSSE},
		{[]string{"application/json", "application/x-ndjson", "text/event-stream"}, formPage}, // go-swagger: one value per type
		{[]string{"application/json, application/x-ndjson, text/event-stream"}, formPage},
		{[]string{"application/x-ndjson, application/json"}, formNDJSON},
		{[]string{"text/event-stream;q=0.9, application/json;q=0.5"}, formSSE},
		{[]string{"application/json;q=0.2, */*"}, formNDJSON},
		{[]string{"text/event-stream, */*;q=0.1"}, formSSE},
		{[]string{"text/html"}, formNDJSON},
		{[]string{"application/json;q=0"}, formNDJSON},
	} {
		if got := negotiateStream(tc.accept); got != tc.want {
			t.Errorf("Accept %q: form %d, want %d", tc.accept, got, tc.want)
		}
	}
}

// TestPageOpen: a page from seq c opens the log at c-1 (which exists:
// it was sent) and skips it, so the nextCursor after the latest event is
// no FutureCursor; 0 and 1 open as they are.
func TestPageOpen(t *testing.T) {
	for _, tc := range []struct {
		c, first, open, skip uint64
	}{
		{0, 0, 0, 0},
		{1, 0, 0, 0}, // the event log: 0 is its whole window, which starts at 1 or later
		{1, 1, 1, 0}, // a watch: 0 would be the current state
		{2, 0, 1, 1},
		{21, 1, 20, 20},
	} {
		open, skip := pageOpen(tc.c, tc.first)
		if open == nil || *open != tc.open || skip != tc.skip {
			t.Errorf("pageOpen(%d, %d) = %v, %d; want %d, %d", tc.c, tc.first, open, skip, tc.open, tc.skip)
		}
	}
}
