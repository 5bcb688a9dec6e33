package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
)

// TestWebSocketPushedFramesCountedInOrder: live WebSocket subscribers of
// the real event log, served by its fan-out workers while caught up
// (eventlog.Push: the frames are queued and written from a worker, not
// the handler's goroutine), each get every committed event once, in seq
// order, and the metrics interceptor counts every frame: with no event
// committed after the subscribers read through the latest seq,
// grpc_server_msg_sent_total of SubscribeEvents rose by exactly the frames
// they read.
func TestWebSocketPushedFramesCountedInOrder(t *testing.T) {
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   t.TempDir(),
		PeerAddr:  "127.0.0.1:9", // nothing answers: documents stay PENDING, cancel ends them
		PeerCAPEM: selfSignedPEM(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, func(c *gateway.Config) { c.Bridge = b })
	sent0 := subscribeSent(t, h)
	const subs, docs = 8, 12
	conns := make([]*wsReader, subs)
	for i := range conns {
		conns[i] = &wsReader{c: dialWS(t, h, "")} // live only
	}
	for i := range docs {
		code, _, body := h.do("POST", "/v1/documents", strings.NewReader(`{"content":"aGVsbG8=","contentType":"text/plain"}`))
		if code != 200 {
			t.Fatalf("submit %d: HTTP %d %s", i, code, body)
		}
		var doc struct{ Id string }
		_ = json.Unmarshal(body, &doc)
		if i%2 == 0 {
			if code, _, body := h.do("POST", "/v1/documents/"+doc.Id+":cancel", strings.NewReader("{}")); code != 200 {
				t.Fatalf("cancel: HTTP %d %s", code, body)
			}
		}
	}
	for attempt := 0; ; attempt++ {
		if attempt == 20 {
			t.Fatal("events kept being committed: no quiet moment to compare the count")
		}
		latest := latestSeq(t, h)
		var wg sync.WaitGroup
		for i, r := range conns {
			wg.Go(func() {
				if err := r.readThrough(latest); err != nil {
					t.Errorf("subscriber %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		sent := subscribeSent(t, h) - sent0
		if latestSeq(t, h) != latest {
			continue // a commit landed meanwhile (the dispatcher retrying the peer)
		}
		read := 0
		for _, r := range conns {
			read += len(r.seqs)
		}
		if sent != read {
			t.Fatalf("grpc_server_msg_sent_total of SubscribeEvents rose by %d, the %d subscribers read %d frames", sent, subs, read)
		}
		if read < subs*docs {
			t.Fatalf("%d frames read, want at least %d (one event per submission per subscriber)", read, subs*docs)
		}
		return
	}
}

// wsReader reads one subscriber's frames and checks their seqs.
type wsReader struct {
	c    *websocket.Conn
	seqs []int64
}

func (r *wsReader) readThrough(latest uint64) error {
	for len(r.seqs) == 0 || uint64(r.seqs[len(r.seqs)-1]) < latest {
		f, err := readFrameErr(r.c)
		if err != nil {
			return fmt.Errorf("after %d frames: %w", len(r.seqs), err)
		}
		seq, _ := f.Payload["seq"].(int64)
		if f.Op != 1 || seq == 0 {
			return fmt.Errorf("frame %v %v, want an event", f.Header, f.Payload)
		}
		if n := len(r.seqs); n > 0 && seq != r.seqs[n-1]+1 {
			return fmt.Errorf("seq %d after %d: a gap or a duplicate", seq, r.seqs[n-1])
		}
		r.seqs = append(r.seqs, seq)
	}
	return nil
}

// latestSeq is the event window's latest seq (GET /v1/events:window).
func latestSeq(t *testing.T, h *harness) uint64 {
	t.Helper()
	code, _, body := h.do("GET", "/v1/events:window", nil)
	var w struct{ LatestSeq string }
	if err := json.Unmarshal(body, &w); code != 200 || err != nil {
		t.Fatalf("window: HTTP %d %s", code, body)
	}
	n, _ := strconv.ParseUint(w.LatestSeq, 10, 64)
	return n
}

// subscribeSent is grpc_server_msg_sent_total of SubscribeEvents.
func subscribeSent(t *testing.T, h *harness) int {
	t.Helper()
	code, _, body := h.do("GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("/metrics: HTTP %d", code)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "grpc_server_msg_sent_total{") && strings.Contains(l, `grpc_method="SubscribeEvents"`) {
			n, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q", l)
			}
			return int(n)
		}
	}
	return 0
}
