package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// fanout measures event delivery to Options.Subscribers WebSocket
// subscribers of /v1/events/ws (live, every kind) while documents are
// submitted over gRPC at Options.FanoutDocsPerSec for Options.Duration.
// It reports delivered events per second (frames received summed over all
// subscribers, counted until every subscriber has every event generated
// in the window) and the gateway's CPU time per delivered event.
func (b *runner) fanout(ctx context.Context) error {
	g, subs := b.gw, b.o.Subscribers
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.progress("  connecting %d WebSocket subscribers", subs)
	var (
		delivered atomic.Int64
		lastAt    atomic.Int64 // UnixNano of the latest delivery
		closed    atomic.Int64
		firstErr  atomic.Value
		wg        sync.WaitGroup
	)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: subs, DisableCompression: true}}
	defer hc.CloseIdleConnections()
	hdr := http.Header{}
	if g.token != "" {
		hdr.Set("Authorization", "Bearer "+g.token)
	}
	var eg errgroup.Group
	eg.SetLimit(32)
	conns := make([]*websocket.Conn, subs)
	for i := range subs {
		eg.Go(func() error {
			dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
			defer dcancel()
			c, resp, err := websocket.Dial(dctx, "ws://"+g.httpAddr+"/v1/events/ws", &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr})
			if err != nil {
				if resp != nil {
					return fmt.Errorf("subscriber %d: HTTP %d: %w", i, resp.StatusCode, err)
				}
				return fmt.Errorf("subscriber %d: %w", i, err)
			}
			c.SetReadLimit(1 << 20)
			conns[i] = c
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		for _, c := range conns {
			if c != nil {
				c.CloseNow()
			}
		}
		return err
	}
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
		wg.Wait()
	}()
	seen := make([]atomic.Bool, subs)
	for i, c := range conns {
		wg.Go(func() {
			for {
				_, r, err := c.Reader(ctx)
				if err != nil {
					if ctx.Err() == nil {
						closed.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Errorf("subscriber %d: %w", i, err))
					}
					return
				}
				if _, err := io.Copy(io.Discard, r); err != nil {
					closed.Add(1)
					return
				}
				seen[i].Store(true)
				delivered.Add(1)
				lastAt.Store(time.Now().UnixNano())
			}
		})
	}

	// Warm up: one document, until every subscriber has seen an event (the
	// subscriptions are then live on the server).
	payload := patternBlock[:b.o.SmallBytes]
	submit := func() error {
		_, err := g.docs.SubmitDocument(g.ctx(ctx), &gatewayv1.SubmitDocumentRequest{Content: payload, ContentType: "application/octet-stream"})
		return err
	}
	warm := time.Now().Add(30 * time.Second)
	for all := false; !all; {
		if err := submit(); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
		all = true
		for i := range seen {
			all = all && seen[i].Load()
		}
		if time.Now().After(warm) {
			return fmt.Errorf("not every subscriber received an event within 30 s (%d closed: %v)", closed.Load(), firstErr.Load())
		}
	}
	time.Sleep(500 * time.Millisecond) // let the warm-up events drain

	b.progress("  %d docs/s for %s, fan-out to %d subscribers", b.o.FanoutDocsPerSec, b.o.Duration, subs)
	win0, err := g.events.GetEventWindow(g.ctx(ctx), &gatewayv1.GetEventWindowRequest{})
	if err != nil {
		return err
	}
	var (
		secs  float64
		count int64
		gen   uint64
	)
	ps, ok, err := g.measure(func() error {
		d0 := delivered.Load()
		start := time.Now()
		tick := time.NewTicker(time.Second / time.Duration(b.o.FanoutDocsPerSec))
		var sg errgroup.Group
		sg.SetLimit(16)
		for time.Since(start) < b.o.Duration {
			<-tick.C
			sg.Go(submit)
		}
		tick.Stop()
		if err := sg.Wait(); err != nil {
			return err
		}
		// Documents finish shortly after submission; wait until the log
		// stops growing, then until every subscriber has every event.
		var latest uint64
		for {
			time.Sleep(200 * time.Millisecond)
			w, err := g.events.GetEventWindow(g.ctx(ctx), &gatewayv1.GetEventWindowRequest{})
			if err != nil {
				return err
			}
			if w.GetLatestSeq() == latest {
				break
			}
			latest = w.GetLatestSeq()
		}
		gen = latest - win0.GetLatestSeq()
		want := int64(gen) * int64(subs)
		last, stallAt := delivered.Load(), time.Now()
		for delivered.Load()-d0 < want {
			time.Sleep(time.Millisecond)
			if n := delivered.Load(); n != last {
				last, stallAt = n, time.Now()
			}
			if time.Since(stallAt) > 5*time.Second {
				return fmt.Errorf("delivery stalled at %d of %d events (%d subscribers closed: %v)", delivered.Load()-d0, want, closed.Load(), firstErr.Load())
			}
		}
		count = delivered.Load() - d0
		secs = max(time.Unix(0, lastAt.Load()).Sub(start).Seconds(), 1e-9)
		return nil
	})
	if err != nil {
		return err
	}
	r := Result{Phase: "fanout", Path: fmt.Sprintf("WebSocket fan-out to %d subscribers", subs), Unit: "events/s",
		Rate: float64(count) / secs, Count: count, Seconds: secs,
		Note: fmt.Sprintf("%d events generated by %d docs/s", gen, b.o.FanoutDocsPerSec)}
	fill(&r, ps, ok, count, secs)
	b.add(r)
	return nil
}
