// Command genclient drives every operation of the gateway's REST API
// through the go-swagger client that e2e/genclient_test.go generates from
// the spec the gateway serves (GET /openapi.json). It is compiled in a
// temporary module next to the generated client/ and models/ packages,
// never as part of the gateway module (testdata is ignored by go build).
//
// It prints one JSON report on stdout: the outcome of each operation by
// operationId ("ok" or what went wrong) and, per processor, the document
// and the result bytes downloaded through the generated client. The test
// checks the report against the spec and against curl.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	httptransport "github.com/go-openapi/runtime/client"
	"github.com/go-openapi/strfmt"

	"pipestream.test/genclient/client"
	"pipestream.test/genclient/client/document_service"
	"pipestream.test/genclient/client/event_service"
	lro "pipestream.test/genclient/client/google_longrunning_operations"
	"pipestream.test/genclient/client/operations"
	"pipestream.test/genclient/models"
)

// input is the content of every submitted document: sentences for the
// sentences processor, words for textstats.
const input = "Generated clients work. The spec tells the truth! Does every result arrive?\n"

type result struct {
	Processor   string `json:"processor"`
	ID          string `json:"id"`
	State       string `json:"state"`
	ContentType string `json:"contentType"` // as served to the generated client
	Size        int64  `json:"size"`        // Content-Length as the client parsed it
	Bytes       []byte `json:"bytes"`
}

type report struct {
	Input      []byte            `json:"input"`
	Operations map[string]string `json:"operations"`
	Results    []result          `json:"results"`
	Messages   map[string]int    `json:"messages"` // stream messages read (as JSON pages) per stream operation
}

type driver struct {
	ctx context.Context
	api *client.Pipestream
	rep *report
}

func main() {
	base := flag.String("base", "", "gateway base URL, e.g. http://127.0.0.1:8080")
	procs := flag.String("processors", "", "comma-separated processors to run")
	flag.Parse()
	u, err := url.Parse(*base)
	if err != nil || u.Host == "" || *procs == "" {
		fmt.Fprintln(os.Stderr, "usage: genclient -base http://HOST:PORT -processors a,b,c")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The generated client as generated: watch, subscribe and the snapshot
	// are read as the JSON pages the spec declares first, with no code of
	// our own.
	rt := httptransport.New(u.Host, "/", []string{u.Scheme})
	d := &driver{ctx: ctx, api: client.New(rt, strfmt.Default),
		rep: &report{Input: []byte(input), Operations: map[string]string{}, Messages: map[string]int{}}}
	for _, p := range strings.Split(*procs, ",") {
		d.runProcessor(p)
	}
	d.runOthers()
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d.rep); err != nil {
		os.Exit(1)
	}
}

// record notes the outcome of an operation; a failure is kept over a later
// success.
func (d *driver) record(op string, err error) {
	if err != nil {
		d.rep.Operations[op] = fmt.Sprintf("%T: %v", err, err)
		return
	}
	if _, failed := d.rep.Operations[op]; !failed {
		d.rep.Operations[op] = "ok"
	}
}

func (d *driver) fail(op, format string, args ...any) {
	d.rep.Operations[op] = fmt.Sprintf(format, args...)
}

// submit creates a document with processor p (and metadata md) through
// SubmitDocument.
func (d *driver) submit(p string, md map[string]string) string {
	content := strfmt.Base64(input)
	body := &models.SubmitDocumentRequest{Content: &content, ContentType: "text/plain", DisplayName: "genclient-" + p,
		Split: &models.SplitOptions{Processor: p}, Metadata: md}
	resp, err := d.api.DocumentService.DocumentServiceSubmitDocument(
		document_service.NewDocumentServiceSubmitDocumentParamsWithContext(d.ctx).WithBody(body), nil)
	d.record("DocumentService_SubmitDocument", err)
	if err != nil {
		return ""
	}
	return resp.Payload.ID
}

