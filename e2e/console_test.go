package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// The web console (/ui/) in headless Chromium, driven by chromedp over the
// DevTools protocol: it uploads, watches, redeems and downloads through
// the page as a person would. Every wait is on a DOM condition (chromedp
// WaitVisible, or Poll with a DOM-mutation trigger) or a DevTools event,
// with a deadline; nothing sleeps. A JavaScript exception on the page fails
// the test.
//
// E2E_SCREENSHOTS=DIR writes the screenshots used by docs/console.md.

const uiWait = 60 * time.Second // one DOM condition; generous for 2 busy cores

type consolePage struct {
	t      *testing.T
	ctx    context.Context
	base   string
	mu     sync.Mutex
	jsErrs []string
}

// openConsole starts a headless Chromium (flags of e2e/README.md) for t.
func openConsole(t *testing.T, base string) *consolePage {
	t.Helper()
	profile, err := os.MkdirTemp("", "pipestream-e2e-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(need(t, toolChromium)),
		chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, tcancel := context.WithTimeout(ctx, 5*time.Minute)
	p := &consolePage{t: t, ctx: ctx, base: base}
	t.Cleanup(func() {
		tcancel()
		cancel()
		acancel()
		// Chromium's helpers may still write for a moment after exit.
		for range 20 {
			if os.RemoveAll(profile) == nil {
				break
			}
		}
	})
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.jsErrs) > 0 {
			t.Errorf("JavaScript errors on the console page:\n%s", strings.Join(p.jsErrs, "\n"))
		}
	})
	if err := chromedp.Do(ctx); err != nil { // start the browser and open the tab
		t.Fatalf("start Chromium: %v", err)
	}
	exceptions := chromedp.Events(ctx, runtime.ExceptionThrown)
	go func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			msg := ev.ExceptionDetails.Text
			if ex := ev.ExceptionDetails.Exception; ex != nil {
				msg += " " + ex.Description
			}
			p.mu.Lock()
			p.jsErrs = append(p.jsErrs, msg)
			p.mu.Unlock()
		}
	}()
	return p
}

