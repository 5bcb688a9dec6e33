package gateway_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// gatedResult is a generated result of size bytes (byte i = i mod 251)
// that stops at gateAt until open is closed: a gateway that buffers the
// whole result before answering never sends a byte, so the client never
// opens the gate and the download times out.
type gatedResult struct {
	size, gateAt, off int64
	open              chan struct{}
}

func (g *gatedResult) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	if g.off >= g.gateAt {
		select {
		case <-g.open:
		case <-time.After(30 * time.Second):
			return 0, errors.New("gate never opened: the client got no byte before the gateway read 32 MiB")
		}
	}
	n := int64(len(p))
	n = min(n, g.size-g.off)
	if g.off < g.gateAt {
		n = min(n, g.gateAt-g.off)
	}
	for i := range n {
		p[i] = byte((g.off + i) % 251)
	}
	g.off += n
	return int(n), nil
}

func (g *gatedResult) Close() error { return nil }

func patternSum(size int64) [32]byte {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		for i := range n {
			buf[i] = byte((off + i) % 251)
		}
		h.Write(buf[:n])
	}
	return [32]byte(h.Sum(nil))
}

// TestLargeResultStreams downloads a 96 MiB result, above the 64 MiB
// message limit that once capped results, over gRPC (a stream of HttpBody
// chunks, each within the limit) and REST (raw bytes with Content-Type and
// Content-Length). The gate proves the gateway does not hold the result:
// the client receives bytes before the gateway read 32 MiB.
func TestLargeResultStreams(t *testing.T) {
	const size = 96 << 20
	var mu sync.Mutex
	gates := map[string]*gatedResult{}
	h := start(t, func(c *gateway.Config) { c.MaxSendMsgBytes = gateway.DefaultMaxSendMsgBytes })
	h.fake.result = func(id string) (string, int64, io.ReadCloser, bool) {
		mu.Lock()
		defer mu.Unlock()
		g, ok := gates[id]
		return "application/x-test", size, g, ok
	}
	gate := func(id string) *gatedResult {
		g := &gatedResult{size: size, gateAt: 32 << 20, open: make(chan struct{})}
		mu.Lock()
		gates[id] = g
		mu.Unlock()
		return g
	}
	want := patternSum(size)
	// A bound for a hang, not a speed assertion: 96 MiB under the race
	// detector on a loaded 2-core machine took 50 s for one transport.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("grpc", func(t *testing.T) {
		g := gate("big-grpc")
		var hdr metadata.MD
		rs, err := h.docs.GetDocumentResult(ctx, &gatewayv1.GetDocumentResultRequest{Id: "big-grpc"}, grpc.Header(&hdr))
		if err != nil {
			t.Fatal(err)
		}
		hs := sha256.New()
		var n int64
		var ct string
		for i := 0; ; i++ {
			m, err := rs.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("after %d bytes: %v", n, err)
			}
			if i == 0 {
				ct = m.GetContentType()
				close(g.open)
			}
			if len(m.GetData()) > 256<<10 {
				t.Fatalf("message %d has %d bytes, want chunks of at most 256 KiB", i, len(m.GetData()))
			}
			hs.Write(m.GetData())
			n += int64(len(m.GetData()))
		}
		if n != size || [32]byte(hs.Sum(nil)) != want || ct != "application/x-test" {
			t.Fatalf("got %d bytes (content type %q), want %d intact bytes of application/x-test", n, ct, size)
		}
		if v := hdr.Get("x-pipestream-result-size"); len(v) != 1 || v[0] != strconv.Itoa(size) {
			t.Errorf("size header %v, want %d", v, size)
		}
	})

	t.Run("rest", func(t *testing.T) {
		g := gate("big-rest")
		req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/documents/big-rest/result", nil)
		resp, err := h.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-test" || resp.ContentLength != size {
			t.Fatalf("HTTP %d, Content-Type %q, Content-Length %d; want 200 application/x-test %d",
				resp.StatusCode, resp.Header.Get("Content-Type"), resp.ContentLength, size)
		}
		hs := sha256.New()
		first := make([]byte, 1<<10)
		k, err := io.ReadFull(resp.Body, first)
		if err != nil {
			t.Fatal(err)
		}
		hs.Write(first[:k])
		close(g.open)
		n, err := io.Copy(hs, resp.Body)
		if err != nil {
			t.Fatalf("after %d bytes: %v", int64(k)+n, err)
		}
		if int64(k)+n != size || [32]byte(hs.Sum(nil)) != want {
			t.Fatalf("got %d bytes, want %d intact bytes", int64(k)+n, size)
		}
	})
}
