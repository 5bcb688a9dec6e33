package gateway

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// GET /v1/events:streamSnapshot is served here, not by grpc-gateway, in
// the form Accept asks for (negotiateStream):
//
//   - application/x-ndjson (also no Accept, */*): one {"result": chunk}
//     line per chunk, as grpc-gateway wrote it, ended on failure by one
//     {"error": Status} line;
//   - text/event-stream: one "data:" event per chunk, then "event: end"
//     (a failure: "event: error" with the Status);
//   - application/json: one page, {"seq", "documents", "nextPageToken"},
//     that a client generated from the spec reads like ListDocuments:
//     pass nextPageToken as pageToken until it comes back empty.
//
// All three stream straight from the store (bridge StreamSnapshotEncoded:
// the stored document bytes) and encode each document with the
// hand-written JSON of snapshotjson.go, not protojson through the gRPC
// proxy (docs/performance.md). Authentication ran in admit; the tenant
// admission and the method's concurrency limit are the gRPC method's
// (admitCall), errors are the REST routes' (httpError).
const (
	snapshotPath       = "/v1/events:streamSnapshot"
	snapshotMethod     = "/pipestream.gateway.v1.EventService/StreamSnapshot"
	snapshotTokenParam = "pageToken"
	// snapshotTokenVersion is the first byte of a page token.
	snapshotTokenVersion = 1
)

// snapshotForms serves the snapshot route and passes every other request
// on to next.
func (s *Server) snapshotForms(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != snapshotPath || r.Method != http.MethodGet {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Add("Vary", "Accept")
		form := negotiateStream(r.Header.Values("Accept"))
		size, tok, err := snapshotQuery(r.URL.Query(), form == formPage)
		if err != nil {
			s.httpError(w, r, err)
			return
		}
		tenant, _ := tenantFrom(r.Context())
		release, err := s.admitCall(r.Context(), tenant, snapshotMethod)
		if err != nil {
			s.httpError(w, r, err)
			return
		}
		defer release()
		ctx, cancel := s.streamContext(r.Context())
		defer cancel()
		if form == formPage {
			s.serveSnapshotPage(ctx, w, r, tenant, size, tok)
		} else {
			s.serveSnapshotStream(ctx, w, r, tenant, size, form == formSSE)
		}
	})
}

// snapshotQuery reads pageSize (page_size too, as the proxy accepted it)
// and, in the page form, pageToken.
func snapshotQuery(q url.Values, page bool) (int, snapshotToken, error) {
	known := []string{pageSizeParam, "page_size"}
	if page {
		known = append(known, snapshotTokenParam)
	}
	if err := checkQuery(q, known...); err != nil {
		return 0, snapshotToken{}, err
	}
	size := 0
	for _, k := range []string{pageSizeParam, "page_size"} {
		if v := q.Get(k); v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil || n > bridge.MaxSnapshotPage {
				return 0, snapshotToken{}, invalid(fmt.Sprintf("query parameter %s=%q: want 1 to %d documents, or 0 for %d", k, v, bridge.MaxSnapshotPage, bridge.DefaultSnapshotPage))
			}
			size = int(n)
		}
	}
	var tok snapshotToken
	if v := q.Get(snapshotTokenParam); v != "" {
		var err error
		if tok, err = decodeSnapshotToken(v); err != nil {
			return 0, snapshotToken{}, err
		}
	}
	return size, tok, nil
}

