package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/eventlog"
	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// subEvent is one event as a transport delivered it.
type subEvent struct {
	Seq        uint64
	Kind, Name string
}

// refusal is a subscription the transport refused with an AT sync error
// (gRPC status reason, NDJSON google.rpc.Status reason, WebSocket error
// frame followed by a close).
type refusal struct{ reason string }

func (r refusal) Error() string { return "refused: " + r.reason }

// subscribeFunc opens a subscription and returns once the gateway answered
// its headers (the cursor was accepted), or the refusal. recv returns the
// next event, or a refusal.
type subscribeFunc func(t *testing.T, h *harness, cursor *uint64) (recv func() (subEvent, error), err error)

func cursorQuery(cursor *uint64) string {
	if cursor == nil {
		return ""
	}
	return "?cursor=" + strconv.FormatUint(*cursor, 10)
}

func subscribeGRPC(t *testing.T, h *harness, cursor *uint64) (func() (subEvent, error), error) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	s, err := h.events.SubscribeEvents(ctx, &gatewayv1.SubscribeEventsRequest{Cursor: cursor})
	if err != nil {
		return nil, err
	}
	mapErr := func(err error) error {
		if status.Code(err) == codes.OutOfRange && reasonOf(err) != "" {
			return refusal{reasonOf(err)}
		}
		return err
	}
	recv := func() (subEvent, error) {
		ev, err := s.Recv()
		if err != nil {
			return subEvent{}, mapErr(err)
		}
		return subEvent{ev.GetSeq(), ev.GetKind(), ev.GetName()}, nil
	}
	if _, err := s.Header(); err != nil {
		_, err = recv()
		return nil, err
	}
	return recv, nil
}

func subscribeNDJSON(t *testing.T, h *harness, cursor *uint64) (func() (subEvent, error), error) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events:subscribe"+cursorQuery(cursor), nil)
	resp, err := h.http.Do(req)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		st := decodeStatus(t, b)
		if resp.StatusCode == http.StatusBadRequest && st.reason() != "" {
			return nil, refusal{st.reason()}
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	return func() (subEvent, error) {
		if !sc.Scan() {
			return subEvent{}, fmt.Errorf("stream ended: %v", sc.Err())
		}
		var l ndjsonLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return subEvent{}, fmt.Errorf("line %q: %v", sc.Text(), err)
		}
		if l.Result == nil {
			return subEvent{}, fmt.Errorf("line %q is not a result", sc.Text())
		}
		var ev struct{ Seq, Kind, Name string }
		if err := json.Unmarshal(l.Result, &ev); err != nil {
			return subEvent{}, err
		}
		var seq uint64
		if ev.Seq != "" {
			if seq, err = strconv.ParseUint(ev.Seq, 10, 64); err != nil {
				return subEvent{}, fmt.Errorf("seq %q: %v", ev.Seq, err)
			}
		}
		return subEvent{seq, ev.Kind, ev.Name}, nil
	}, nil
}

func subscribeWS(t *testing.T, h *harness, cursor *uint64) (func() (subEvent, error), error) {
	c := dialWS(t, h, cursorQuery(cursor))
	return func() (subEvent, error) {
		f, err := readFrame(t, c)
		if err != nil {
			return subEvent{}, err
		}
		if f.Op == -1 {
			reason, _ := f.Payload["error"].(string)
			if _, err := readFrame(t, c); websocket.CloseStatus(err) == -1 {
				return subEvent{}, fmt.Errorf("error frame %v not followed by a close: %v", f.Payload, err)
			}
			return subEvent{}, refusal{reason}
		}
		seq, _ := f.Payload["seq"].(int64)
		name, _ := f.Payload["name"].(string)
		return subEvent{uint64(seq), f.T, name}, nil
	}, nil
}

// realHarness runs the gateway over the real bridge (SQLite store, event
// log) with an unreachable peer: submissions still produce #document
// PENDING events.
func realHarness(t *testing.T, logOpts eventlog.Options) *harness {
	t.Helper()
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9",
		PeerCAPEM: selfSignedPEM(t),
		EventLog:  logOpts,
	})
	if err != nil {
		t.Fatal(err)
	}
	return start(t, func(c *gateway.Config) { c.Bridge = b })
}

