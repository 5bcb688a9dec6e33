package gateway

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Query parameters as message fields, from the message's descriptor
// (protoreflect): the upload route's options (parseUploadOptions).

// setQueryOptions sets the fields of m named by the query parameters q.
func setQueryOptions(m protoreflect.Message, q url.Values) error {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first error is the same on every try
	for _, key := range keys {
		vals := q[key]
		if len(vals) == 0 {
			continue
		}
		if err := setQueryOption(m, key, vals); err != nil {
			return err
		}
	}
	return nil
}

// setQueryOption sets one dotted parameter: it walks the messages of the
// path and sets the last field (a map field takes the rest as its key).
func setQueryOption(m protoreflect.Message, key string, vals []string) error {
	parts := strings.Split(key, ".")
	for i, part := range parts {
		fd := fieldByLooseName(m.Descriptor(), part)
		if fd == nil {
			return invalid(fmt.Sprintf("unknown query parameter %q: known are %s", key, strings.Join(queryOptionNames(m.Descriptor(), strings.Join(parts[:i], ".")), ", ")))
		}
		path := strings.Join(append(jsonPathOf(m.Descriptor(), parts[:i]), fd.JSONName()), ".")
		switch {
		case fd.IsMap():
			return setMapOption(m, fd, path, strings.Join(parts[i+1:], "."), vals)
		case i < len(parts)-1:
			if fd.Kind() != protoreflect.MessageKind || fd.IsList() {
				return invalid(fmt.Sprintf("unknown query parameter %q: %s has no fields", key, path))
			}
			m = m.Mutable(fd).Message()
		case fd.IsList():
			return setListOption(m, fd, path, vals)
		case fd.Kind() == protoreflect.MessageKind:
			return invalid(fmt.Sprintf("query parameter %s: set its fields, one of %s", path, strings.Join(queryOptionNames(fd.Message(), path), ", ")))
		default:
			v, err := scalarValue(fd, vals[len(vals)-1])
			if err != nil {
				return optionError(path, vals[len(vals)-1], err)
			}
			m.Set(fd, v)
		}
	}
	return nil
}

func optionError(path, v string, err error) error {
	return invalid(fmt.Sprintf("query parameter %s=%q: %v", path, v, err))
}

func setMapOption(m protoreflect.Message, fd protoreflect.FieldDescriptor, path, mk string, vals []string) error {
	if mk == "" {
		return invalid(fmt.Sprintf("%s.<key>: the key is empty; use %s.<key>=<value>, e.g. metadata.owner=alice", path, path))
	}
	if fd.MapKey().Kind() != protoreflect.StringKind || fd.MapValue().Kind() == protoreflect.MessageKind {
		return invalid(fmt.Sprintf("query parameter %s: this map cannot be set from the query; send the options in the JSON body", path))
	}
	v, err := scalarValue(fd.MapValue(), vals[len(vals)-1])
	if err != nil {
		return optionError(path+"."+mk, vals[len(vals)-1], err)
	}
	m.Mutable(fd).Map().Set(protoreflect.ValueOfString(mk).MapKey(), v)
	return nil
}

func setListOption(m protoreflect.Message, fd protoreflect.FieldDescriptor, path string, vals []string) error {
	if fd.Kind() == protoreflect.MessageKind {
		return invalid(fmt.Sprintf("query parameter %s: a list of messages cannot be set from the query; send the options in the JSON body", path))
	}
	l := m.Mutable(fd).List()
	for _, s := range vals {
		v, err := scalarValue(fd, s)
		if err != nil {
			return optionError(path, s, err)
		}
		l.Append(v)
	}
	return nil
}

// fieldByLooseName finds a field by JSON or proto name, ignoring case
// and underscores ("chunkBytes", "chunk_bytes", "CHUNKBYTES").
func fieldByLooseName(md protoreflect.MessageDescriptor, name string) protoreflect.FieldDescriptor {
	want := looseName(name)
	for i := 0; i < md.Fields().Len(); i++ {
		if fd := md.Fields().Get(i); looseName(fd.JSONName()) == want {
			return fd
		}
	}
	return nil
}

