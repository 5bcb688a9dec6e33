package gateway

import (
	"testing"

	"google.golang.org/grpc/encoding"

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