// fail reports what the page showed, then fails.
func (p *consolePage) fail(format string, args ...any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 3000)`))
	p.t.Fatalf(format+"\n--- the page showed ---\n%s", append(args, text)...)
}

func (p *consolePage) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, uiWait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fail("%s: %v", what, err)
	}
}

func (p *consolePage) open(hash string) {
	p.t.Helper()
	p.do("open "+hash, chromedp.Navigate(p.base+"/ui/"+hash))
}

// waitVisible waits until an element matching css is visible.
func (p *consolePage) waitVisible(css string) {
	p.t.Helper()
	p.do("wait for "+css, chromedp.WaitVisible(chromedp.CSS(css)))
}

// until waits until the JavaScript expression is truthy; it is
// re-evaluated on every DOM mutation.
func (p *consolePage) until(what, expr string, d time.Duration) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`!!(`+expr+`)`, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(d))); err != nil {
		p.fail("waiting %v for %s: %v", d, what, err)
	}
}

func evalJS[T any](p *consolePage, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, uiWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.fail("evaluate %.80s: %v", expr, err)
	}
	return v
}

// set gives a form field a value and fires input and change, as typing or
// choosing does.
func (p *consolePage) set(id, value string) {
	p.t.Helper()
	idj, _ := json.Marshal(id)
	vj, _ := json.Marshal(value)
	if !evalJS[bool](p, fmt.Sprintf(`(() => { const el = document.getElementById(%s); if (!el) return false; el.value = %s;
		el.dispatchEvent(new Event('input', {bubbles: true})); el.dispatchEvent(new Event('change', {bubbles: true})); return el.value === %s; })()`, idj, vj, vj)) {
		p.fail("set #%s to %q: no such field or value", id, value)
	}
}

// click clicks the first element matching css once it is there and
// enabled, in one step inside the page: live updates re-render the page,
// so a node found by one DevTools call may be gone by the next ("Could not
// find node with given id", seen in CI).
func (p *consolePage) click(css string) {
	p.t.Helper()
	cj, _ := json.Marshal(css)
	p.until("click "+css, fmt.Sprintf(`(() => { const el = document.querySelector(%s); if (!el || el.disabled) return false; el.click(); return true; })()`, cj), uiWait)
}

// screenshot writes name.png to $E2E_SCREENSHOTS, when set.
func (p *consolePage) screenshot(name string) {
	p.t.Helper()
	dir := os.Getenv("E2E_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, uiWait)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// docIDFromHash waits for the document page the console opens after a
// submission and returns the document id.
func (p *consolePage) docIDFromHash() string {
	p.t.Helper()
	p.until("the document page", `location.hash.startsWith('#/documents/') && document.querySelector('[data-testid=doc-state]')`, uiWait)
	return evalJS[string](p, `decodeURIComponent(location.hash.slice('#/documents/'.length))`)
}

// TestConsoleUploadWatchDownload uploads a multi-chunk file through the
// form (XHR with upload progress) and watches the entity tree fill in from
// the event stream: the fault processor defers chunk 0, so the page first
// shows every other chunk COMPLETE and chunk 0 DEFERRED, then, once the
// claim is redeemed with the page's button, the whole tree complete. It
// checks chunk order and the timeline, downloads the result and compares
// the bytes, then looks at the list and the event log page.
func TestConsoleUploadWatchDownload(t *testing.T) {
	g := shared(t)
	var content bytes.Buffer
	for i := 0; content.Len() < 1400<<10; i++ {
		fmt.Fprintf(&content, "line %06d of the console upload test\n", i)
	}
	path := filepath.Join(t.TempDir(), "upload.txt")
	if err := os.WriteFile(path, content.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	p := openConsole(t, g.baseURL())
	p.open("#/documents")
	p.waitVisible("#submit-form")
	p.waitVisible(`#live[data-state="live"]`)
	p.set("submit-source", "file")
	p.do("choose the file", chromedp.SetUploadFiles(chromedp.CSS("#submit-file"), []string{path}))
	p.set("split-strategy", "SPLIT_LINES")
	p.set("split-chunk", "65536")
	p.set("split-processor", "fault")
	p.set("submit-metadata", "pipestream.fault=defer\npipestream.fault-chunks=0\npipestream.claim-ttl-ms=300000")
	// Record the progress bar's values: the page leaves the form when the
	// upload is accepted.
	evalJS[bool](p, `(() => { window.__progress = []; const form = document.getElementById('submit-form');
		new MutationObserver(() => { const el = form.querySelector('.progress'); if (el && el.dataset.percent) window.__progress.push(+el.dataset.percent); })
			.observe(form, {subtree: true, attributes: true, attributeFilter: ['data-percent']}); return true; })()`)
	p.click("#submit-button")
	id := p.docIDFromHash()

	// Half-way: every chunk but #0 COMPLETE, #0 DEFERRED, the root waiting.
	doc := awaitClaims(t, g, id, 1)
	total := doc.GetEntityCounts().GetTotal()
	if total < 10 {
		t.Fatalf("the upload made %d entities, want a multi-chunk document (>= 10)", total)
	}
	p.until("all chunks but the deferred one COMPLETE in the tree", fmt.Sprintf(`(s => s && s.dataset.total === '%d' && s.dataset.complete === '%d')(document.querySelector('[data-testid=summary]'))`, total, total-2), uiWait)
	p.waitVisible(`[data-testid=tree] .tree-row[data-status="DEFERRED"]`)
	if ch := evalJS[string](p, `document.querySelector('[data-testid=tree] .tree-row[data-status="DEFERRED"]').textContent`); !strings.Contains(ch, "chunk #0 ") {
		t.Errorf("the DEFERRED row is %q, want chunk #0", ch)
	}
	p.until("the timeline catching up", fmt.Sprintf(`document.querySelectorAll('[data-testid=timeline] li[data-kind="#status"]').length >= %d`, total), uiWait)
	p.screenshot("console-document-waiting")
	p.click(`[data-testid=redeem]`)
	p.waitVisible(`[data-testid=doc-state][data-state="SUCCEEDED"]`)
	p.until("every entity COMPLETE in the tree", fmt.Sprintf(`(s => s && s.dataset.total === '%d' && s.dataset.complete === '%d')(document.querySelector('[data-testid=summary]'))`, total, total), uiWait)
	if progress := evalJS[[]int](p, `window.__progress`); len(progress) == 0 || progress[len(progress)-1] != 100 {
		t.Errorf("upload progress bar went %v, want it to end at 100%%", progress)
	}
	if rows := evalJS[string](p, `document.querySelector('[data-testid=tree]').dataset.rows`); rows != fmt.Sprint(total) {
		t.Errorf("the tree lists %s rows, want %d (root and every chunk)", rows, total)
	}
	// Chunk order: the root, then chunk #0, #1, ... in order.
	chunks := evalJS[[]int](p, `[...document.querySelectorAll('[data-testid=tree] .tree-row')].map(r => (/chunk #(\d+)/.exec(r.textContent) || [, -1])[1] * 1)`)
	if len(chunks) < 10 || chunks[0] != -1 {
		t.Fatalf("tree rows' chunk numbers %v, want the root then chunks", chunks)
	}
	for i, c := range chunks[1:] {
		if c != i {
			t.Fatalf("tree rows' chunk numbers %v are not in chunk order", chunks)
		}
	}
	// The timeline comes from the event stream only (WebSocket, ticket).
	p.until("a #status event per entity in the timeline", fmt.Sprintf(`document.querySelectorAll('[data-testid=timeline] li[data-kind="#status"]').length >= %d`, total), uiWait)
	p.until("the #document event in the timeline", `[...document.querySelectorAll('[data-testid=timeline] li[data-kind="#document"]')].some(li => /succeeded/.test(li.textContent))`, uiWait)
	p.screenshot("console-document")

	// Preview (the first 64 KiB), then download through the browser.
	p.click(`[data-testid=preview-button]`)
	p.until("the preview", `(document.querySelector('[data-testid=preview]').textContent || '').startsWith('line 000000 of the console upload test')`, uiWait)
	got := download(t, p, `[data-testid=download]`)
	if !bytes.Equal(got, content.Bytes()) {
		t.Errorf("downloaded result: %d bytes, want the %d uploaded bytes (fault passes data through)", len(got), content.Len())
	}
	if rest := resultREST(t, g, id); !bytes.Equal(got, rest.body) {
		t.Errorf("downloaded result differs from GET /v1/documents/%s/result", id)
	}

	p.open("#/documents")
	p.waitVisible(fmt.Sprintf(`tr[data-id=%q][data-state="SUCCEEDED"]`, id))
	p.screenshot("console-documents")

	// The event log page: the window, gauges, and this document in the tail.
	p.open("#/events")
	p.waitVisible(`[data-testid=gauges][data-snapshot]`)
	p.until("the document in the live tail", fmt.Sprintf(`document.querySelector('[data-testid=tail] li[data-doc=%q]')`, id), uiWait)
	p.until("the tail's replay of the window's latest events", `document.querySelectorAll('[data-testid=tail] li').length >= 50`, uiWait)
	p.screenshot("console-events")
}

