package bridge_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

func quietLogger() *slog.Logger {
	if os.Getenv("BRIDGE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is a real in-process peer plus a bridge dialing it over loopback QUIC.
type env struct {
	t        *testing.T
	peer     *peer.Server
	peerDir  string
	peerAddr string
	protobuf bool
	dir      string
	b        *bridge.Bridge
	opts     bridge.Options
	reg      *prometheus.Registry
}

// metric returns the value of a counter or gauge without labels.
func (e *env) metric(name string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.Metric {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
			return v
		}
	}
	return 0
}

type envOpt func(*env)

func withProtobuf() envOpt { return func(e *env) { e.protobuf = true } }
func withBridgeOpts(f func(*bridge.Options)) envOpt {
	return func(e *env) { f(&e.opts) }
}

func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, peerDir: t.TempDir(), dir: t.TempDir(), peerAddr: "127.0.0.1:0"}
	for _, o := range opts {
		o(e)
	}
	e.startPeer()
	e.opts.DataDir = e.dir
	e.opts.PeerAddr = e.peer.Addr().String()
	e.opts.PeerCAPEM = e.peer.CertPEM()
	e.opts.PreferProtobuf = e.protobuf
	e.opts.Logger = quietLogger()
	e.startBridge()
	t.Cleanup(func() {
		if e.b != nil {
			e.closeBridge()
		}
		if e.peer != nil {
			e.stopPeer()
		}
	})
	return e
}

func (e *env) startPeer() {
	e.t.Helper()
	off := peer.DefaultOffer(e.protobuf)
	var p *peer.Server
	var err error
	for range 50 { // the old socket of a restarted peer may linger briefly
		p, err = peer.Start(peer.Options{ListenAddr: e.peerAddr, DataDir: e.peerDir, Logger: quietLogger(), Offer: &off,
			DrainTimeout: 2 * time.Second})
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatalf("start peer: %v", err)
	}
	e.peer = p
	e.peerAddr = p.Addr().String() // restart on the same port
}

func (e *env) stopPeer() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.peer.Shutdown(ctx)
	e.peer = nil
}

func (e *env) startBridge() {
	e.t.Helper()
	e.reg = prometheus.NewPedanticRegistry() // a restarted bridge registers afresh
	e.opts.Registerer = e.reg
	b, err := bridge.New(context.Background(), e.opts)
	if err != nil {
		e.t.Fatalf("bridge.New: %v", err)
	}
	e.b = b
}

func (e *env) closeBridge() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.b.Close(ctx); err != nil {
		e.t.Errorf("bridge.Close: %v", err)
	}
	e.b = nil
}

func (e *env) waitReady() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.b.Ready() != nil {
		if time.Now().After(deadline) {
			e.t.Fatalf("bridge not ready: %v", e.b.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *env) submit(content []byte, req *gatewayv1.SubmitDocumentRequest) *gatewayv1.Document {
	e.t.Helper()
	if req == nil {
		req = &gatewayv1.SubmitDocumentRequest{}
	}
	req.Content = content
	doc, err := e.b.Submit(context.Background(), "", req)
	if err != nil {
		e.t.Fatalf("Submit: %v", err)
	}
	return doc
}

func terminal(s gatewayv1.State) bool {
	switch s {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED, gatewayv1.State_FAILED, gatewayv1.State_CANCELLED:
		return true
	}
	return false
}

// wait polls the document until it is terminal.
func (e *env) wait(id string, within time.Duration) *gatewayv1.Document {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		doc, err := e.b.GetDocument(context.Background(), "", id, true)
		if err != nil {
			e.t.Fatalf("GetDocument: %v", err)
		}
		if terminal(doc.State) {
			return doc
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("document %s not terminal after %v: state %s counts %v error %q", id, within, doc.State, doc.EntityCounts, doc.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor polls until cond holds for the document.
func (e *env) waitFor(id string, within time.Duration, what string, cond func(*gatewayv1.Document) bool) *gatewayv1.Document {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		doc, err := e.b.GetDocument(context.Background(), "", id, true)
		if err != nil {
			e.t.Fatalf("GetDocument: %v", err)
		}
		if cond(doc) {
			return doc
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("document %s: %s not reached after %v: state %s counts %v error %q", id, what, within, doc.State, doc.EntityCounts, doc.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) result(id string) []byte {
	e.t.Helper()
	_, size, rc, err := e.b.Result(context.Background(), "", id)
	if err != nil {
		e.t.Fatalf("Result: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		e.t.Fatal(err)
	}
	if int64(len(b)) != size {
		e.t.Fatalf("result size %d, header said %d", len(b), size)
	}
	return b
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

var _ = bytes.Equal
var _ = wire.StatusComplete
