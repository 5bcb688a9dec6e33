package bridge_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
)

// BenchmarkManyPeers submits b.N documents of 256 KiB (64 chunks) at once
// and waits until all SUCCEEDED, over one in-process peer (the baseline)
// and over two: docs/s of each, so the ratio shows what placement over two
// peers costs or gains on this machine (both peers share its CPUs).
//
//	go test -run '^$' -bench BenchmarkManyPeers -benchtime 200x ./bridge/
func BenchmarkManyPeers(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			br := benchBridge(b, n)
			in := bytes.Repeat([]byte("many peers benchmark line\n"), 256<<10/26)
			req := func() *gatewayv1.SubmitDocumentRequest {
				return &gatewayv1.SubmitDocumentRequest{Content: in, ContentType: "text/plain",
					Split: &gatewayv1.SplitOptions{Strategy: gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, ChunkBytes: 4096}}
			}
			ctx := context.Background()
			b.ResetTimer()
			ids := make([]string, 0, b.N)
			for range b.N {
				d, err := br.Submit(ctx, "", req())
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, d.Id)
			}
			for _, id := range ids {
				benchWait(b, br, id)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "docs/s")
		})
	}
}

// benchBridge starts n in-process peers and a bridge over them, and waits
// until every peer is connected.
func benchBridge(b *testing.B, n int) *bridge.Bridge {
	b.Helper()
	var eps []bridge.PeerEndpoint
	for range n {
		off := peer.DefaultOffer(false)
		p, err := peer.Start(peer.Options{ListenAddr: "127.0.0.1:0", DataDir: b.TempDir(), Logger: quietLogger(), Offer: &off})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = p.Shutdown(ctx)
		})
		eps = append(eps, bridge.PeerEndpoint{Addr: p.Addr().String(), CAPEM: p.CertPEM()})
	}
	br, err := bridge.New(context.Background(), bridge.Options{DataDir: b.TempDir(), Peers: eps, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = br.Close(ctx)
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		up := 0
		for _, p := range br.Peers() {
			if p.State == "connected" {
				up++
			}
		}
		if up == n {
			return br
		}
		if time.Now().After(deadline) {
			b.Fatalf("peers not connected: %+v", br.Peers())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func benchWait(b *testing.B, br *bridge.Bridge, id string) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d, err := br.GetDocument(context.Background(), "", id, false)
		if err != nil {
			b.Fatal(err)
		}
		if d.State == gatewayv1.State_SUCCEEDED {
			return
		}
		if terminal(d.State) || time.Now().After(deadline) {
			b.Fatalf("document %s: %s %q", id, d.State, d.Error)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkDraft04Conns submits b.N small documents at once to one
// in-process peer under draft-04 framing (one document per connection;
// this peer serves connections concurrently) with PeerDraft04Conns 1 (the
// baseline: one connection at a time) and 4 (the default): docs/s of each.
//
//	go test -run '^$' -bench BenchmarkDraft04Conns -benchtime 200x ./bridge/
func BenchmarkDraft04Conns(b *testing.B) {
	for _, conns := range []int{1, 4} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			off := peer.DefaultOffer(false)
			p, err := peer.Start(peer.Options{ListenAddr: "127.0.0.1:0", DataDir: b.TempDir(), Logger: quietLogger(), Offer: &off})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = p.Shutdown(ctx)
			})
			br, err := bridge.New(context.Background(), bridge.Options{DataDir: b.TempDir(), Logger: quietLogger(), PeerDraft04Conns: conns,
				Peers: []bridge.PeerEndpoint{{Addr: p.Addr().String(), CAPEM: p.CertPEM(), Framing: quicpeer.FramingDraft04}}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = br.Close(ctx)
			})
			ctx := context.Background()
			b.ResetTimer()
			ids := make([]string, 0, b.N)
			for i := range b.N {
				d, err := br.Submit(ctx, "", &gatewayv1.SubmitDocumentRequest{Content: fmt.Appendf(nil, "small draft-04 document %d\n", i), ContentType: "text/plain"})
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, d.Id)
			}
			for _, id := range ids {
				benchWait(b, br, id)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "docs/s")
		})
	}
}
