package gateway

import (
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// sampleParams builds, from a descriptor alone, one query parameter per
// field (recursively) with a valid non-default value.
func sampleParams(md protoreflect.MessageDescriptor, prefix string, q url.Values) {
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		name := joinPath(prefix, fd.JSONName())
		switch {
		case fd.IsMap():
			q.Add(name+".some.key", sampleValue(fd.MapValue()))
		case fd.Kind() == protoreflect.MessageKind:
			sampleParams(fd.Message(), name, q)
		default:
			q.Add(name, sampleValue(fd))
		}
	}
}

func sampleValue(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "true"
	case protoreflect.EnumKind:
		return string(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Name())
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "0.5"
	case protoreflect.BytesKind:
		return "aGk="
	case protoreflect.StringKind:
		return "text/x-sample"
	}
	return "7"
}

// assertAllSet fails for every field of m (recursively) left unset.
func assertAllSet(t *testing.T, m protoreflect.Message, prefix string) {
	t.Helper()
	md := m.Descriptor()
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		name := joinPath(prefix, fd.JSONName())
		if !m.Has(fd) {
			t.Errorf("query parameter for %s did not set the field", name)
			continue
		}
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && !fd.IsList() {
			assertAllSet(t, m.Get(fd).Message(), name)
		}
	}
}

// TestUploadOptionsEveryField: every SubmitOptions field, found from the
// descriptor, is accepted as an upload query parameter and set.
func TestUploadOptionsEveryField(t *testing.T) {
	q := url.Values{}
	sampleParams((&gatewayv1.SubmitOptions{}).ProtoReflect().Descriptor(), "", q)
	opts, err := parseUploadOptions(q, "text/plain")
	if err != nil {
		t.Fatalf("%v: %v", q, err)
	}
	assertAllSet(t, opts.ProtoReflect(), "")
	if opts.GetMetadata()["some.key"] == "" {
		t.Errorf("metadata.some.key: %v", opts.GetMetadata())
	}
}

// TestQueryOptionsNewFieldKinds: a message unknown to this code (built
// at run time) with fields of every kind, repeated and map fields is set
// from the query without a code change.
func TestQueryOptionsNewFieldKinds(t *testing.T) {
	fdp := &descriptorpb.FileDescriptorProto{
		Name: proto.String("test/opts.proto"), Package: proto.String("test"), Syntax: proto.String("proto3"),
		EnumType: []*descriptorpb.EnumDescriptorProto{{Name: proto.String("Color"), Value: []*descriptorpb.EnumValueDescriptorProto{
			{Name: proto.String("COLOR_UNSPECIFIED"), Number: proto.Int32(0)},
			{Name: proto.String("COLOR_DEEP_RED"), Number: proto.Int32(1)},
		}}},
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Inner"), Field: []*descriptorpb.FieldDescriptorProto{
				field("on", 1, descriptorpb.FieldDescriptorProto_TYPE_BOOL, ""),
			}},
			{Name: proto.String("Opts"), Field: []*descriptorpb.FieldDescriptorProto{
				field("max_items", 1, descriptorpb.FieldDescriptorProto_TYPE_INT64, ""),
				field("ratio", 2, descriptorpb.FieldDescriptorProto_TYPE_DOUBLE, ""),
				field("color", 3, descriptorpb.FieldDescriptorProto_TYPE_ENUM, ".test.Color"),
				field("inner", 4, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE, ".test.Inner"),
				repeated(field("tags", 5, descriptorpb.FieldDescriptorProto_TYPE_STRING, "")),
				field("blob", 6, descriptorpb.FieldDescriptorProto_TYPE_BYTES, ""),
			}},
		},
	}
	fd, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		t.Fatal(err)
	}
	md := fd.Messages().ByName("Opts")
	m := dynamicpb.NewMessage(md)
	q := url.Values{"maxItems": {"-5"}, "ratio": {"0.25"}, "color": {"deep-red"}, "inner.on": {"true"}, "tags": {"a", "b"}, "blob": {"aGk="}}
	if err := setQueryOptions(m, q); err != nil {
		t.Fatal(err)
	}
	f := md.Fields()
	if m.Get(f.ByName("max_items")).Int() != -5 || m.Get(f.ByName("ratio")).Float() != 0.25 || m.Get(f.ByName("color")).Enum() != 1 ||
		!m.Get(f.ByName("inner")).Message().Get(md.Fields().ByName("inner").Message().Fields().ByName("on")).Bool() ||
		m.Get(f.ByName("tags")).List().Len() != 2 || string(m.Get(f.ByName("blob")).Bytes()) != "hi" {
		t.Errorf("not set as asked: %v", m)
	}

	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"maxitem": {"1"}}, `unknown query parameter "maxitem": known are maxItems, ratio, color, inner.on, tags, blob`},
		{url.Values{"inner.off": {"1"}}, `unknown query parameter "inner.off": known are inner.on`},
		{url.Values{"color": {"GREEN"}}, `query parameter color="GREEN": want one of COLOR_DEEP_RED`},
		{url.Values{"maxItems": {"x"}}, `query parameter maxItems="x": want an integer`},
		{url.Values{"inner": {"x"}}, `query parameter inner: set its fields, one of inner.on`},
	} {
		err := setQueryOptions(dynamicpb.NewMessage(md), c.q)
		if err == nil || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%v: %v, want %q", c.q, err, c.want)
		}
	}
}

