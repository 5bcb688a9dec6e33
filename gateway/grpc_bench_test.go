package gateway_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// processCPU is the CPU time (user + system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGRPCUnary: unary calls (GetDocument of a stored document) over
// the real gRPC listener, 8 in flight per core, client and server in this
// process. Besides ns/op it reports cpu-ns/op, the process's CPU time per
// call (client and server), which a busy machine disturbs less than wall
// time. "native" compares two builds: run each build's test binary in
// turn, several times, and compare medians.
//
// ServeHTTP serves the same grpc.Server through grpc.Server.ServeHTTP
// behind net/http's HTTP/2 server (h2c, as the listener is plaintext
// here), the one design that would let the server answer an unknown
// grpc-encoding or a message far over --max-recv-msg-bytes in the house
// shape (an http.Handler in front sees both first); its cost over
// "native" is the lower bound of that design's (docs/errors.md).
func BenchmarkGRPCUnary(b *testing.B) {
	fake := newFakeBridge()
	doc := fake.add(gatewayv1.State_SUCCEEDED, 4096)
	srv, err := gateway.New(gateway.Config{
		GRPCAddr: "127.0.0.1:0",
		HTTPAddr: "127.0.0.1:0",
		Bridge:   fake,
		Logger:   slog.New(slog.DiscardHandler),
		// No per-tenant rate limit: the benchmark calls as fast as it can.
		RateLimit: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	b.Run("native", func(b *testing.B) { benchUnary(b, srv.GRPCAddr(), doc.GetId()) })
	b.Run("ServeHTTP", func(b *testing.B) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		hs := &http.Server{Handler: gateway.GRPCServer(srv), Protocols: &protos}
		go func() { _ = hs.Serve(lis) }()
		defer hs.Close()
		benchUnary(b, lis.Addr().String(), doc.GetId())
	})
}

func benchUnary(b *testing.B, addr, id string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	docs := gatewayv1.NewDocumentServiceClient(conn)
	if _, err := docs.GetDocument(context.Background(), &gatewayv1.GetDocumentRequest{Id: id}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(8)
	cpu := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := docs.GetDocument(context.Background(), &gatewayv1.GetDocumentRequest{Id: id}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
}
