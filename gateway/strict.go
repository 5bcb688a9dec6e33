package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// Strict REST input. grpc-gateway's default JSON marshaler discards
// unknown fields and its query parser ignores unknown parameters, so a
// typo ("contentTyp", "spilt", ?pagesize=) silently fell back to a
// default. Here a JSON body with an unknown field or an unknown enum
// value, and a query parameter that names no field, is InvalidArgument
// (400) naming the field by its JSON path (lowerCamelCase, as the API's
// JSON spells it) and what is allowed there.

// restMarshaler is the REST mux's only marshaler: grpc-gateway's default
// (JSONPb emitting unpopulated fields, behind HTTPBodyMarshaler) with a
// strict decoder.
func restMarshaler() runtime.Marshaler {
	return &runtime.HTTPBodyMarshaler{Marshaler: &strictJSONPb{JSONPb: runtime.JSONPb{
		MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
		UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
	}}}
}

// strictJSONPb is runtime.JSONPb whose decoding refuses unknown fields
// and enum values with an error that says what to fix.
type strictJSONPb struct{ runtime.JSONPb }

// Unmarshal decodes data into v (a proto message: strictly).
func (m *strictJSONPb) Unmarshal(data []byte, v any) error {
	msg, ok := v.(proto.Message)
	if !ok {
		return m.JSONPb.Unmarshal(data, v)
	}
	return strictUnmarshal(data, msg)
}

// NewDecoder returns a decoder of one JSON value from r.
func (m *strictJSONPb) NewDecoder(r io.Reader) runtime.Decoder {
	return strictDecoder{r: r, fallback: m.JSONPb.NewDecoder(r)}
}

type strictDecoder struct {
	r        io.Reader
	fallback runtime.Decoder // non-message values (grpc-gateway's own)
}

func (d strictDecoder) Decode(v any) error {
	msg, ok := v.(proto.Message)
	if !ok {
		return d.fallback.Decode(v)
	}
	if req, ok := msg.(*gatewayv1.SubmitDocumentRequest); ok {
		return d.decodeSubmit(req) // submitjson.go
	}
	var raw json.RawMessage
	if err := json.NewDecoder(d.r).Decode(&raw); err != nil {
		return err // io.EOF: no body, which grpc-gateway accepts
	}
	return strictUnmarshal(raw, msg)
}

// strictUnmarshal is protojson.Unmarshal refusing unknown fields, with
// the error explained by explainJSON.
func strictUnmarshal(data []byte, msg proto.Message) error {
	err := protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(data, msg)
	if err == nil {
		return nil
	}
	if why := explainJSON(msg.ProtoReflect().Descriptor(), data); why != "" {
		return fmt.Errorf("invalid JSON request body: %s", why)
	}
	msgText := strings.TrimPrefix(err.Error(), "proto:")
	return fmt.Errorf("invalid JSON request body:%s", strings.ReplaceAll(msgText, "\u00a0", " "))
}

// explainJSON finds the first unknown field or enum value in the JSON
// object data as a message md and describes it ("" if it finds none:
// the error is of another kind, such as a type mismatch).
func explainJSON(md protoreflect.MessageDescriptor, data []byte) string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	return explainValue(md, v, "")
}

// wellKnown messages have their own JSON form (Timestamp, Struct, ...):
// protojson's message is precise for them.
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

func explainValue(md protoreflect.MessageDescriptor, v any, path string) string {
	obj, ok := v.(map[string]any)
	if !ok || wellKnown(md) {
		return ""
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fd := fieldByName(md, k)
		if fd == nil {
			return unknownFieldMessage(md, path, k)
		}
		if why := explainField(fd, obj[k], joinPath(path, fd.JSONName())); why != "" {
			return why
		}
	}
	return ""
}

func explainField(fd protoreflect.FieldDescriptor, v any, path string) string {
	switch {
	case fd.IsMap():
		m, _ := v.(map[string]any)
		for k, mv := range m {
			if why := explainSingle(fd.MapValue(), mv, path+"."+k); why != "" {
				return why
			}
		}
	case fd.IsList():
		l, _ := v.([]any)
		for i, lv := range l {
			if why := explainSingle(fd, lv, fmt.Sprintf("%s[%d]", path, i)); why != "" {
				return why
			}
		}
	default:
		return explainSingle(fd, v, path)
	}
	return ""
}

func explainSingle(fd protoreflect.FieldDescriptor, v any, path string) string {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return explainValue(fd.Message(), v, path)
	case protoreflect.EnumKind:
		s, ok := v.(string)
		if !ok || fd.Enum().FullName() == "google.protobuf.NullValue" {
			return ""
		}
		if fd.Enum().Values().ByName(protoreflect.Name(s)) == nil {
			return fmt.Sprintf("field %s: unknown value %q; allowed are %s", path, s, strings.Join(enumNames(fd.Enum()), ", "))
		}
	}
	return ""
}