// submitDoc submits a document and cancels it: it leaves exactly two
// events (PENDING, CANCELLED), both in the log when submitDoc returns, and
// nothing after. A document left waiting for the harness's unreachable
// peer gets a waitReason event a supervisor pass (a second or more)
// later, which could land between a test's window read and its
// subscription.
func submitDoc(t *testing.T, h *harness) {
	t.Helper()
	doc, err := h.docs.SubmitDocument(context.Background(), &gatewayv1.SubmitDocumentRequest{
		Content: []byte("hello"), ContentType: "text/plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.docs.CancelDocument(context.Background(), &gatewayv1.CancelDocumentRequest{Id: doc.GetId()}); err != nil {
		t.Fatal(err)
	}
}

func window(t *testing.T, h *harness) *gatewayv1.EventWindow {
	t.Helper()
	w, err := h.events.GetEventWindow(context.Background(), &gatewayv1.GetEventWindowRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// readSeqs reads n events and fails unless they are plain events with
// consecutive seqs from first.
func readSeqs(t *testing.T, recv func() (subEvent, error), first uint64, n int) {
	t.Helper()
	for i := range n {
		ev, err := recv()
		if err != nil {
			t.Fatalf("event %d of %d: %v", i+1, n, err)
		}
		if want := first + uint64(i); ev.Seq != want || ev.Kind == "#info" {
			t.Fatalf("event %d: %+v, want seq %d", i+1, ev, want)
		}
	}
}

// TestCursorRules: the five AT sync cursor cases (docs/architecture.md, "Event log") on
// gRPC SubscribeEvents, REST NDJSON /v1/events:subscribe and WebSocket
// /v1/events/ws, over the real bridge.
func TestCursorRules(t *testing.T) {
	// plain keeps every event for the test's duration (the default pruner
	// runs once a minute); pruned drops all but the newest events on every
	// append, so cursor 1 is outdated and the window starts above 1.
	plain := realHarness(t, eventlog.Options{})
	for range 3 {
		submitDoc(t, plain)
	}
	pruned := realHarness(t, eventlog.Options{KeepNewest: 2, MinAge: time.Nanosecond, NoSafetyMargin: true, PruneEveryEvents: 1})
	for range 6 {
		submitDoc(t, pruned)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w := window(t, pruned)
		if w.GetOldestSeq() > 1 && w.GetLatestSeq()-w.GetOldestSeq() <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pruned log still holds %v", w)
		}
	}

	transports := []struct {
		name string
		sub  subscribeFunc
	}{{"grpc", subscribeGRPC}, {"ndjson", subscribeNDJSON}, {"websocket", subscribeWS}}
	cases := []struct {
		name string
		run  func(t *testing.T, sub subscribeFunc)
	}{
		{"no cursor is live only", func(t *testing.T, sub subscribeFunc) {
			before := window(t, plain).GetLatestSeq()
			recv, err := sub(t, plain, nil)
			if err != nil {
				t.Fatal(err)
			}
			submitDoc(t, plain)
			ev, err := recv()
			if err != nil {
				t.Fatal(err)
			}
			if ev.Seq != before+1 || ev.Kind != "#document" {
				t.Errorf("first event %+v, want the new #document event %d (nothing up to %d)", ev, before+1, before)
			}
		}},
		{"cursor in the window replays inclusive then live", func(t *testing.T, sub subscribeFunc) {
			w := window(t, plain)
			cursor := w.GetLatestSeq() - 1
			if cursor <= w.GetOldestSeq() {
				t.Fatalf("window %v too small for a cursor inside it", w)
			}
			recv, err := sub(t, plain, proto.Uint64(cursor))
			if err != nil {
				t.Fatal(err)
			}
			readSeqs(t, recv, cursor, 2)
			submitDoc(t, plain)
			readSeqs(t, recv, w.GetLatestSeq()+1, 1)
		}},
		{"outdated cursor gets OutdatedCursor then the window", func(t *testing.T, sub subscribeFunc) {
			w := window(t, pruned)
			recv, err := sub(t, pruned, proto.Uint64(1))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := recv()
			if err != nil {
				t.Fatal(err)
			}
			if ev.Kind != "#info" || ev.Name != "OutdatedCursor" {
				t.Fatalf("first event %+v, want #info OutdatedCursor", ev)
			}
			readSeqs(t, recv, w.GetOldestSeq(), int(w.GetLatestSeq()-w.GetOldestSeq()+1))
		}},
		{"cursor 0 replays the whole window", func(t *testing.T, sub subscribeFunc) {
			w := window(t, pruned)
			recv, err := sub(t, pruned, proto.Uint64(0))
			if err != nil {
				t.Fatal(err)
			}
			readSeqs(t, recv, w.GetOldestSeq(), int(w.GetLatestSeq()-w.GetOldestSeq()+1))
		}},
		{"future cursor is refused", func(t *testing.T, sub subscribeFunc) {
			cursor := window(t, plain).GetLatestSeq() + 1000
			recv, err := sub(t, plain, proto.Uint64(cursor))
			if err == nil {
				var ev subEvent
				ev, err = recv()
				if err == nil {
					t.Fatalf("cursor %d answered %+v, want FutureCursor", cursor, ev)
				}
			}
			var r refusal
			if !errors.As(err, &r) || r.reason != "FutureCursor" {
				t.Errorf("cursor %d: %v, want a FutureCursor refusal", cursor, err)
			}
		}},
	}
	for _, tr := range transports {
		for _, c := range cases {
			t.Run(tr.name+"/"+c.name, func(t *testing.T) { c.run(t, tr.sub) })
		}
	}
}