func field(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
	f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ.Enum(),
		Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
	if typeName != "" {
		f.TypeName = proto.String(typeName)
	}
	return f
}

func repeated(f *descriptorpb.FieldDescriptorProto) *descriptorpb.FieldDescriptorProto {
	f.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	return f
}

// TestUploadOptionsErrors: unknown names and bad values of SubmitOptions
// answer what is known and allowed; short enum names and snake_case work.
func TestUploadOptionsErrors(t *testing.T) {
	opts, err := parseUploadOptions(url.Values{"split.strategy": {"lines"}, "split.chunk_bytes": {"65536"}, "completionPolicy.onFailure": {"retry"},
		"metadata.pipestream.fault": {"defer"}, "CONTENTTYPE": {"text/csv"}}, "text/plain")
	if err != nil {
		t.Fatal(err)
	}
	if opts.GetSplit().GetStrategy() != gatewayv1.SplitStrategy_SPLIT_LINES || opts.GetSplit().GetChunkBytes() != 65536 ||
		opts.GetCompletionPolicy().GetOnFailure() != gatewayv1.CompletionPolicy_RETRY || opts.GetMetadata()["pipestream.fault"] != "defer" ||
		opts.GetContentType() != "text/csv" {
		t.Errorf("options %v", opts)
	}
	if opts, _ := parseUploadOptions(nil, ""); opts.GetContentType() != "application/octet-stream" || opts.GetSplit() != nil {
		t.Errorf("defaults %v", opts)
	}
	for q, want := range map[string]string{
		"split.stratgy=lines":         `unknown query parameter "split.stratgy": known are split.strategy, split.chunkBytes, split.maxDepth, split.processor`,
		"contentTyp=x":                `unknown query parameter "contentTyp": known are contentType, requestId, split.strategy`,
		"split.strategy=LINEZ":        `query parameter split.strategy="LINEZ": want one of SPLIT_NONE, SPLIT_FIXED_BYTES, SPLIT_LINES, SPLIT_PARAGRAPHS`,
		"split.chunkBytes=-1":         `query parameter split.chunkBytes="-1": want a non-negative integer below 2^32`,
		"split.strategy=9":            `no SplitStrategy value 9`,
		"metadata.=x":                 `metadata.<key>: the key is empty`,
		"completionPolicy.mode=ALL":   `completionPolicy.mode="ALL": want one of STRICT, LENIENT, BEST_EFFORT, QUORUM`,
		"completionPolicy.timeoutMs=": `completionPolicy.timeoutMs="": want a non-negative integer`,
	} {
		v, _ := url.ParseQuery(q)
		_, err := parseUploadOptions(v, "")
		if err == nil || !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("%s: %v, want %q", q, err, want)
		}
	}
}
