package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fxamacker/cbor/v2"
)

// wsFrame is one decoded frame: header {op, t} and payload, per
// draft-holmgren-at-synchronization-00 "Frame Format".
type wsFrame struct {
	Op      int
	T       string
	Header  map[string]any
	Payload map[string]any
}

// decodeFrame splits a binary message into exactly two CBOR objects and
// checks that both are deterministically encoded (re-encoding with
// length-first canonical options reproduces the bytes).
func decodeFrame(t *testing.T, msg []byte) wsFrame {
	t.Helper()
	f, err := parseFrame(msg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// parseFrame decodes and checks one frame; it calls no t method, so a
// goroutine a test started may use it.
func parseFrame(msg []byte) (wsFrame, error) {
	dm, _ := cbor.DecOptions{DupMapKey: cbor.DupMapKeyEnforcedAPF, IntDec: cbor.IntDecConvertSignedOrFail}.DecMode()
	var hdr, payload cbor.RawMessage
	dec := dm.NewDecoder(bytes.NewReader(msg))
	if err := dec.Decode(&hdr); err != nil {
		return wsFrame{}, fmt.Errorf("frame header is not CBOR: %v (% x)", err, msg)
	}
	if err := dec.Decode(&payload); err != nil {
		return wsFrame{}, fmt.Errorf("frame payload is not CBOR: %v", err)
	}
	var extra cbor.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return wsFrame{}, fmt.Errorf("frame has bytes after header and payload: %v", err)
	}
	em, _ := cbor.CanonicalEncOptions().EncMode()
	var f wsFrame
	for _, part := range []struct {
		raw cbor.RawMessage
		dst *map[string]any
	}{{hdr, &f.Header}, {payload, &f.Payload}} {
		if err := dm.Unmarshal(part.raw, part.dst); err != nil {
			return wsFrame{}, fmt.Errorf("frame part is not a CBOR map: %v", err)
		}
		again, err := em.Marshal(*part.dst)
		if err != nil || !bytes.Equal(again, part.raw) {
			return wsFrame{}, fmt.Errorf("frame part is not deterministic CBOR:\n got % x\nwant % x", part.raw, again)
		}
	}
	op, ok := f.Header["op"].(int64)
	if !ok {
		return wsFrame{}, fmt.Errorf("header %v has no integer op", f.Header)
	}
	f.Op = int(op)
	f.T, _ = f.Header["t"].(string)
	if len(msg) > 5_000_000 {
		return wsFrame{}, fmt.Errorf("frame of %d bytes exceeds 5 MB", len(msg))
	}
	return f, nil
}

// readFrameErr reads one binary frame without t (for goroutines).
func readFrameErr(c *websocket.Conn) (wsFrame, error) {
	msg, err := readBinary(c)
	if err != nil {
		return wsFrame{}, err
	}
	return parseFrame(msg)
}

var errNotBinary = errors.New("a text message where a binary frame was due")

// readBinary reads one message within 5 s: the read's own error, or
// errNotBinary for a text message.
func readBinary(c *websocket.Conn) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	typ, msg, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageBinary {
		return nil, errNotBinary
	}
	return msg, nil
}

func dialWS(t *testing.T, h *harness, query string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+h.srv.HTTPAddr()+"/v1/events/ws"+query, &websocket.DialOptions{HTTPClient: h.http})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, resp)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func readFrame(t *testing.T, c *websocket.Conn) (wsFrame, error) {
	t.Helper()
	msg, err := readBinary(c)
	if errors.Is(err, errNotBinary) {
		t.Fatal(err)
	}
	if err != nil {
		return wsFrame{}, err
	}
	return decodeFrame(t, msg), nil
}