// download clicks css, waits for the browser's download to complete and
// returns the file's bytes.
func download(t *testing.T, p *consolePage, css string) []byte {
	t.Helper()
	dir := t.TempDir()
	if _, err := chromedp.CallBrowser(p.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: ptrTo(true),
	}); err != nil {
		t.Fatalf("allow downloads: %v", err)
	}
	ctx, cancel := context.WithTimeout(p.ctx, uiWait)
	defer cancel()
	events := chromedp.BrowserEvents(ctx, browser.DownloadProgress)
	p.click(css)
	for ev, err := range events {
		if err != nil {
			p.fail("waiting for the download: %v", err)
		}
		switch ev.State {
		case browser.DownloadProgressStateCompleted:
			b, err := os.ReadFile(filepath.Join(dir, ev.GUID))
			if err != nil {
				t.Fatal(err)
			}
			return b
		case browser.DownloadProgressStateCanceled:
			p.fail("the browser cancelled the download")
		}
	}
	p.fail("no completed download within %v", uiWait)
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// TestConsoleRedeemClaim submits text that the fault processor defers,
// redeems the claim with the page's button, and sees the outcome, the
// document finish and the result preview.
func TestConsoleRedeemClaim(t *testing.T) {
	g := shared(t)
	const text = "deferred by the console test, then redeemed"
	p := openConsole(t, g.baseURL())
	p.open("#/documents")
	p.waitVisible("#submit-form")
	p.set("submit-text", text)
	p.set("submit-name", "deferred.txt")
	p.set("split-processor", "fault")
	p.set("submit-metadata", "pipestream.fault=defer\npipestream.claim-ttl-ms=120000")
	p.click("#submit-button")
	id := p.docIDFromHash()
	p.waitVisible(`[data-testid=redeem]:not([disabled])`)
	p.until("the DEFERRED entity in the tree", `document.querySelector('[data-testid=tree] .tree-row[data-status="DEFERRED"]')`, uiWait)
	claim := evalJS[string](p, `document.querySelector('[data-testid=redeem]').dataset.claim`)
	p.until("the claim's issue in the timeline", `[...document.querySelectorAll('[data-testid=timeline] li[data-kind="#claim"]')].some(li => li.textContent.includes('issued'))`, uiWait)
	p.screenshot("console-claim")

	p.click(`[data-testid=redeem]`)
	p.waitVisible(`[data-testid=claim-outcome][data-result="REDEEMED"]`)
	p.waitVisible(`[data-testid=doc-state][data-state="SUCCEEDED"]`)
	p.until("the result preview", fmt.Sprintf(`document.querySelector('[data-testid=preview]').textContent === %q`, text), uiWait)
	p.until("the #claim events in the timeline", `['issued', 'redeemed'].every(a => [...document.querySelectorAll('[data-testid=timeline] li[data-kind="#claim"]')].some(li => li.textContent.includes(a)))`, uiWait)
	if c := getClaim(t, g, claim); c.GetState().String() != "REDEEMED" || c.GetDocumentId() != id {
		t.Errorf("claim %s after the button: %v, want REDEEMED for %s", claim, c, id)
	}
	if outcome := evalJS[string](p, `document.querySelector('[data-testid=claim-outcome]').textContent`); !strings.Contains(outcome, "Redeemed") {
		t.Errorf("redeem outcome %q, want it said in words", outcome)
	}

	// A document the fault processor fails: the error in words.
	p.open("#/documents")
	p.waitVisible("#submit-form")
	p.set("submit-text", "this one fails")
	p.set("split-processor", "fault")
	p.set("submit-metadata", "pipestream.fault=fail")
	p.click("#submit-button")
	failed := p.docIDFromHash()
	p.waitVisible(`[data-testid=doc-state][data-state="FAILED"]`)
	p.waitVisible(`[data-testid=why]`)
	p.until("the failure in the timeline", `[...document.querySelectorAll('[data-testid=timeline] li[data-kind="#document"]')].some(li => li.textContent.includes('failed'))`, uiWait)
	why := evalJS[string](p, `document.querySelector('[data-testid=failure]').textContent`)
	if d := getREST(t, g, failed, ""); d.GetError() == "" || !strings.Contains(why, d.GetError()) || !strings.Contains(why, `processor "fault" failed the document`) {
		t.Errorf("failure panel %q, want an explanation and the error %q", why, d.GetError())
	}
	p.screenshot("console-failed")

	// The list follows states live: a deferred document turns SUCCEEDED
	// on the open page when its claim is redeemed elsewhere; the state
	// filter then finds it among the succeeded and the failed one among
	// the failed.
	d := submitREST(t, g, deferredDoc([]byte("redeemed behind the list's back"), time.Minute, nil, nil))
	cc := awaitClaims(t, g, d.GetId(), 1).GetClaimChecks()[0]
	p.open("#/documents")
	p.waitVisible(fmt.Sprintf(`tr[data-id=%q][data-state="RUNNING"]`, d.GetId()))
	wantOK(t, "redeem", curl(t, "POST", redeemURL(g, cc.GetClaimId()), []byte("{}")))
	p.waitVisible(fmt.Sprintf(`tr[data-id=%q][data-state="SUCCEEDED"]`, d.GetId()))
	p.set("state-filter", "FAILED")
	p.waitVisible(fmt.Sprintf(`tr[data-id=%q]`, failed))
	p.until("only failed documents", `[...document.querySelectorAll('[data-testid=documents] tbody tr')].every(tr => tr.dataset.state === 'FAILED')`, uiWait)
	if n := evalJS[int](p, fmt.Sprintf(`document.querySelectorAll('tr[data-id=%q]').length`, d.GetId())); n != 0 {
		t.Errorf("the FAILED filter lists the succeeded document %s", d.GetId())
	}

	// Cancel: a waiting document ends CANCELLED from its page.
	w := submitREST(t, g, deferredDoc([]byte("cancelled from the console"), time.Minute, nil, nil))
	awaitClaims(t, g, w.GetId(), 1)
	p.open("#/documents/" + w.GetId())
	p.click(`[data-testid=cancel]`)
	p.waitVisible(`[data-testid=doc-state][data-state="CANCELLED"]`)
	p.until("the cancellation in words", `/cancelled before it finished/.test(document.querySelector('[data-testid=why]').textContent)`, uiWait)
	if st := getREST(t, g, w.GetId(), "").GetState().String(); st != "CANCELLED" {
		t.Errorf("document %s is %s after the page's Cancel, want CANCELLED", w.GetId(), st)
	}
}