// runProcessor submits a document for processor p, follows it to its end
// (the fault processor defers it: its claim check is read and redeemed
// first) and downloads the result.
func (d *driver) runProcessor(p string) {
	var md map[string]string
	if p == "fault" {
		md = map[string]string{"pipestream.fault": "defer"}
	}
	id := d.submit(p, md)
	if id == "" {
		return
	}
	if p == "fault" {
		d.redeemClaims(id)
	}
	doc := d.watch(id)
	res := result{Processor: p, ID: id, State: doc}
	var buf bytes.Buffer
	ok, err := d.api.DocumentService.DocumentServiceGetDocumentResult(
		document_service.NewDocumentServiceGetDocumentResultParamsWithContext(d.ctx).WithID(id), nil, &buf)
	d.record("DocumentService_GetDocumentResult", err)
	if err == nil {
		res.ContentType, res.Size, res.Bytes = ok.ContentType, ok.ContentLength, buf.Bytes()
	}
	d.rep.Results = append(d.rep.Results, res)
}

// watch follows WatchDocument to its end, page by page (each page waits
// up to 30 s for an update; nextCursor is the next page's cursor), and
// returns the last state.
func (d *driver) watch(id string) string {
	const op = "DocumentService_WatchDocument"
	wait := int32(30)
	var cursor *string
	last := ""
	for {
		resp, err := d.api.DocumentService.DocumentServiceWatchDocument(
			document_service.NewDocumentServiceWatchDocumentParamsWithContext(d.ctx).WithID(id).WithCursor(cursor).WithWaitSeconds(&wait), nil)
		d.record(op, err)
		if err != nil {
			return ""
		}
		page := resp.Payload
		for _, u := range page.Updates {
			if u.Document == nil || u.Document.State == nil {
				d.fail(op, "update %+v has no document state", u)
				return ""
			}
			last = string(*u.Document.State)
			d.rep.Messages[op]++
		}
		if page.Done {
			return last
		}
		if page.NextCursor == "" {
			d.fail(op, "page %+v is not done and has no nextCursor", page)
			return ""
		}
		next := page.NextCursor
		cursor = &next
	}
}

// redeemClaims waits (GetDocument) until the document lists a claim
// check, reads it (GetClaimCheck) and redeems it (RedeemClaimCheck).
func (d *driver) redeemClaims(id string) {
	var claims []*models.ClaimCheck
	for deadline := time.Now().Add(30 * time.Second); len(claims) == 0; {
		resp, err := d.api.DocumentService.DocumentServiceGetDocument(
			document_service.NewDocumentServiceGetDocumentParamsWithContext(d.ctx).WithID(id), nil)
		d.record("DocumentService_GetDocument", err)
		if err != nil {
			return
		}
		claims = resp.Payload.ClaimChecks
		if time.Now().After(deadline) {
			d.fail("DocumentService_GetClaimCheck", "document %s listed no claim check within 30 s", id)
			return
		}
		if len(claims) == 0 {
			time.Sleep(50 * time.Millisecond) // polling a real server with a deadline
		}
	}
	for _, c := range claims {
		got, err := d.api.DocumentService.DocumentServiceGetClaimCheck(
			document_service.NewDocumentServiceGetClaimCheckParamsWithContext(d.ctx).WithClaimID(c.ClaimID), nil)
		d.record("DocumentService_GetClaimCheck", err)
		if err == nil && (got.Payload.DocumentID != id || got.Payload.State == nil || *got.Payload.State != models.ClaimStateISSUED) {
			d.fail("DocumentService_GetClaimCheck", "claim %s: %+v, want ISSUED for %s", c.ClaimID, got.Payload, id)
		}
		red, err := d.api.DocumentService.DocumentServiceRedeemClaimCheck(
			document_service.NewDocumentServiceRedeemClaimCheckParamsWithContext(d.ctx).WithClaimID(c.ClaimID).WithBody(map[string]any{}), nil)
		d.record("DocumentService_RedeemClaimCheck", err)
		if err == nil && (red.Payload.State == nil || *red.Payload.State != models.ClaimStateREDEEMED) {
			d.fail("DocumentService_RedeemClaimCheck", "claim %s after redeem: %+v, want REDEEMED", c.ClaimID, red.Payload)
		}
	}
}

// runOthers runs the operations that are not part of a processor's round
// trip, and the typed errors of the spec.
func (d *driver) runOthers() {
	d.upload()
	d.cancel()
	d.errors()
	d.events()
	d.operations()
	d.longRunning()
}

