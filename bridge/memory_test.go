package bridge_test

import (
	"context"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// textGen generates n bytes of text lines without holding them.
type textGen struct {
	left int64
	line []byte
	pos  int
}

func (g *textGen) Read(p []byte) (int, error) {
	if g.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && g.left > 0 {
		c := copy(p[n:], g.line[g.pos:])
		if int64(c) > g.left {
			c = int(g.left)
		}
		n += c
		g.left -= int64(c)
		g.pos = (g.pos + c) % len(g.line)
	}
	return n, nil
}

// TestUploadMemoryFlat uploads 256 MiB from a generator (pipelined to the
// in-process peer, textstats so the peer keeps little) and reports the
// peak heap. Set BRIDGE_UPLOAD_MIB to change the size.
func TestUploadMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("bulk upload")
	}
	size := int64(256)
	if v := os.Getenv("BRIDGE_UPLOAD_MIB"); v != "" {
		var n int64
		for _, c := range v {
			n = n*10 + int64(c-'0')
		}
		size = n
	}
	size <<= 20
	e := newEnv(t)
	e.waitReady()
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	})
	start := time.Now()
	gen := &textGen{left: size, line: []byte("the quick brown fox jumps over the lazy dog. pack my box with five dozen jugs!\n")}
	doc, err := e.b.Upload(context.Background(), "", &gatewayv1.SubmitOptions{ContentType: "text/plain",
		Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_LINES, ChunkBytes: 1 << 20, Processor: "textstats"}}, gen)
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	upload := time.Since(start)
	got := e.wait(doc.Id, 5*time.Minute)
	close(stop)
	wg.Wait()
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if got.SizeBytes != uint64(size) {
		t.Fatalf("size %d", got.SizeBytes)
	}
	p := peak.Load()
	t.Logf("uploaded %d MiB in %v (%.0f MiB/s), done after %v; heap in use: base %.1f MiB, peak %.1f MiB (bridge + in-process peer)",
		size>>20, upload.Round(time.Millisecond), float64(size>>20)/upload.Seconds(), time.Since(start).Round(time.Millisecond),
		float64(base.HeapInuse)/(1<<20), float64(p)/(1<<20))
	// Flat: the peak must not grow with the document (256 MiB here).
	if limit := base.HeapInuse + 96<<20; p > limit {
		t.Fatalf("peak heap %.1f MiB exceeds base + 96 MiB", float64(p)/(1<<20))
	}
}