// TestConsoleNestedScopes: a Layer 1 document (sentences processor,
// max depth 1) shows its sub-entities one level down in their own scopes
// and every SCOPE_DIGEST marked verified, as the gateway recomputed it.
func TestConsoleNestedScopes(t *testing.T) {
	g := shared(t)
	var text strings.Builder
	for para := range 6 {
		for s := range 4 {
			fmt.Fprintf(&text, "Sentence %d.%d is here. ", para, s)
		}
		text.WriteString("\n\n")
	}
	p := openConsole(t, g.baseURL())
	p.open("#/documents")
	p.waitVisible("#submit-form")
	p.set("submit-text", text.String())
	p.set("submit-name", "nested.txt")
	p.set("split-strategy", "SPLIT_PARAGRAPHS")
	p.set("split-chunk", "100")
	p.set("split-depth", "1")
	p.set("split-processor", "sentences")
	p.click("#submit-button")
	id := p.docIDFromHash()
	p.waitVisible(`[data-testid=doc-state][data-state="SUCCEEDED"]`)
	doc := getREST(t, g, id, "")
	if len(doc.GetDigests()) == 0 {
		t.Fatalf("document %s has no scope digests: not a Layer 1 document", id)
	}
	p.until("every digest verified", fmt.Sprintf(`document.querySelectorAll('.digest-row[data-verified="true"]').length === %d`, len(doc.GetDigests())), uiWait)
	if n := evalJS[int](p, `document.querySelectorAll('.digest-row[data-verified="false"]').length`); n != 0 {
		t.Errorf("%d digests marked mismatched", n)
	}
	p.until("sub-entities one level down", `[...document.querySelectorAll('[data-testid=tree] .tree-row')].some(r => / · depth 1/.test(r.textContent))`, uiWait)
	p.until("a parent row marked with its verified digest", `document.querySelector('[data-testid=tree] .digest.verified')`, uiWait)
	p.screenshot("console-nested")
}