// fieldByName resolves a JSON or proto field name, as protojson does.
func fieldByName(md protoreflect.MessageDescriptor, name string) protoreflect.FieldDescriptor {
	if fd := md.Fields().ByJSONName(name); fd != nil {
		return fd
	}
	return md.Fields().ByTextName(name)
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// unknownFieldMessage says that name is not a field of md (at path) and
// lists md's fields, suggesting the closest one.
func unknownFieldMessage(md protoreflect.MessageDescriptor, path, name string) string {
	known := jsonNames(md)
	msg := fmt.Sprintf("unknown field %q", joinPath(path, name))
	if near := closest(name, known); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", joinPath(path, near))
	}
	where := "the request"
	if path != "" {
		where = path
	}
	return msg + fmt.Sprintf("; the fields of %s are %s", where, strings.Join(known, ", "))
}

// jsonNames lists md's fields by JSON name, in declaration order.
func jsonNames(md protoreflect.MessageDescriptor) []string {
	names := make([]string, 0, md.Fields().Len())
	for i := 0; i < md.Fields().Len(); i++ {
		names = append(names, md.Fields().Get(i).JSONName())
	}
	return names
}

// enumNames lists an enum's value names but the zero (unspecified) one.
func enumNames(ed protoreflect.EnumDescriptor) []string {
	names := make([]string, 0, ed.Values().Len())
	for i := 0; i < ed.Values().Len(); i++ {
		if ev := ed.Values().Get(i); ev.Number() != 0 {
			names = append(names, string(ev.Name()))
		}
	}
	return names
}

// closest returns the candidate within edit distance 2 of name
// (case-insensitive), or "".
func closest(name string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of two short strings (field
// names: the caller bounds nothing else).
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// useStrictQueryParser installs strictQueryParser. grpc-gateway keeps the
// query parser in a package variable (runtime.SetQueryParameterParser), so
// it is set once, before the first mux serves.
func useStrictQueryParser() {
	strictQueryOnce.Do(func() { runtime.SetQueryParameterParser(strictQueryParser{})(nil) })
}

var strictQueryOnce sync.Once

// strictQueryParser is grpc-gateway's query parser refusing parameters
// that name no field of the request and naming fields by their JSON path
// in its errors. They are plain errors: the generated handlers wrap them
// in InvalidArgument themselves (a status error's text would leak its
// "rpc error: code = ..." prefix into the message).
type strictQueryParser struct{}

func (strictQueryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	md := msg.ProtoReflect().Descriptor()
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fd, jsonPath, why := resolveQueryKey(md, key)
		if why != "" {
			return errors.New(why)
		}
		err := (&runtime.DefaultQueryParser{}).Parse(msg, url.Values{key: values[key]}, filter)
		if err != nil {
			v := values[key][len(values[key])-1]
			return fmt.Errorf("query parameter %s=%q: want %s", jsonPath, v, wantOf(fd))
		}
	}
	return nil
}

// resolveQueryKey resolves a dotted query parameter name (JSON or proto
// field names) in md: the field, its JSON path, or why it names none.
func resolveQueryKey(md protoreflect.MessageDescriptor, key string) (protoreflect.FieldDescriptor, string, string) {
	var fd protoreflect.FieldDescriptor
	var path []string
	cur := md
	for i, part := range strings.Split(key, ".") {
		if cur == nil {
			return nil, "", fmt.Sprintf("unknown query parameter %q: %s is not a message", key, strings.Join(path, "."))
		}
		fd = fieldByName(cur, part)
		if fd == nil {
			prefix := strings.Join(path, ".")
			return nil, "", unknownQueryMessage(cur, prefix, key, i == 0)
		}
		path = append(path, fd.JSONName())
		cur = nil
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && !wellKnown(fd.Message()) {
			cur = fd.Message()
		}
	}
	return fd, strings.Join(path, "."), ""
}

func unknownQueryMessage(md protoreflect.MessageDescriptor, prefix, key string, top bool) string {
	known := jsonNames(md)
	for i := range known {
		known[i] = joinPath(prefix, known[i])
	}
	msg := fmt.Sprintf("unknown query parameter %q", key)
	if near := closest(key, known); near != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", near)
	}
	if top && len(known) == 0 {
		return msg + ": this route takes no query parameters"
	}
	return msg + "; known are " + strings.Join(known, ", ")
}

// wantOf describes the values a field takes, for error messages.
func wantOf(fd protoreflect.FieldDescriptor) string {
	if fd == nil {
		return "a valid value"
	}
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return "an integer"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "a non-negative integer"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "a number"
	case protoreflect.EnumKind:
		return "one of " + strings.Join(enumNames(fd.Enum()), ", ")
	case protoreflect.BytesKind:
		return "base64"
	case protoreflect.MessageKind:
		if fd.Message().FullName() == "google.protobuf.Timestamp" {
			return "an RFC 3339 time such as 2026-01-02T15:04:05Z"
		}
	}
	return "a valid " + fd.Kind().String()
}
