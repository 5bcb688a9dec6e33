package bench

import "testing"

// topLevelID takes the id only from the Document's first two members,
// and only when both agree; anything else goes to encoding/json.
func TestTopLevelID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		id   string
		want bool
	}{
		{`{"name":"documents/abc","id":"abc","state":"PENDING"}`, "abc", true},
		{`{"name":"documents/abc","id":"abd"}`, "", false},
		{`{"id":"abc","name":"documents/abc"}`, "", false},
		{`{"name":"documents/abc","state":"x","id":"abc"}`, "", false},
		{`{"name":"documents/ab`, "", false},
	} {
		id, ok := topLevelID([]byte(tc.in))
		if ok != tc.want || id != tc.id {
			t.Errorf("topLevelID(%s) = %q, %v; want %q, %v", tc.in, id, ok, tc.id, tc.want)
		}
	}
}