func looseName(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// jsonPathOf spells the path parts (as given) in JSON names.
func jsonPathOf(md protoreflect.MessageDescriptor, parts []string) []string {
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		fd := fieldByLooseName(md, p)
		if fd == nil || fd.Kind() != protoreflect.MessageKind {
			return append(out, p)
		}
		out = append(out, fd.JSONName())
		md = fd.Message()
	}
	return out
}

// queryOptionNames lists the parameters md's fields make, under prefix
// (the prefix itself given as typed, made JSON below).
func queryOptionNames(md protoreflect.MessageDescriptor, prefix string) []string {
	var names []string
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		name := joinPath(prefix, fd.JSONName())
		switch {
		case fd.IsMap():
			names = append(names, name+".<key>")
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList():
			names = append(names, queryOptionNames(fd.Message(), name)...)
		default:
			names = append(names, name)
		}
	}
	return names
}

// scalarValue parses v as a value of fd's kind.
func scalarValue(fd protoreflect.FieldDescriptor, v string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v), nil
	case protoreflect.BoolKind:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return protoreflect.Value{}, errors.New("want true or false")
		}
		return protoreflect.ValueOfBool(b), nil
	case protoreflect.EnumKind:
		n, err := parseEnum(v, fd.Enum())
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), err
	case protoreflect.BytesKind:
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return protoreflect.Value{}, errors.New("want base64")
		}
		return protoreflect.ValueOfBytes(b), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return protoreflect.Value{}, errors.New("want a number")
		}
		if fd.Kind() == protoreflect.FloatKind {
			return protoreflect.ValueOfFloat32(float32(f)), nil
		}
		return protoreflect.ValueOfFloat64(f), nil
	}
	return intValue(fd.Kind(), v)
}

// intValue parses the integer kinds.
func intValue(k protoreflect.Kind, v string) (protoreflect.Value, error) {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil {
			return protoreflect.Value{}, errors.New("want an integer between -2^31 and 2^31-1")
		}
		return protoreflect.ValueOfInt32(int32(n)), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return protoreflect.Value{}, errors.New("want an integer")
		}
		return protoreflect.ValueOfInt64(n), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return protoreflect.Value{}, errors.New("want a non-negative integer below 2^32")
		}
		return protoreflect.ValueOfUint32(uint32(n)), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return protoreflect.Value{}, errors.New("want a non-negative integer")
		}
		return protoreflect.ValueOfUint64(n), nil
	}
	return protoreflect.Value{}, fmt.Errorf("a %s cannot be set from the query", k)
}

// parseEnum accepts an enum value's name (any case, '-' for '_'), its
// name without the common prefix ("lines" for SPLIT_LINES: the one value
// ending in _LINES), or its number.
func parseEnum(v string, ed protoreflect.EnumDescriptor) (int32, error) {
	if n, err := strconv.ParseInt(v, 10, 32); err == nil {
		if ed.Values().ByNumber(protoreflect.EnumNumber(n)) == nil {
			return 0, fmt.Errorf("no %s value %d; want one of %s", ed.Name(), n, strings.Join(enumNames(ed), ", "))
		}
		return int32(n), nil
	}
	up := strings.ToUpper(strings.ReplaceAll(v, "-", "_"))
	if ev := ed.Values().ByName(protoreflect.Name(up)); ev != nil && up != "" {
		return int32(ev.Number()), nil
	}
	var match protoreflect.EnumValueDescriptor
	for i := 0; i < ed.Values().Len() && up != ""; i++ {
		ev := ed.Values().Get(i)
		if strings.HasSuffix(string(ev.Name()), "_"+up) {
			if match != nil {
				return 0, fmt.Errorf("%q is ambiguous; want one of %s", v, strings.Join(enumNames(ed), ", "))
			}
			match = ev
		}
	}
	if match != nil {
		return int32(match.Number()), nil
	}
	return 0, fmt.Errorf("want one of %s", strings.Join(enumNames(ed), ", "))
}
