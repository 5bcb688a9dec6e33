package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestStreamSnapshot streams a real bridge's snapshot (SQLite store) over
// gRPC and over REST (NDJSON) in chunks smaller than the store: every
// document arrives exactly once, every chunk names the same seq, the final
// chunk says last with the count, and GetSnapshot past its one-message
// limit fails with SNAPSHOT_TOO_LARGE naming StreamSnapshot instead of
// sending one huge message.
func TestStreamSnapshot(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9", PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })
	const n = 23
	for i := range n {
		body := fmt.Sprintf(`{"content":"aGVsbG8=","contentType":"text/plain","displayName":"d%d.txt"}`, i)
		if code, _, resp := h.do("POST", "/v1/documents", strings.NewReader(body)); code != 200 {
			t.Fatalf("submit %d: HTTP %d %s", i, code, resp)
		}
	}
	ctx := context.Background()

	// gRPC, 5 documents a chunk: 5 chunks of documents and the final one.
	st, err := h.events.StreamSnapshot(ctx, &gatewayv1.StreamSnapshotRequest{PageSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	var chunks []*gatewayv1.SnapshotChunk
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	checkChunks(t, "gRPC", chunks, n, 5)

	// REST: one {"result": chunk} line per chunk.
	code, _, body := h.do("GET", "/v1/events:streamSnapshot?pageSize=10", nil)
	if code != 200 {
		t.Fatalf("GET /v1/events:streamSnapshot: HTTP %d %s", code, body)
	}
	chunks = chunks[:0]
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			Result json.RawMessage
			Error  json.RawMessage
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Error != nil {
			t.Fatalf("NDJSON line %s: %v", sc.Bytes(), err)
		}
		c := new(gatewayv1.SnapshotChunk)
		if err := protojson.Unmarshal(line.Result, c); err != nil {
			t.Fatalf("chunk %s: %v", line.Result, err)
		}
		chunks = append(chunks, c)
	}
	checkChunks(t, "REST", chunks, n, 10)

	st, _ = h.events.StreamSnapshot(ctx, &gatewayv1.StreamSnapshotRequest{PageSize: 10001})
	if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("page_size 10001: %v, want InvalidArgument", err)
	}

	// GetSnapshot: whole under the limit, refused past it.
	snap, err := h.events.GetSnapshot(ctx, &gatewayv1.GetSnapshotRequest{})
	if err != nil || len(snap.GetDocuments()) != n || snap.GetSeq() != chunks[0].GetSeq() {
		t.Fatalf("GetSnapshot = %d documents at seq %d, %v; want %d at %d", len(snap.GetDocuments()), snap.GetSeq(), err, n, chunks[0].GetSeq())
	}
	defer gateway.SetMaxUnarySnapshotBytes(1000)()
	_, err = h.events.GetSnapshot(ctx, &gatewayv1.GetSnapshotRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "StreamSnapshot") {
		t.Fatalf("GetSnapshot past the limit: %v, want ResourceExhausted naming StreamSnapshot", err)
	}
	code, _, body = h.do("GET", "/v1/events:snapshot", nil)
	if code != 429 || decodeStatus(t, body).reason() != gateway.ReasonSnapshotTooLarge {
		t.Errorf("GET /v1/events:snapshot past the limit: HTTP %d %s, want 429 SNAPSHOT_TOO_LARGE", code, body)
	}
}

func checkChunks(t *testing.T, via string, chunks []*gatewayv1.SnapshotChunk, n, page int) {
	t.Helper()
	if len(chunks) == 0 {
		t.Fatalf("%s: no chunk", via)
	}
	seen := map[string]bool{}
	seq := chunks[0].GetSeq()
	for i, c := range chunks {
		if c.GetSeq() != seq || seq == 0 {
			t.Errorf("%s: chunk %d has seq %d, the first %d", via, i, c.GetSeq(), seq)
		}
		if len(c.GetDocuments()) > page {
			t.Errorf("%s: chunk %d has %d documents, page %d", via, i, len(c.GetDocuments()), page)
		}
		if c.GetLast() != (i == len(chunks)-1) {
			t.Errorf("%s: chunk %d of %d: last = %v", via, i, len(chunks), c.GetLast())
		}
		for _, d := range c.GetDocuments() {
			if seen[d.GetId()] || d.GetName() != "documents/"+d.GetId() {
				t.Errorf("%s: document %s (name %q) twice or misnamed", via, d.GetId(), d.GetName())
			}
			seen[d.GetId()] = true
		}
	}
	if len(seen) != n || chunks[len(chunks)-1].GetTotalDocuments() != uint64(n) {
		t.Errorf("%s: %d documents, total %d; want %d", via, len(seen), chunks[len(chunks)-1].GetTotalDocuments(), n)
	}
	if want := (n+page-1)/page + 1; len(chunks) != want {
		t.Errorf("%s: %d chunks, want %d", via, len(chunks), want)
	}
}