// serveSnapshotStream writes the whole snapshot as NDJSON or SSE.
func (s *Server) serveSnapshotStream(ctx context.Context, w http.ResponseWriter, r *http.Request, tenant bridge.Tenant, size int, sse bool) {
	_, m := runtime.MarshalerForRequest(s.gwMux, r)
	rc := http.NewResponseController(w)
	var (
		started bool
		line    []byte
		chunk   gatewayv1.SnapshotChunk
	)
	err := s.cfg.Bridge.Events().StreamSnapshotEncoded(ctx, tenant, size, bridge.SnapshotPosition{}, func(b []byte, _ bridge.SnapshotPosition) error {
		if err := proto.Unmarshal(b, &chunk); err != nil {
			return err
		}
		var err error
		if line, err = appendSnapshotLine(line[:0], &chunk, m, sse); err != nil {
			return err
		}
		if !started {
			started = true
			h := w.Header()
			h.Set("Content-Type", ndjsonType)
			if sse {
				h.Set("Content-Type", sseType)
				h.Set("X-Accel-Buffering", "no")
			}
			h.Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		return rc.Flush()
	})
	switch {
	case err == nil && sse:
		_, _ = w.Write(appendSSE(line[:0], "end", 0, []byte("{}")))
	case err == nil:
	case !started:
		s.httpError(w, r, s.snapshotError(err))
	case r.Context().Err() == nil: // the client is still there: say why it ends
		st := streamErrorHandler(ctx, s.snapshotError(err))
		body, _ := m.Marshal(st.Proto())
		if sse {
			line = appendSSE(line[:0], "error", 0, body)
		} else {
			line = append(append(append(line[:0], `{"error":`...), body...), "}\n"...)
		}
		_, _ = w.Write(line)
	}
	_ = rc.Flush()
}

// snapshotError is the stream's error as the gRPC method answers it.
func (s *Server) snapshotError(err error) error {
	if s.shuttingDown() {
		return status.Error(codes.Unavailable, "server is shutting down: stream the snapshot again later")
	}
	return toStatus(err)
}

// appendSnapshotLine appends one chunk as an NDJSON line or an SSE event.
func appendSnapshotLine(b []byte, c *gatewayv1.SnapshotChunk, m runtime.Marshaler, sse bool) ([]byte, error) {
	start := len(b)
	if sse {
		b = append(b, "data: "...)
	} else {
		b = append(b, `{"result":`...)
	}
	body := len(b)
	b, ok := appendChunkJSON(b, c)
	if !ok { // what the appender does not render (snapshotjson.go): protojson
		js, err := m.Marshal(c)
		if err != nil {
			return b[:start], status.Errorf(codes.Internal, "encode snapshot chunk: %v", err)
		}
		b = append(b[:body], js...)
	}
	if sse {
		return append(b, "\n\n"...), nil
	}
	return append(b, "}\n"...), nil
}

// snapshotToken is a page token: the seq of the snapshot's first page and
// the position after the last document sent.
type snapshotToken struct {
	seq uint64
	pos bridge.SnapshotPosition
}

func (t snapshotToken) encode() string {
	b := []byte{snapshotTokenVersion}
	b = binary.AppendUvarint(b, t.seq)
	b = binary.AppendVarint(b, t.pos.Row)
	b = binary.AppendVarint(b, t.pos.CreateTime)
	b = append(b, t.pos.ID...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeSnapshotToken(v string) (snapshotToken, error) {
	bad := invalid(fmt.Sprintf("query parameter %s=%q is not a token this route issued: pass nextPageToken back unchanged, or none for the first page", snapshotTokenParam, v))
	if len(v) > 200 {
		return snapshotToken{}, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) < 1 || b[0] != snapshotTokenVersion {
		return snapshotToken{}, bad
	}
	b = b[1:]
	seq, n := binary.Uvarint(b)
	if n <= 0 {
		return snapshotToken{}, bad
	}
	b = b[n:]
	row, n := binary.Varint(b)
	if n <= 0 {
		return snapshotToken{}, bad
	}
	b = b[n:]
	ct, n := binary.Varint(b)
	if n <= 0 {
		return snapshotToken{}, bad
	}
	pos := bridge.SnapshotPosition{Row: row, CreateTime: ct, ID: string(b[n:])}
	if pos == (bridge.SnapshotPosition{}) || !utf8.ValidString(pos.ID) {
		return snapshotToken{}, bad
	}
	return snapshotToken{seq: seq, pos: pos}, nil
}

// serveSnapshotPage answers one page of up to size documents after the
// token's position: {"seq", "documents", "nextPageToken"}. seq is the
// first page's: resume the event stream from seq + 1 once the last page
// (nextPageToken "") is in. Each page is read in its own transaction, so
// a document on a later page may already reflect events after seq; its
// rev says so (replayed events at or below a document's rev are already
// in it).
func (s *Server) serveSnapshotPage(ctx context.Context, w http.ResponseWriter, r *http.Request, tenant bridge.Tenant, size int, tok snapshotToken) {
	_, m := runtime.MarshalerForRequest(s.gwMux, r)
	if size == 0 {
		size = bridge.DefaultSnapshotPage
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		got  *gatewayv1.SnapshotChunk
		next bridge.SnapshotPosition
	)
	err := s.cfg.Bridge.Events().StreamSnapshotEncoded(ctx, tenant, size, tok.pos, func(b []byte, pos bridge.SnapshotPosition) error {
		next = pos
		got = new(gatewayv1.SnapshotChunk)
		if err := proto.Unmarshal(b, got); err != nil {
			got = nil
			return err
		}
		cancel() // one chunk is the page
		return context.Canceled
	})
	if got == nil {
		if err == nil {
			err = status.Error(codes.Internal, "the snapshot ended without a chunk")
		}
		s.httpError(w, r, s.snapshotError(err))
		return
	}
	seq := got.GetSeq()
	if tok.pos != (bridge.SnapshotPosition{}) {
		seq = tok.seq
	}
	docs := got.GetDocuments()
	nextToken := ""
	if len(docs) == size { // maybe more: the next page says
		nextToken = snapshotToken{seq: seq, pos: next}.encode()
	}
	b := append(appendUint64JSON([]byte(`{"seq":`), seq), `,"documents":[`...)
	for i, d := range docs {
		if i > 0 {
			b = append(b, ',')
		}
		var ok bool
		mark := len(b)
		if b, ok = appendDocumentJSON(b, d); !ok {
			js, err := m.Marshal(d)
			if err != nil {
				s.httpError(w, r, status.Errorf(codes.Internal, "encode document %s: %v", d.GetId(), err))
				return
			}
			b = append(b[:mark], js...)
		}
	}
	b = append(b, `],"nextPageToken":`...)
	b, _ = appendStringJSON(b, nextToken)
	b = append(b, "}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
