package peer_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// brokenCodec is the real codec of a format with one method broken, the way
// a regression in a codec would look to the harness.
type brokenCodec struct {
	wire.Codec
	marshalErr error
	mangle     bool // UnmarshalPipeDoc returns a different document
}

func (c brokenCodec) MarshalPipeDoc(d *wire.PipeDoc) ([]byte, error) {
	if c.marshalErr != nil {
		return nil, c.marshalErr
	}
	return c.Codec.MarshalPipeDoc(d)
}

func (c brokenCodec) UnmarshalPipeDoc(b []byte) (*wire.PipeDoc, error) {
	d, err := c.Codec.UnmarshalPipeDoc(b)
	if err == nil && c.mangle {
		d.DocID += "-changed"
	}
	return d, err
}

// TestModesRequireBothCodecs: the dual-format harness accepts the real
// codecs and reports (never skips) a codec that cannot round-trip, naming
// the format and the codec's error.
func TestModesRequireBothCodecs(t *testing.T) {
	for _, format := range []wire.Format{wire.FormatCBOR, wire.FormatProtobuf} {
		if err := codecWorks(format, wire.CodecFor(format)); err != nil {
			t.Errorf("real %s codec rejected by the harness: %v", format, err)
		}
	}
	boom := errors.New("field 7 has no encoder")
	cases := []struct {
		name   string
		format wire.Format
		codec  wire.Codec
		want   []string
	}{
		{"marshal fails", wire.FormatProtobuf,
			brokenCodec{Codec: wire.CodecFor(wire.FormatProtobuf), marshalErr: boom},
			[]string{"protobuf codec", "MarshalPipeDoc", boom.Error()}},
		{"round trip changes the doc", wire.FormatCBOR,
			brokenCodec{Codec: wire.CodecFor(wire.FormatCBOR), mangle: true},
			[]string{"cbor codec", "round trip", `"x-changed"`}},
		{"wrong codec for the format", wire.FormatProtobuf,
			wire.CodecFor(wire.FormatCBOR),
			[]string{"protobuf codec", "returned the cbor codec"}},
		{"no codec", wire.FormatCBOR, nil, []string{"cbor codec", "nil"}},
	}
	for _, c := range cases {
		err := codecWorks(c.format, c.codec)
		if err == nil {
			t.Errorf("%s: harness accepted a broken %s codec", c.name, c.format)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
	}
	if err := codecWorks(wire.FormatProtobuf, cases[0].codec); !errors.Is(err, boom) {
		t.Errorf("harness error %v does not wrap the codec's error", err)
	}
}