func TestWebSocketFramesReplayAndLive(t *testing.T) {
	h := start(t, nil)
	c := dialWS(t, h, "?cursor=18")
	for want := int64(18); want <= 21; want++ {
		if want == 21 {
			h.fake.log.live <- h.fake.log.event(21)
		}
		f, err := readFrame(t, c)
		if err != nil {
			t.Fatal(err)
		}
		if f.Op != 1 || f.T != "#status" {
			t.Fatalf("header %v, want {op: 1, t: #status}", f.Header)
		}
		if f.Payload["seq"] != want {
			t.Fatalf("seq %v, want %d", f.Payload["seq"], want)
		}
		if tm, _ := f.Payload["time"].(string); !strings.HasPrefix(tm, "2023-11-14T22:13:20") {
			t.Errorf("time %v, want the event's ISO 8601 time", f.Payload["time"])
		}
		if f.Payload["documentId"] != "doc-1" || f.Payload["entityStatus"] != "ENTITY_STATUS_COMPLETE" ||
			f.Payload["rev"] != want || f.Payload["since"] != want-1 || f.Payload["entityId"] != int64(7) {
			t.Errorf("payload %v lacks the event fields", f.Payload)
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Logf("close: %v", err)
	}
}

func TestWebSocketOutdatedCursorInfo(t *testing.T) {
	h := start(t, nil)
	c := dialWS(t, h, "?cursor=3")
	f, err := readFrame(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if f.Op != 1 || f.T != "#info" || f.Payload["name"] != "OutdatedCursor" {
		t.Fatalf("first frame %v %v, want #info OutdatedCursor", f.Header, f.Payload)
	}
	f, err = readFrame(t, c)
	if err != nil || f.Payload["seq"] != int64(10) {
		t.Fatalf("after #info: %v %v, want the window from seq 10", f.Payload, err)
	}
}

func TestWebSocketErrorFramesThenClose(t *testing.T) {
	h := start(t, nil)
	for _, tc := range []struct {
		name, query, want string
		setup             func()
	}{
		{"future cursor", "?cursor=999", "FutureCursor", func() {}},
		{"consumer too slow", "", "ConsumerTooSlow", func() { h.fake.log.tooSlow.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			defer h.fake.log.tooSlow.Store(false)
			c := dialWS(t, h, tc.query)
			f, err := readFrame(t, c)
			if err != nil {
				t.Fatal(err)
			}
			if f.Op != -1 {
				t.Fatalf("header %v, want op -1", f.Header)
			}
			if _, has := f.Header["t"]; has {
				t.Errorf("error frame header %v carries t", f.Header)
			}
			if f.Payload["error"] != tc.want || f.Payload["message"] == "" {
				t.Errorf("payload %v, want error %s with a message", f.Payload, tc.want)
			}
			_, err = readFrame(t, c)
			if websocket.CloseStatus(err) == -1 {
				t.Errorf("after the error frame: %v, want the connection closed", err)
			}
		})
	}
}

func TestWebSocketPreUpgradeErrors(t *testing.T) {
	h := start(t, nil)
	code, _, b := h.do("GET", "/v1/events/ws?cursor=abc", nil)
	var body struct{ Error, Message string }
	if err := json.Unmarshal(b, &body); err != nil || code != http.StatusBadRequest || body.Error == "" || !strings.Contains(body.Message, "cursor") {
		t.Errorf("HTTP %d %s, want 400 JSON {error, message} about the cursor", code, b)
	}
}

// TestWebSocketUnframableEventIsAnnounced: an event whose frame would
// exceed the AT sync draft's 5 MB limit is not dropped silently: the
// consumer gets an #info OutdatedCursor frame naming its seq in its place,
// then the next event.
func TestWebSocketUnframableEventIsAnnounced(t *testing.T) {
	h := start(t, nil)
	c := dialWS(t, h, "")
	waitFor(t, 5*time.Second, "the subscription to wait for live events", func() bool { return h.fake.log.waiting.Load() == 1 })
	big := h.fake.log.event(21)
	big.Message = strings.Repeat("x", 5_100_000)
	h.fake.log.live <- big
	h.fake.log.live <- h.fake.log.event(22)
	f, err := readFrame(t, c)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := f.Payload["message"].(string)
	if f.Op != 1 || f.T != "#info" || f.Payload["name"] != "OutdatedCursor" || !strings.Contains(msg, "event 21 ") {
		t.Fatalf("first frame %v %.200v, want #info OutdatedCursor naming event 21", f.Header, f.Payload)
	}
	if f, err = readFrame(t, c); err != nil || f.Payload["seq"] != int64(22) {
		t.Fatalf("after the notice: %.200v %v, want seq 22", f.Payload, err)
	}
}