// TestConsoleTenants: with --auth-tokens the console asks for a token,
// works with one (REST and the WebSocket through a ticket), and a second
// tenant sees nothing of the first: not in the list, not by id, not in the
// event log.
func TestConsoleTenants(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"acme": "acme-" + uniq("token"), "globex": "globex-" + uniq("token")}
	var file strings.Builder
	for tenant, tok := range tokens {
		out, errb, code := run(t, clientTimeout, []byte(tok+"\n"), gatewayBinary(t), "hash-token", tenant)
		if code != 0 {
			t.Fatalf("gateway hash-token %s: exit %d: %s", tenant, code, errb)
		}
		file.Write(out)
	}
	tokFile := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(tokFile, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, gwOpts{args: []string{"--auth-tokens", tokFile}})
	p := openConsole(t, g.baseURL())
	useToken := func(tenant string) {
		t.Helper()
		p.set("token", tokens[tenant])
		p.click(`#token-form button[type=submit]`)
	}

	p.open("#/documents")
	p.until("the request for a token", `/requires a bearer token/.test(document.querySelector('[data-testid=list-status]').textContent)`, uiWait)
	p.waitVisible(`#live[data-state="error"]`)

	useToken("acme")
	p.until("acme's empty list", `/No documents yet/.test(document.querySelector('[data-testid=list-status]').textContent)`, uiWait)
	p.waitVisible(`#live[data-state="live"]`) // the WebSocket opened with a ticket
	p.set("submit-text", "acme's secret document")
	p.click("#submit-button")
	acmeID := p.docIDFromHash()
	p.waitVisible(`[data-testid=doc-state][data-state="SUCCEEDED"]`)
	p.until("acme's events in the timeline", `document.querySelector('[data-testid=timeline] li[data-kind="#document"]')`, uiWait)
	// With a token the download goes through fetch (a link cannot carry it).
	if got := download(t, p, `[data-testid=download]`); string(got) != "acme's secret document" {
		t.Errorf("acme's download with a token: %q", got)
	}
	p.open("#/documents")
	p.waitVisible(fmt.Sprintf(`tr[data-id=%q]`, acmeID))

	// Pages: acme's 13 documents at 10 per page, newest first.
	for i := range 12 {
		docOf(t, "acme submit", curl(t, "POST", g.baseURL()+"/v1/documents", []byte(`{"content":"`+b64([]byte(fmt.Sprint("page filler ", i)))+`","contentType":"text/plain"}`),
			"-H", "Authorization: Bearer "+tokens["acme"], "-H", "Content-Type: application/json"))
	}
	rows := `document.querySelectorAll('[data-testid=documents] tbody tr').length`
	p.set("page-size", "10")
	p.until("a first page of 10", rows+` === 10 && !document.getElementById('page-older').disabled`, uiWait)
	p.click("#page-older")
	p.until("a second page of 3 ending with acme's first document", fmt.Sprintf(rows+` === 3 && document.querySelector('[data-testid=documents] tbody tr:last-child').dataset.id === %q && document.getElementById('page-older').disabled`, acmeID), uiWait)
	p.click("#page-newer")
	p.until("the first page again", rows+` === 10 && document.getElementById('page-newer').disabled`, uiWait)

	useToken("globex")
	p.until("globex's empty list", `/No documents yet/.test(document.querySelector('[data-testid=list-status]').textContent)`, uiWait)
	if n := evalJS[int](p, rows); n != 0 {
		t.Errorf("globex's list shows %d rows, want none of acme's", n)
	}
	p.open("#/documents/" + acmeID)
	p.until("not found for acme's id", `/Not found/.test((document.querySelector('[data-testid=doc-error]') || {}).textContent)`, uiWait)

	// The live tail as globex: globex's new document shows up, acme's
	// (earlier in the log, inside the tail's window) never does.
	p.open("#/events")
	p.waitVisible(`#live[data-state="live"]`)
	r := curl(t, "POST", g.baseURL()+"/v1/documents", []byte(`{"content":"`+b64([]byte("globex's document"))+`","contentType":"text/plain"}`),
		"-H", "Authorization: Bearer "+tokens["globex"], "-H", "Content-Type: application/json")
	globexDoc := docOf(t, "globex submit", r)
	p.until("globex's document in the tail", fmt.Sprintf(`document.querySelector('[data-testid=tail] li[data-doc=%q]')`, globexDoc.GetId()), uiWait)
	if n := evalJS[int](p, fmt.Sprintf(`document.querySelectorAll('[data-testid=tail] li[data-doc=%q]').length`, acmeID)); n != 0 {
		t.Errorf("globex's live tail shows %d events of acme's document", n)
	}
}