func (d *driver) upload() {
	body := []byte{0, 1, 2, 0xff, 'p', 's', '\n'}
	ct, proc := "application/octet-stream", "passthrough"
	resp, err := d.api.DocumentService.DocumentServiceUploadDocument(
		document_service.NewDocumentServiceUploadDocumentParamsWithContext(d.ctx).
			WithBody(io.NopCloser(bytes.NewReader(body))).WithContentType(&ct).WithSplitProcessor(&proc), nil)
	d.record("DocumentService_UploadDocument", err)
	if err != nil {
		return
	}
	id := resp.Payload.ID
	if state := d.watch(id); state != string(models.StateSUCCEEDED) {
		d.fail("DocumentService_UploadDocument", "uploaded document %s ended %s", id, state)
		return
	}
	var buf bytes.Buffer
	_, err = d.api.DocumentService.DocumentServiceGetDocumentResult(
		document_service.NewDocumentServiceGetDocumentResultParamsWithContext(d.ctx).WithID(id), nil, &buf)
	d.record("DocumentService_GetDocumentResult", err)
	if err == nil && !bytes.Equal(buf.Bytes(), body) {
		d.fail("DocumentService_UploadDocument", "uploaded %x, result %x", body, buf.Bytes())
	}
}

// cancel cancels a deferred document (CancelDocument) and lists it.
func (d *driver) cancel() {
	id := d.submit("fault", map[string]string{"pipestream.fault": "defer"})
	if id == "" {
		return
	}
	resp, err := d.api.DocumentService.DocumentServiceCancelDocument(
		document_service.NewDocumentServiceCancelDocumentParamsWithContext(d.ctx).WithID(id).WithBody(map[string]any{}), nil)
	d.record("DocumentService_CancelDocument", err)
	if err == nil && (resp.Payload.State == nil || *resp.Payload.State != models.StateCANCELLED) {
		d.fail("DocumentService_CancelDocument", "cancelled document %s: state %v", id, resp.Payload.State)
	}
	size := int32(100)
	list, err := d.api.DocumentService.DocumentServiceListDocuments(
		document_service.NewDocumentServiceListDocumentsParamsWithContext(d.ctx).WithPageSize(&size), nil)
	d.record("DocumentService_ListDocuments", err)
	if err == nil && !listed(list.Payload.Documents, id) {
		d.fail("DocumentService_ListDocuments", "the first page does not list %s", id)
	}
	// Cancelling again is FailedPrecondition: the typed 400 carries the Status.
	_, err = d.api.DocumentService.DocumentServiceCancelDocument(
		document_service.NewDocumentServiceCancelDocumentParamsWithContext(d.ctx).WithID(id).WithBody(map[string]any{}), nil)
	var bad *document_service.DocumentServiceCancelDocumentBadRequest
	if !errors.As(err, &bad) || bad.Payload == nil || bad.Payload.Code != 9 || bad.Payload.Message == "" {
		d.fail("DocumentService_CancelDocument", "second cancel: %v, want a typed 400 with Status code 9 and a message", err)
	}
}

func listed(docs []*models.Document, id string) bool {
	for _, doc := range docs {
		if doc.ID == id {
			return true
		}
	}
	return false
}

// errors checks that error responses decode into the spec's typed errors
// with their Status (a stream refused before it starts included).
func (d *driver) errors() {
	_, err := d.api.DocumentService.DocumentServiceGetDocument(
		document_service.NewDocumentServiceGetDocumentParamsWithContext(d.ctx).WithID("no-such-doc"), nil)
	var nf *document_service.DocumentServiceGetDocumentNotFound
	if !errors.As(err, &nf) || nf.Payload == nil || nf.Payload.Code != 5 || nf.Payload.Message == "" {
		d.fail("DocumentService_GetDocument", "unknown id: %v, want a typed 404 with Status code 5 and a message", err)
	}
	_, err = d.api.DocumentService.DocumentServiceWatchDocument(
		document_service.NewDocumentServiceWatchDocumentParamsWithContext(d.ctx).WithID("no-such-doc"), nil)
	var wnf *document_service.DocumentServiceWatchDocumentNotFound
	if !errors.As(err, &wnf) || wnf.Payload == nil || wnf.Payload.Code != 5 || wnf.Payload.Message == "" {
		d.fail("DocumentService_WatchDocument", "unknown id: %v, want a typed 404 with Status code 5 and a message", err)
	}
	_, err = d.api.DocumentService.DocumentServiceGetDocumentResult(
		document_service.NewDocumentServiceGetDocumentResultParamsWithContext(d.ctx).WithID("no-such-doc"), nil, io.Discard)
	var rnf *document_service.DocumentServiceGetDocumentResultNotFound
	if !errors.As(err, &rnf) || rnf.Payload == nil || rnf.Payload.Code != 5 || rnf.Payload.Message == "" {
		d.fail("DocumentService_GetDocumentResult", "unknown id: %v, want a typed 404 with Status code 5 and a message", err)
	}
}

