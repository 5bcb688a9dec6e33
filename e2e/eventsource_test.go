package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestBrowserEventSource: headless Chromium reads the stream routes the
// way a web page would, with no library: an EventSource follows a watch
// (each update's lastEventId its seq) to the end event after the document
// is cancelled; left open, the browser reconnects by itself with
// Last-Event-ID and gets nothing twice, only the end again. An
// EventSource on the event log gets events whose id is their seq; fetch()
// with Accept: application/json gets a page that res.json() reads.
func TestBrowserEventSource(t *testing.T) {
	g := shared(t)
	d := submitREST(t, g, hangingDoc("an EventSource watches this"))
	awaitState(t, g, d.GetId(), "RUNNING", func(d *gatewayv1.Document) bool { return d.GetState() == gatewayv1.State_RUNNING })

	p := openConsole(t, g.baseURL())
	p.open("")
	evalJS[bool](p, fmt.Sprintf(`(() => {
		const s = window.__sse = {updates: [], ends: [], opens: 0, events: []};
		const es = new EventSource('/v1/documents/%s:watch');
		es.onopen = () => s.opens++;
		es.onmessage = e => s.updates.push({id: e.lastEventId, state: JSON.parse(e.data).document.state});
		es.addEventListener('end', () => { s.ends.push(s.updates.length); if (s.ends.length === 2) es.close(); });
		const ev = new EventSource('/v1/events:subscribe?cursor=0');
		ev.onmessage = e => { s.events.push({id: e.lastEventId, seq: JSON.parse(e.data).seq}); if (s.events.length === 3) ev.close(); };
		return true; })()`, d.GetId()))
	waitJS(p, "the watch's first update", `window.__sse.updates.length >= 1`)
	u := g.baseURL() + "/v1/documents/" + d.GetId() + ":cancel"
	wantOK(t, "POST "+u, curlJSON(t, "POST", u, "{}"))
	// The browser reconnects about 3 s after the first end (its default).
	waitJS(p, "two end events (the second after the browser's own reconnect)", `window.__sse.ends.length === 2`)

	type update struct{ ID, State string }
	got := evalJS[struct {
		Updates []update
		Ends    []int
		Opens   int
		Events  []struct{ ID, Seq string }
	}](p, `window.__sse`)
	last := got.Updates[len(got.Updates)-1]
	if last.State != "CANCELLED" || got.Updates[0].State != "RUNNING" {
		t.Errorf("EventSource watch updates %+v, want RUNNING first and CANCELLED last", got.Updates)
	}
	var prev uint64
	for i, u := range got.Updates {
		n, err := strconv.ParseUint(u.ID, 10, 64)
		if err != nil || n <= prev {
			t.Errorf("update %d has id %q after %+v: want rising seqs", i, u.ID, got.Updates[:i])
		}
		prev = n
	}
	if got.Opens != 2 || got.Ends[0] != got.Ends[1] {
		t.Errorf("opens %d, updates at each end %v: want a reconnect (2 opens) that brought nothing new", got.Opens, got.Ends)
	}

	waitJS(p, "three events from the log", `window.__sse.events.length === 3`)
	got = evalJS[struct {
		Updates []update
		Ends    []int
		Opens   int
		Events  []struct{ ID, Seq string }
	}](p, `window.__sse`)
	for _, e := range got.Events {
		if e.ID == "" || e.ID != e.Seq {
			t.Errorf("event log EventSource: %+v, want each lastEventId to be the event's seq", got.Events)
			break
		}
	}
	page := evalJS[struct {
		Events     []struct{ Seq string }
		NextCursor string
	}](p, `fetch('/v1/events:subscribe?cursor=0&waitSeconds=10', {headers: {Accept: 'application/json'}}).then(r => r.json())`)
	if len(page.Events) == 0 || page.NextCursor == "" {
		t.Errorf("fetch() of an event page: %+v, want the window's first events and a nextCursor", page)
	}
}

// waitJS waits until the JavaScript condition holds, checking it in the
// page every 50 ms for up to uiWait (state in page variables, which
// chromedp's mutation polling would not see change).
func waitJS(p *consolePage, what, cond string) {
	p.t.Helper()
	ok := evalJS[bool](p, fmt.Sprintf(`new Promise(res => { const t0 = Date.now(); const i = setInterval(() => {
		if (%s) { clearInterval(i); res(true); } else if (Date.now() - t0 > %d) { clearInterval(i); res(false); } }, 50); })`, cond, (uiWait-5*time.Second).Milliseconds()))
	if !ok {
		p.fail("waiting %v for %s", uiWait, what)
	}
}