// TestConsolePeers: the peers page shows the gateway's health, says so
// when /healthz lists no peers, and renders a peers array (the format the
// gateway is growing) when there is one; the array is injected with the
// DevTools Fetch domain.
func TestConsolePeers(t *testing.T) {
	g := shared(t)
	p := openConsole(t, g.baseURL())
	p.open("#/peers")
	p.waitVisible(`[data-testid=health] [data-state="SERVING"]`)
	var hz struct {
		Peers []json.RawMessage `json:"peers"`
	}
	if r := curl(t, "GET", g.baseURL()+"/healthz", nil); json.Unmarshal(r.body, &hz) != nil || hz.Peers == nil {
		p.waitVisible(`[data-testid=no-peers]`)
	} else {
		p.until("a row per peer", fmt.Sprintf(`document.querySelectorAll('[data-testid=peers] tbody tr').length === %d`, len(hz.Peers)), uiWait)
	}

	fake := []byte(`{"status":"SERVING","peers":[` +
		`{"addr":"127.0.0.1:4433","state":"connected","framing":"draft-02","profile":true,"inFlight":3,"window":1024,"lastError":""},` +
		`{"addr":"127.0.0.2:4433","state":"connecting","framing":"draft-04","profile":false,"inFlight":0,"window":512,"lastError":"dial: connection refused"},` +
		`{"addr":"127.0.0.3:4433","state":"down","framing":"draft-02","profile":true,"inFlight":0,"window":0,"lastError":"idle timeout: no recent network activity",` +
		`"since":"2026-11-27T08:00:00Z","framingWorked":"draft-04","shortSessions":7}]}`)
	ctx, cancel := context.WithTimeout(p.ctx, uiWait)
	defer cancel()
	paused := chromedp.Events(ctx, fetch.RequestPaused)
	if _, err := chromedp.Call(p.ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/healthz"}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: ev.RequestID, ResponseCode: 200,
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/json"}}, Body: fake})
		}
	}()
	p.click(`.peers-view .panel-head button`)
	p.until("three peers", `document.querySelectorAll('[data-testid=peers] tbody tr').length === 3`, uiWait)
	row := evalJS[string](p, `document.querySelector('[data-testid=peers] tr[data-addr="127.0.0.1:4433"]').textContent`)
	for _, want := range []string{"connected", "draft-02", "yes", "3 / 1,024 in flight"} {
		if !strings.Contains(row, want) {
			t.Errorf("peer row %q lacks %q", row, want)
		}
	}
	down := evalJS[string](p, `document.querySelector('[data-testid=peers] tr[data-state="down"]').textContent`)
	for _, want := range []string{"idle timeout", "since", "7 sessions ended right after the handshake", "worked: draft-04"} {
		if !strings.Contains(down, want) {
			t.Errorf("down peer row %q lacks %q (its last error, since when, short sessions, the framing that worked)", down, want)
		}
	}
	p.screenshot("console-peers")
}

