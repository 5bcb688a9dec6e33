package pagetoken

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestRoundTrip: a token decodes to the keyset it was made from, for the
// state filter it was issued for (negative create times included).
func TestRoundTrip(t *testing.T) {
	for _, c := range []struct {
		state gatewayv1.State
		ct    int64
		id    string
	}{
		{gatewayv1.State_STATE_UNSPECIFIED, 1_700_000_000_000_000_000, "doc-1"},
		{gatewayv1.State_SUCCEEDED, -5, "a"},
		{gatewayv1.State_FAILED, 0, strings.Repeat("x", 128)},
	} {
		tok := Encode(c.state, c.ct, c.id)
		ct, id, err := Decode(tok, c.state, 128)
		if err != nil || ct != c.ct || id != c.id {
			t.Errorf("Decode(Encode(%v, %d, %q)) = %d, %q, %v", c.state, c.ct, c.id, ct, id, err)
		}
	}
}

// TestFormat pins the octets: both backends' tokens, and tokens issued
// before the codec was shared, stay valid.
func TestFormat(t *testing.T) {
	got := Encode(gatewayv1.State_SUCCEEDED, 0x0102030405060708, "ab")
	want := base64.RawURLEncoding.EncodeToString([]byte{1, byte(gatewayv1.State_SUCCEEDED), 1, 2, 3, 4, 5, 6, 7, 8, 'a', 'b'})
	if got != want {
		t.Errorf("Encode = %q, want %q", got, want)
	}
}

// TestRejects: every token the backends did not issue for this filter
// answers ErrBadPageToken.
func TestRejects(t *testing.T) {
	ok := Encode(gatewayv1.State_RUNNING, 7, "d")
	raw := func(b ...byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	for name, tok := range map[string]string{
		"other state":   ok,
		"not base64":    "!!!",
		"too long":      Encode(gatewayv1.State_SUCCEEDED, 7, strings.Repeat("x", 200)),
		"short":         raw(1, byte(gatewayv1.State_SUCCEEDED), 0, 0),
		"no id":         raw(1, byte(gatewayv1.State_SUCCEEDED), 0, 0, 0, 0, 0, 0, 0, 7),
		"wrong version": raw(2, byte(gatewayv1.State_SUCCEEDED), 0, 0, 0, 0, 0, 0, 0, 7, 'd'),
		"invalid utf8":  raw(1, byte(gatewayv1.State_SUCCEEDED), 0, 0, 0, 0, 0, 0, 0, 7, 0xff),
	} {
		if _, _, err := Decode(tok, gatewayv1.State_SUCCEEDED, 128); !errors.Is(err, store.ErrBadPageToken) {
			t.Errorf("%s: Decode = %v, want ErrBadPageToken", name, err)
		}
	}
}