// events runs the event log operations: the window, a snapshot, the NDJSON
// subscription from cursor 0 (first line), a WebSocket ticket, and the
// WebSocket upgrade (101) and its JSON pre-upgrade error.
func (d *driver) events() {
	es := d.api.EventService
	w, err := es.EventServiceGetEventWindow(event_service.NewEventServiceGetEventWindowParamsWithContext(d.ctx), nil)
	d.record("EventService_GetEventWindow", err)
	if err == nil && (w.Payload.LatestSeq == "" || w.Payload.LatestSeq == "0") {
		d.fail("EventService_GetEventWindow", "window %+v has no events after the submissions", w.Payload)
	}
	snap, err := es.EventServiceGetSnapshot(event_service.NewEventServiceGetSnapshotParamsWithContext(d.ctx), nil)
	d.record("EventService_GetSnapshot", err)
	if err == nil && len(snap.Payload.Documents) == 0 {
		d.fail("EventService_GetSnapshot", "snapshot lists no document")
	}
	if snap != nil && snap.Payload != nil {
		d.streamSnapshot(len(snap.Payload.Documents), snap.Payload.Seq)
	}
	d.subscribe()
	tk, err := es.EventServiceCreateWebSocketTicket(event_service.NewEventServiceCreateWebSocketTicketParamsWithContext(d.ctx), nil)
	d.record("EventService_CreateWebSocketTicket", err)
	if err != nil {
		return
	}
	ws := func(cursor string, ticket *string) error {
		return es.EventServiceSubscribeEventsWebSocket(event_service.NewEventServiceSubscribeEventsWebSocketParamsWithContext(d.ctx).
			WithConnection("Upgrade").WithUpgrade("websocket").WithSecWebSocketVersion("13").
			WithSecWebSocketKey("dGhlIHNhbXBsZSBub25jZQ==").WithCursor(&cursor).WithTicket(ticket), nil)
	}
	var up *event_service.EventServiceSubscribeEventsWebSocketSwitchingProtocols
	if err := ws("0", &tk.Payload.Ticket); !errors.As(err, &up) {
		d.fail("EventService_SubscribeEventsWebSocket", "upgrade with a ticket: %v, want 101 Switching Protocols", err)
	} else {
		d.record("EventService_SubscribeEventsWebSocket", nil)
	}
	var bad *event_service.EventServiceSubscribeEventsWebSocketBadRequest
	if err := ws("not-a-number", nil); !errors.As(err, &bad) || bad.Payload == nil || bad.Payload.Code != 3 ||
		bad.Payload.Error == "" || !strings.Contains(bad.Payload.Message, "cursor") {
		d.fail("EventService_SubscribeEventsWebSocket", "bad cursor: %v, want a typed 400 with code 3, an error name and a message about the cursor", err)
	}
}

