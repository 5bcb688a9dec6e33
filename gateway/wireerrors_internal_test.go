package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/tap"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// BenchmarkRecvCodec: what receiving a request through wireRecv and
// recvCodec costs over grpc-go's proto codec alone, for a small request
// (GetDocument's): the baseline "proto" and "wireRecv" run in the same
// process; compare ns/op and allocs/op.
func BenchmarkRecvCodec(b *testing.B) {
	protoCodec := encoding.GetCodecV2("proto")
	data, err := protoCodec.Marshal(&gatewayv1.GetDocumentRequest{Id: "d-7f3a9c2e", IncludeEntities: true})
	if err != nil {
		b.Fatal(err)
	}
	c := newRecvCodec(16 << 20)
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req gatewayv1.GetDocumentRequest
			if err := protoCodec.Unmarshal(data, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("wireRecv", func(b *testing.B) {
		b.ReportAllocs()
		recv := func(m any) error { return c.Unmarshal(data, m) }
		for b.Loop() {
			var req gatewayv1.GetDocumentRequest
			if err := wireRecv(recv, &req, "/x/Y", c.limit); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestTapMethodName: the listener's tap (tapRequest) refuses exactly the
// paths grpc-go's handleStream refuses as malformed (no leading slash, or
// no slash after it) and, on a good call, allocates nothing (it runs on the
// connection's reader goroutine under the transport's lock).
func TestTapMethodName(t *testing.T) {
	for path, want := range map[string]bool{
		"/pipestream.gateway.v1.DocumentService/GetDocument": true,
		"/a/b": true, "/a/": true, "//": true, "/svc/m/x": true,
		"": false, "/": false, "a/b": false, "/ab": false, "noslash": false,
	} {
		// grpc-go's test (server.go handleStream, v1.85.0), restated.
		rest, ok := strings.CutPrefix(path, "/")
		grpcGo := ok && strings.LastIndex(rest, "/") != -1
		if got := wellFormedMethodName(path); got != want || got != grpcGo {
			t.Errorf("wellFormedMethodName(%q) = %v, want %v (grpc-go: %v)", path, got, want, grpcGo)
		}
	}
	if raceEnabled {
		return // the race detector's bookkeeping allocates
	}
	s := &Server{}
	info := &tap.Info{FullMethodName: "/pipestream.gateway.v1.DocumentService/GetDocument"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // a call with a deadline
	defer cancel()
	if n := testing.AllocsPerRun(1000, func() {
		if _, err := s.tapRequest(ctx, info); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("tapRequest on a good path: %v allocations, want 0", n)
	}
}
