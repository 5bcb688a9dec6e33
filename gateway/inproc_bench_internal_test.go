package gateway

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func BenchmarkHandOver(b *testing.B) {
	req := &gatewayv1.SubmitDocumentRequest{Content: bytes.Repeat([]byte("x"), 4096), ContentType: "application/octet-stream"}
	doc := &gatewayv1.Document{Id: "01a21f68f49abb5ca7664322ec2e", State: gatewayv1.State_PENDING, CreateTime: timestamppb.Now(), UpdateTime: timestamppb.Now(), ContentType: "application/octet-stream", SizeBytes: 4096}
	for _, m := range []proto.Message{req, doc} {
		b.Run(string(m.ProtoReflect().Descriptor().Name())+"/merge", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dst := m.ProtoReflect().New().Interface()
				proto.Merge(dst, m)
			}
		})
		b.Run(string(m.ProtoReflect().Descriptor().Name())+"/moveInto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				dst := m.ProtoReflect().New().Interface()
				moveInto(dst, m)
			}
		})
	}
}