// TestSnapshotPageAndSSEForms: with Accept: application/json the snapshot
// route answers pages of pageSize documents with the first page's seq and
// a nextPageToken until the last page (a client generated from the spec
// reads it like ListDocuments), holding the NDJSON stream's documents,
// each once, in the same order; a token it did not issue is a 400 with
// the error shape of every route. With Accept: text/event-stream it sends
// one data event per chunk (the last chunk included) and a final "end"
// event.
func TestSnapshotPageAndSSEForms(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir: t.TempDir(), PeerAddr: "127.0.0.1:9", PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })
	const n = 23
	for i := range n {
		body := fmt.Sprintf(`{"content":"aGVsbG8=","contentType":"text/plain","displayName":"d%d.txt"}`, i)
		if code, _, resp := h.do("POST", "/v1/documents", strings.NewReader(body)); code != 200 {
			t.Fatalf("submit %d: HTTP %d %s", i, code, resp)
		}
	}
	// The NDJSON stream's order, for comparison.
	code, _, body := h.do("GET", "/v1/events:streamSnapshot?pageSize=7", nil)
	if code != 200 {
		t.Fatalf("NDJSON: HTTP %d %s", code, body)
	}
	var want []string
	var seq string
	for _, line := range bytes.Split(bytes.TrimSpace(body), []byte("\n")) {
		var l struct {
			Result struct {
				Seq       string
				Documents []struct{ ID string }
			}
		}
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("NDJSON line %s: %v", line, err)
		}
		seq = l.Result.Seq
		for _, d := range l.Result.Documents {
			want = append(want, d.ID)
		}
	}

	accept := []string{"Accept", "application/json"}
	got, pages := readSnapshotPages(t, h, seq)
	if strings.Join(got, ",") != strings.Join(want, ",") || pages != 5 {
		t.Errorf("pages: %d pages with %v\nwant 5 pages with %v", pages, got, want)
	}

	code, _, body = h.do("GET", "/v1/events:streamSnapshot?pageToken=bm90LWEtdG9rZW4", nil, accept...)
	if st := decodeStatus(t, body); code != 400 || st.reason() == "" || !strings.Contains(st.Message, "pageToken") {
		t.Errorf("forged token: HTTP %d %s, want 400 with a reason naming pageToken", code, body)
	}
	code, _, body = h.do("GET", "/v1/events:streamSnapshot?pageSize=10001", nil, accept...)
	if code != 400 {
		t.Errorf("pageSize 10001: HTTP %d %s, want 400", code, body)
	}

	checkSnapshotSSE(t, h, n)
}

// failingSnapshot is a bridge whose encoded snapshot sends one chunk of a
// document and then fails with err.
type failingSnapshot struct {
	bridge.Service
	err error
}

func (f failingSnapshot) Events() bridge.EventLog { return failingLog{f.Service.Events(), f.err} }

type failingLog struct {
	bridge.EventLog
	err error
}

func (l failingLog) StreamSnapshotEncoded(_ context.Context, _ bridge.Tenant, _ int, _ bridge.SnapshotPosition, send func([]byte, bridge.SnapshotPosition) error) error {
	c, _ := proto.Marshal(&gatewayv1.SnapshotChunk{Seq: 7, Documents: []*gatewayv1.Document{{Id: "d1", Name: "documents/d1"}}})
	if err := send(c, bridge.SnapshotPosition{}); err != nil {
		return err
	}
	return l.err
}

// TestSnapshotStreamFailsWithOneErrorLine: a REST snapshot stream that
// fails after its 200 ends with exactly one {"error": Status} line (NDJSON)
// or one "error" event (SSE) carrying the error's code and reason, like
// every other stream route; nothing follows it.
func TestSnapshotStreamFailsWithOneErrorLine(t *testing.T) {
	h := start(t, func(c *gateway.Config) {
		c.Bridge = failingSnapshot{c.Bridge, fmt.Errorf("store gone: %w", bridge.ErrUnavailable)}
	})
	code, hdr, body := h.do("GET", "/v1/events:streamSnapshot", nil)
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if code != 200 || hdr.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 || !strings.HasPrefix(lines[0], `{"result":`) {
		t.Fatalf("NDJSON: HTTP %d %s %q, want a result line and an error line", code, hdr.Get("Content-Type"), body)
	}
	var last struct{ Error json.RawMessage }
	if err := json.Unmarshal([]byte(lines[1]), &last); err != nil || len(last.Error) == 0 {
		t.Fatalf("last line %s: %v, want {\"error\": Status}", lines[1], err)
	}
	if st := decodeStatus(t, last.Error); st.Code != int(codes.Unavailable) || st.reason() == "" {
		t.Errorf("error line %s: want UNAVAILABLE with a reason", last.Error)
	}
	code, _, body = h.do("GET", "/v1/events:streamSnapshot", nil, "Accept", "text/event-stream")
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if code != 200 || len(events) != 2 || !strings.HasPrefix(events[1], "event: error\ndata: {") {
		t.Errorf("SSE: HTTP %d %q, want a data event and an error event", code, body)
	}
}