// streamSnapshot reads StreamSnapshot as JSON pages of 2 documents,
// passing nextPageToken back until it is empty, and checks that every
// page names the first page's seq (at or after GetSnapshot's: a document
// may have moved on since) and that the pages hold GetSnapshot's
// documents, each once.
func (d *driver) streamSnapshot(docs int, snapSeq string) {
	const op = "EventService_StreamSnapshot"
	size, token, seq := int64(2), "", ""
	seen := map[string]bool{}
	for pages := 0; ; pages++ {
		if pages > docs+1 {
			d.fail(op, "%d pages for %d documents: the tokens do not advance", pages, docs)
			return
		}
		tok := token
		ss, err := d.api.EventService.EventServiceStreamSnapshot(event_service.NewEventServiceStreamSnapshotParamsWithContext(d.ctx).
			WithPageSize(&size).WithPageToken(&tok), nil)
		d.record(op, err)
		if err != nil {
			return
		}
		page := ss.Payload
		if seq == "" {
			seq = page.Seq
			if a, b := atoi(seq), atoi(snapSeq); a < b || b == 0 {
				d.fail(op, "first page at seq %q, before GetSnapshot's %s", seq, snapSeq)
			}
		}
		if page.Seq != seq || len(page.Documents) > int(size) {
			d.fail(op, "page %d: seq %q with %d documents, want the first page's seq %s and at most %d", pages, page.Seq, len(page.Documents), seq, size)
			return
		}
		for _, doc := range page.Documents {
			if seen[doc.ID] || doc.Name != "documents/"+doc.ID {
				d.fail(op, "document %s (name %q) twice or misnamed", doc.ID, doc.Name)
			}
			seen[doc.ID] = true
		}
		d.rep.Messages[op] += len(page.Documents)
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if len(seen) != docs {
		d.fail(op, "the pages hold %d documents, GetSnapshot %d", len(seen), docs)
	}
}

// atoi is a decimal uint64 string's value (0 when it is not one).
func atoi(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// subscribe reads the event log from cursor 0 through SubscribeEvents
// pages of at most 3 events until it has 3, checking that seqs rise and
// each page's nextCursor follows its last event.
func (d *driver) subscribe() {
	const op = "EventService_SubscribeEvents"
	cursor, size, wait := "0", int32(3), int32(10)
	var seqs []uint64
	for len(seqs) < 3 {
		c := cursor
		sub, err := d.api.EventService.EventServiceSubscribeEvents(event_service.NewEventServiceSubscribeEventsParamsWithContext(d.ctx).
			WithCursor(&c).WithPageSize(&size).WithWaitSeconds(&wait), nil)
		d.record(op, err)
		if err != nil {
			return
		}
		page := sub.Payload
		if len(page.Events) == 0 || len(page.Events) > int(size) {
			d.fail(op, "page at cursor %s has %d events, want 1 to %d (the log has more)", cursor, len(page.Events), size)
			return
		}
		for _, ev := range page.Events {
			n, perr := strconv.ParseUint(ev.Seq, 10, 64)
			if perr != nil || len(seqs) > 0 && n <= seqs[len(seqs)-1] {
				d.fail(op, "event seq %q after %v: not a rising seq", ev.Seq, seqs)
				return
			}
			seqs = append(seqs, n)
		}
		if want := strconv.FormatUint(seqs[len(seqs)-1]+1, 10); page.NextCursor != want {
			d.fail(op, "nextCursor %q after seq %d, want %s", page.NextCursor, seqs[len(seqs)-1], want)
			return
		}
		cursor = page.NextCursor
	}
	d.rep.Messages[op] = min(len(seqs), 3)
}

// operations runs the untagged endpoints: health, metrics, the spec, docs
// and the console.
func (d *driver) operations() {
	ops := d.api.Operations
	h, err := ops.OperationsHealth(operations.NewOperationsHealthParamsWithContext(d.ctx))
	d.record("Operations_Health", err)
	if err == nil && h.Payload.Status != "SERVING" {
		d.fail("Operations_Health", "health %+v, want SERVING", h.Payload)
	}
	m, err := ops.OperationsMetrics(operations.NewOperationsMetricsParamsWithContext(d.ctx))
	d.record("Operations_Metrics", err)
	if err == nil && !strings.Contains(m.Payload, "# TYPE") {
		d.fail("Operations_Metrics", "metrics without a # TYPE line")
	}
	s, err := ops.OperationsOpenAPISpec(operations.NewOperationsOpenAPISpecParamsWithContext(d.ctx))
	d.record("Operations_OpenAPISpec", err)
	if spec, ok := s.GetPayload().(map[string]any); err == nil && (!ok || spec["swagger"] != "2.0") {
		d.fail("Operations_OpenAPISpec", "spec %T is not a Swagger 2.0 object", s.GetPayload())
	}
	docs, err := ops.OperationsDocs(operations.NewOperationsDocsParamsWithContext(d.ctx))
	d.record("Operations_Docs", err)
	if err == nil && !strings.Contains(strings.ToLower(docs.Payload), "<html") {
		d.fail("Operations_Docs", "docs page is not HTML")
	}
	ui, err := ops.OperationsConsole(operations.NewOperationsConsoleParamsWithContext(d.ctx))
	d.record("Operations_Console", err)
	if err == nil && !strings.Contains(strings.ToLower(ui.Payload), "<html") {
		d.fail("Operations_Console", "console page is not HTML")
	}
}

// longRunning runs google.longrunning.Operations over documents: a finished
// document is a done operation whose response is a ResultRef; a deferred
// one is not done after a short wait, is cancelled, and is then done with
// error CANCELLED; it is listed; Delete is refused as Unimplemented; an
// unknown id is a typed 404.
func (d *driver) longRunning() {
	ops := d.api.GoogleLongrunningOperations
	done := d.submit("passthrough", nil)
	if done != "" && d.watch(done) == string(models.StateSUCCEEDED) {
		got, err := ops.OperationsGetOperation(lro.NewOperationsGetOperationParamsWithContext(d.ctx).WithID(done), nil)
		d.record("Operations_GetOperation", err)
		if err == nil {
			d.checkResultRef(got.Payload, done)
		}
	}
	id := d.submit("fault", map[string]string{"pipestream.fault": "defer"})
	if id == "" {
		return
	}
	w, err := ops.OperationsWaitOperation(lro.NewOperationsWaitOperationParamsWithContext(d.ctx).WithID(id).
		WithBody(lro.OperationsWaitOperationBody{Timeout: "1s"}), nil)
	d.record("Operations_WaitOperation", err)
	if err == nil && w.Payload.Done {
		d.fail("Operations_WaitOperation", "a deferred document's operation is done after a 1 s wait: %+v", w.Payload)
	}
	_, err = ops.OperationsCancelOperation(lro.NewOperationsCancelOperationParamsWithContext(d.ctx).WithID(id).WithBody(map[string]any{}), nil)
	d.record("Operations_CancelOperation", err)
	w, err = ops.OperationsWaitOperation(lro.NewOperationsWaitOperationParamsWithContext(d.ctx).WithID(id).
		WithBody(lro.OperationsWaitOperationBody{Timeout: "30s"}), nil)
	d.record("Operations_WaitOperation", err)
	if err == nil && (!w.Payload.Done || w.Payload.Error == nil || w.Payload.Error.Code != 1) {
		d.fail("Operations_CancelOperation", "after cancel: %+v, want done with error code 1 (CANCELLED)", w.Payload)
	}
	d.listAndRefuse(id)
}

// checkResultRef checks a done operation's name and ResultRef response.
func (d *driver) checkResultRef(op *models.Operation, id string) {
	if op.Name != "operations/"+id || !op.Done || op.Error != nil || op.Response == nil {
		d.fail("Operations_GetOperation", "operation %+v, want operations/%s done with a response", op, id)
		return
	}
	props := op.Response.AnyAdditionalProperties
	if !strings.HasSuffix(op.Response.AtType, "ResultRef") || props["documentId"] != id || props["resultPath"] == "" {
		d.fail("Operations_GetOperation", "response %s %v, want a ResultRef of %s with a resultPath", op.Response.AtType, props, id)
	}
}

// listAndRefuse lists operations (id must be there), deletes one (refused
// as Unimplemented) and gets an unknown one (typed 404).
func (d *driver) listAndRefuse(id string) {
	ops := d.api.GoogleLongrunningOperations
	size := int32(100)
	list, err := ops.OperationsListOperations(lro.NewOperationsListOperationsParamsWithContext(d.ctx).WithPageSize(&size), nil)
	d.record("Operations_ListOperations", err)
	if err == nil {
		found := false
		for _, op := range list.Payload.Operations {
			found = found || op.Name == "operations/"+id
		}
		if !found {
			d.fail("Operations_ListOperations", "the first page does not list operations/%s", id)
		}
	}
	_, err = ops.OperationsDeleteOperation(lro.NewOperationsDeleteOperationParamsWithContext(d.ctx).WithID(id), nil)
	var unimpl *lro.OperationsDeleteOperationNotImplemented
	if errors.As(err, &unimpl) && unimpl.Payload != nil && unimpl.Payload.Code == 12 {
		d.record("Operations_DeleteOperation", nil)
	} else {
		d.fail("Operations_DeleteOperation", "delete: %v, want a typed 501 with Status code 12 (UNIMPLEMENTED)", err)
	}
	_, err = ops.OperationsGetOperation(lro.NewOperationsGetOperationParamsWithContext(d.ctx).WithID("no-such-document"), nil)
	var nf *lro.OperationsGetOperationNotFound
	if !errors.As(err, &nf) || nf.Payload == nil || nf.Payload.Code != 5 {
		d.fail("Operations_GetOperation", "unknown id: %v, want a typed 404 with Status code 5", err)
	}
}
