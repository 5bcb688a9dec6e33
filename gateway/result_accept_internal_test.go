package gateway

import (
	"strings"
	"testing"
)

// FuzzResultAccept: any Accept header and stored type, however malformed,
// negotiates without panicking to the stored type, application/octet-stream
// or a refusal; a header with no usable range leaves the stored type.
func FuzzResultAccept(f *testing.F) {
	for _, s := range []string{"", "*/*", "*", "text/*;q=0.5, application/octet-stream", "a/b;q=2", ";;;,,,", "*/json",
		"application/json;q=0, */*;q=0", strings.Repeat("x/y,", 200), "text/plain;q=abc", "\x00/\xff"} {
		f.Add(s, "text/plain; charset=utf-8")
		f.Add(s, "application/json")
	}
	f.Fuzz(func(t *testing.T, accept, stored string) {
		ct, ok := negotiateResult([]string{accept}, stored)
		if ok && ct != stored && ct != octetStream {
			t.Fatalf("Accept %q, stored %q: served %q, want the stored type or %s", accept, stored, ct, octetStream)
		}
		if !ok && ct != "" {
			t.Fatalf("refused with a type %q", ct)
		}
		if parseAccept([]string{accept}) == nil && (!ok || ct != stored) {
			t.Fatalf("Accept %q has no usable range: got %q %v, want the stored type", accept, ct, ok)
		}
		if n := len(parseAccept([]string{accept})); n > maxAcceptRanges {
			t.Fatalf("%d ranges kept, more than %d", n, maxAcceptRanges)
		}
	})
}