// readSnapshotPages reads the snapshot as JSON pages of 5 documents until
// nextPageToken is empty, checking that every page names seq: the
// documents' ids in page order and the number of pages.
func readSnapshotPages(t *testing.T, h *harness, seq string) ([]string, int) {
	t.Helper()
	var got []string
	token, pages := "", 0
	accept := []string{"Accept", "application/json"}
	for {
		path := "/v1/events:streamSnapshot?pageSize=5"
		if token != "" {
			path += "&pageToken=" + token
		}
		code, hdr, body := h.do("GET", path, nil, accept...)
		if code != 200 || hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("page %d: HTTP %d %s %s", pages, code, hdr.Get("Content-Type"), body)
		}
		var p struct {
			Seq           string
			Documents     []json.RawMessage
			NextPageToken *string
		}
		if err := json.Unmarshal(body, &p); err != nil || p.NextPageToken == nil {
			t.Fatalf("page %d: %s: %v (nextPageToken must be present)", pages, body, err)
		}
		if p.Seq != seq || len(p.Documents) > 5 {
			t.Fatalf("page %d: seq %s with %d documents, want seq %s and at most 5", pages, p.Seq, len(p.Documents), seq)
		}
		for _, raw := range p.Documents {
			d := new(gatewayv1.Document)
			if err := protojson.Unmarshal(raw, d); err != nil || d.GetName() != "documents/"+d.GetId() {
				t.Fatalf("page %d: document %s: %v", pages, raw, err)
			}
			got = append(got, d.GetId())
		}
		pages++
		if token = *p.NextPageToken; token == "" {
			return got, pages
		}
	}
}

// checkSnapshotSSE reads the snapshot as Server-Sent Events in chunks of
// 10: one data event per chunk (the last chunk included), then "end".
func checkSnapshotSSE(t *testing.T, h *harness, n int) {
	t.Helper()
	code, hdr, body := h.do("GET", "/v1/events:streamSnapshot?pageSize=10", nil, "Accept", "text/event-stream")
	events := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if code != 200 || hdr.Get("Content-Type") != "text/event-stream" || len(events) != 5 || events[4] != "event: end\ndata: {}" {
		t.Fatalf("SSE: HTTP %d %s, %d events ending %q; want 4 chunks and an end event", code, hdr.Get("Content-Type"), len(events), events[len(events)-1])
	}
	var chunks []*gatewayv1.SnapshotChunk
	for _, e := range events[:4] {
		c := new(gatewayv1.SnapshotChunk)
		if err := protojson.Unmarshal([]byte(strings.TrimPrefix(e, "data: ")), c); err != nil {
			t.Fatalf("SSE event %q: %v", e, err)
		}
		chunks = append(chunks, c)
	}
	checkChunks(t, "SSE", chunks, n, 10)
}

// TestSnapshotTenantIsolation: every form of the streamed snapshot (gRPC,
// REST NDJSON, SSE and pages) shows a tenant exactly its own documents.
func TestSnapshotTenantIsolation(t *testing.T) {
	h, acme, globex := startTwoTenants(t)
	ids := map[string][]string{}
	for i, ctx := range []context.Context{acme, globex, acme} {
		d, err := h.docs.SubmitDocument(ctx, &gatewayv1.SubmitDocumentRequest{Content: []byte(fmt.Sprint("doc ", i)), ContentType: "text/plain"})
		if err != nil {
			t.Fatal(err)
		}
		tenant := map[bool]string{true: "tok-acme", false: "tok-globex"}[i != 1]
		ids[tenant] = append(ids[tenant], d.GetId())
	}
	for tok, ctx := range map[string]context.Context{"tok-acme": acme, "tok-globex": globex} {
		want, other := ids[tok], ids[map[string]string{"tok-acme": "tok-globex", "tok-globex": "tok-acme"}[tok]]
		st, err := h.events.StreamSnapshot(ctx, &gatewayv1.StreamSnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			c, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, docIDs(c.GetDocuments())...)
		}
		if !sameSet(got, want) {
			t.Errorf("gRPC snapshot as %s: %v, want exactly %v", tok, got, want)
		}
		for _, accept := range []string{"application/x-ndjson", "text/event-stream", "application/json"} {
			code, _, body := h.do("GET", "/v1/events:streamSnapshot", nil, "Authorization", "Bearer "+tok, "Accept", accept)
			for _, id := range want {
				if code != 200 || !strings.Contains(string(body), id) {
					t.Errorf("%s snapshot as %s: HTTP %d, lacks its document %s", accept, tok, code, id)
				}
			}
			for _, id := range other {
				if strings.Contains(string(body), id) {
					t.Errorf("%s snapshot as %s shows the other tenant's document %s", accept, tok, id)
				}
			}
		}
	}
}
