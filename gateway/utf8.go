package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Text that ends up in a protobuf string must be UTF-8 (proto3). The REST
// proxy fills request messages from the URL path, the query string and (for
// :upload) the Content-Type header without checking that; marshaling such
// a message fails inside the proxy's gRPC client, which grpc-gateway
// reports as 500. checkUTF8 refuses those requests with 400 before they
// reach the proxy, naming the part to fix. On the gRPC side the codec
// already refuses invalid UTF-8 in request strings; utf8Unary/utf8Stream
// re-check requests that reach the handlers by other ways and make sure no
// status message the server returns carries invalid UTF-8 (a status whose
// message cannot be marshaled is another 500 at the REST proxy).

// invalidUTF8At returns the offset of the first invalid UTF-8 byte of s, or -1.
func invalidUTF8At(s string) int {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// utf8Problem describes the first invalid UTF-8 byte of v in the named
// request part, or returns "" if v is valid.
func utf8Problem(part, v string) string {
	i := invalidUTF8At(v)
	if i < 0 {
		return ""
	}
	return fmt.Sprintf("%s is not valid UTF-8 (byte 0x%02x at offset %d, %q): send UTF-8 text, percent-encoded in URLs",
		part, v[i], i, strings.ToValidUTF8(v, "\uFFFD"))
}

// requestUTF8Problem checks the decoded URL path, every query parameter
// name and value, and the Content-Type of an upload (the document's content
// type, a string field).
func requestUTF8Problem(r *http.Request) string {
	if p := utf8Problem("the URL path (after percent-decoding)", r.URL.Path); p != "" {
		return p
	}
	for key, vals := range r.URL.Query() {
		if p := utf8Problem("a query parameter name", key); p != "" {
			return p
		}
		for _, v := range vals {
			if p := utf8Problem(fmt.Sprintf("query parameter %q", strings.ToValidUTF8(key, "\uFFFD")), v); p != "" {
				return p
			}
		}
	}
	if strings.HasSuffix(r.URL.Path, ":upload") {
		if p := utf8Problem("the Content-Type header (the document's content type)", r.Header.Get("Content-Type")); p != "" {
			return p
		}
	}
	return ""
}

// checkUTF8 answers 400 INVALID_ARGUMENT to requests whose path, query or
// upload Content-Type is not UTF-8; others go on to h.
func (s *Server) checkUTF8(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := requestUTF8Problem(r); p != "" {
			s.writeStatus(w, r, http.StatusBadRequest, status.Error(codes.InvalidArgument, p))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// messageUTF8Problem returns what is wrong with the first string field of m
// (nested messages, lists and maps included) that is not UTF-8, or "".
func messageUTF8Problem(m protoreflect.Message) string {
	var problem string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		problem = valueUTF8Problem(fd, v)
		return problem == ""
	})
	return problem
}

func valueUTF8Problem(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	name := string(fd.Name())
	switch {
	case fd.IsList():
		l := v.List()
		for i := 0; i < l.Len(); i++ {
			if p := scalarUTF8Problem(fd, fmt.Sprintf("%s[%d]", name, i), l.Get(i)); p != "" {
				return p
			}
		}
	case fd.IsMap():
		var p string
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if fd.MapKey().Kind() == protoreflect.StringKind {
				p = utf8Problem("a key of field "+name, k.String())
			}
			if p == "" {
				p = scalarUTF8Problem(fd.MapValue(), name+"["+strings.ToValidUTF8(k.String(), "\uFFFD")+"]", mv)
			}
			return p == ""
		})
		return p
	default:
		return scalarUTF8Problem(fd, name, v)
	}
	return ""
}

func scalarUTF8Problem(fd protoreflect.FieldDescriptor, name string, v protoreflect.Value) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return utf8Problem("field "+name, v.String())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if p := messageUTF8Problem(v.Message()); p != "" {
			return name + "." + p
		}
	}
	return ""
}

// requestUTF8Error is InvalidArgument if req has a string field that is not
// UTF-8, else nil.
func requestUTF8Error(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	if p := messageUTF8Problem(m.ProtoReflect()); p != "" {
		return status.Error(codes.InvalidArgument, "request "+p)
	}
	return nil
}

// validUTF8Status replaces invalid UTF-8 in the message of a status error
// (google.rpc.Status.message is a proto3 string).
func validUTF8Status(err error) error {
	st, ok := status.FromError(err)
	if !ok || utf8.ValidString(st.Message()) {
		return err
	}
	p := st.Proto()
	p.Message = strings.ToValidUTF8(p.Message, "\uFFFD")
	return status.FromProto(p).Err()
}

// utf8Unary is the outermost unary interceptor: requests with invalid UTF-8
// strings are refused, returned status messages are made valid UTF-8.
func utf8Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := requestUTF8Error(req); err != nil {
		return nil, err
	}
	resp, err := h(ctx, req)
	return resp, validUTF8Status(err)
}

// utf8Stream does the same for streams: every received message is checked.
func utf8Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return validUTF8Status(h(srv, utf8ServerStream{ss}))
}

type utf8ServerStream struct{ grpc.ServerStream }

func (s utf8ServerStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return requestUTF8Error(m)
}