// TestConsoleLargeTree: a document of 10,001 entities (10,000 chunks)
// fills the tree live and stays responsive: the tree keeps a bounded number
// of rows in the DOM (virtualised), scrolls to the last chunk in order, and
// scrolling stays within a frame budget.
func TestConsoleLargeTree(t *testing.T) {
	// The peer runs as its own process, stopped (SIGSTOP) from before the
	// upload until the page is open, so the page sees the tree fill in no
	// matter how fast the peer is. The pause is this test's instrument,
	// not a fault: the gateway's peer idle timeout (3 s by default, which
	// would take the stopped peer for dead and re-dispatch) is raised
	// above the time the browser takes to open the page.
	addr, cert, peer := startPeer(t)
	g := startGateway(t, gwOpts{args: []string{"--peer", addr, "--peer-ca", cert, "--peer-idle-timeout", "2m"}})
	signalProc(t, peer, syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			signalProc(t, peer, syscall.SIGCONT)
		}
	}()
	// 10,000 chunks of 1,100 bytes: 909 children per MB, inside the
	// profile's amplification limit (1,000 per MB). textstats merges the
	// chunk outputs into one small result.
	data := binaryData(11_000_000, 17)
	path := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := curl(t, "POST", g.baseURL()+"/v1/documents:upload?split.strategy=SPLIT_FIXED_BYTES&split.chunkBytes=1100&split.processor=textstats",
		nil, "--data-binary", "@"+path, "-H", "Content-Type: application/octet-stream")
	doc := docOf(t, "upload", r)

	p := openConsole(t, g.baseURL())
	p.open("#/documents/" + doc.GetId())
	// Main-thread lag while the tree fills: a 50 ms timer that fires late
	// means the page was busy.
	// The COMPLETE counter as the page shows it, to see the tree fill in.
	evalJS[bool](p, `(() => { window.__lag = 0; let last = performance.now(); setInterval(() => { const now = performance.now();
		window.__lag = Math.max(window.__lag, now - last - 50); last = now; }, 50);
		window.__complete = []; new MutationObserver(() => { const s = document.querySelector('[data-testid=summary]'); if (s) window.__complete.push(+s.dataset.complete); })
			.observe(document.body, {subtree: true, attributes: true, attributeFilter: ['data-complete']}); return true; })()`)
	p.waitVisible(`[data-testid=doc-state][data-state="RUNNING"]`)
	signalProc(t, peer, syscall.SIGCONT)
	resumed = true
	p.until("10,001 COMPLETE entities", `(s => s && s.dataset.total === '10001' && s.dataset.complete === '10001')(document.querySelector('[data-testid=summary]'))`, 3*time.Minute)
	p.waitVisible(`[data-testid=doc-state][data-state="SUCCEEDED"]`)
	t.Logf("largest main-thread stall while 10,001 entities arrived: %.0f ms", evalJS[float64](p, `window.__lag`))
	partial := map[int]bool{}
	for _, n := range evalJS[[]int](p, `window.__complete`) {
		if n > 0 && n < 10001 {
			partial[n] = true
		}
	}
	// The page opened while the peer was stopped: it shows the tree
	// part-way at least once before complete.
	t.Logf("COMPLETE counts shown part-way: %d", len(partial))
	if len(partial) == 0 {
		t.Errorf("the COMPLETE counter never showed a part-way count, want the tree to fill in live")
	}

	type scroll struct {
		Ms       float64 `json:"ms"`
		Rows     int     `json:"rows"`
		Total    string  `json:"total"`
		LastText string  `json:"lastText"`
	}
	s := evalJS[scroll](p, `(async () => {
		const vp = document.querySelector('[data-testid=tree]');
		const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
		const t0 = performance.now();
		for (let i = 1; i <= 20; i++) { vp.scrollTop = vp.scrollHeight * i / 20; await frame(); }
		const rows = [...vp.querySelectorAll('.tree-row')];
		return {ms: (performance.now() - t0) / 20, rows: rows.length, total: vp.dataset.rows, lastText: rows[rows.length - 1].textContent};
	})()`)
	t.Logf("scrolling 10,001 entities: %.1f ms per step, %d rows in the DOM", s.Ms, s.Rows)
	if s.Total != "10001" {
		t.Errorf("the tree lists %s entities, want 10001", s.Total)
	}
	if s.Rows > 200 {
		t.Errorf("%d tree rows in the DOM for 10,001 entities: the tree is not virtualised", s.Rows)
	}
	if !strings.Contains(s.LastText, "chunk #9999") {
		t.Errorf("the last row after scrolling to the end is %q, want chunk #9999", s.LastText)
	}
	if s.Ms > 250 {
		t.Errorf("scrolling took %.0f ms per step, want a responsive tree (< 250 ms on a loaded CI machine)", s.Ms)
	}
	p.screenshot("console-large")
}
