package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"runtime"
)

// ndjsonType is the Content-Type of the REST server streams (WatchDocument,
// SubscribeEvents): newline-delimited JSON, one {"result": message} object
// per line and, when the stream fails after its status line, one final
// {"error": google.rpc.Status} line.
const ndjsonType = "application/x-ndjson"

// streamFraming makes grpc-gateway's server streams say what they are and
// answer errors the way every other route does:
//
//   - a stream that started (HTTP 200) is labelled application/x-ndjson,
//     not grpc-gateway's application/json, so clients do not parse the
//     whole body as one JSON value;
//   - a stream refused before its status line (NotFound, FutureCursor,
//     Unauthenticated...) answers its HTTP status with a bare
//     google.rpc.Status (application/json), like unary routes and as the
//     spec declares, not grpc-gateway's {"error": Status} stream chunk.
//
// flushStreamHeaders tells the writer that the response is a stream
// (markStream): grpc-gateway calls it with a nil message before the first
// Recv of every server stream, and never for a unary call.
//
// An NDJSON event subscription's writer also skips a flush while the next
// event is already waiting (flushHint): a burst of events (one commit's)
// goes out in one write, and the last event of a burst is always flushed.
func streamFraming(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &streamWriter{ResponseWriter: w}
		if r.Method == http.MethodGet && r.URL.Path == "/v1/events:subscribe" {
			r = r.WithContext(context.WithValue(r.Context(), flushHintKey{}, sw))
		}
		h.ServeHTTP(sw, r)
	})
}

// streamWriter is the response writer of streamFraming.
type streamWriter struct {
	http.ResponseWriter
	stream bool // a server stream (markStream)
	status int  // the status written first; 0 = none yet
	// more reports whether the stream's next message is already waiting
	// to be received (set by the in-process subscription, setFlushHint;
	// nil: never). Called on the handler's goroutine.
	more func() bool
}

// flushHintKey is the request context key of an NDJSON subscription's
// *streamWriter.
type flushHintKey struct{}

// setFlushHint tells the NDJSON writer of ctx's request, if any, how to
// know that another event is already waiting (localEventClient).
func setFlushHint(ctx context.Context, more func() bool) {
	if sw, ok := ctx.Value(flushHintKey{}).(*streamWriter); ok {
		sw.more = more
	}
}

// markStream records that the response is a server stream.
func (w *streamWriter) markStream() { w.stream = true }

// streamMarker is implemented by streamWriter (reached through
// flushStreamHeaders' ResponseWriter).
type streamMarker interface{ markStream() }

func (w *streamWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		if w.stream {
			if code < http.StatusMultipleChoices {
				w.Header().Set("Content-Type", ndjsonType)
			} else {
				w.Header().Set("Content-Type", "application/json")
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write passes the body through, except that a stream refused before its
// status line has its {"error": Status} chunk unwrapped to the Status.
func (w *streamWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.stream && w.status >= http.StatusBadRequest {
		var chunk struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(p, &chunk) == nil && len(chunk.Error) > 0 && chunk.Error[0] == '{' {
			if _, err := w.ResponseWriter.Write(chunk.Error); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps NDJSON streams streaming.
func (w *streamWriter) Flush() { _ = w.FlushError() }

// FlushError flushes through to the connection (see errorHeaderWriter),
// unless the stream's next message is already waiting: its own flush
// follows at once (streamFraming).
func (w *streamWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.more != nil && (w.more() || yieldForMore(w.more)) {
		return nil
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// yieldForMore lets the subscription's handler run once before a flush
// and reports whether it then offers the next event. Recv, taking the
// event just written, made the handler runnable on this goroutine's P
// (its next to run), but it does not run before this goroutine blocks or
// yields: without the yield the next event of a burst (one commit's
// events, already in the log) is never offered yet when the writer asks,
// and every event costs its own write. When no event is waiting the
// handler blocks on the log at once and the flush goes out after one turn
// of the scheduler (on a busy server, after the goroutines queued before
// it: the price of one write per burst instead of per event).
func yieldForMore(more func() bool) bool {
	runtime.Gosched()
	return more()
}

// Unwrap lets http.ResponseController reach the connection.
func (w *streamWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
