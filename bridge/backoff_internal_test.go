package bridge

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// The backoff after a failed dial or a session that ended at once
// (profile 8): 100 ms doubling to 10 s, each wait jittered in [d/2, d), so
// a peer that fails every time is dialled at most 8 times in the first
// 10 s and then about once every 5 to 10 s.
func TestBackoffDoublesWithJitterToCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pc := &peerConn{}
		d := redialMin
		for i := range 12 {
			start := time.Now()
			in := pc.backoffLocked()
			if in < d/2 || in >= d {
				t.Fatalf("failure %d: wait %v, want in [%v, %v)", i+1, in, d/2, d)
			}
			if got := pc.retryAt.Sub(start); got != in {
				t.Fatalf("failure %d: retryAt %v after now, want %v", i+1, got, in)
			}
			d = min(d*2, redialMax)
		}
		if pc.delay != redialMax {
			t.Errorf("delay after 12 failures %v, want the cap %v", pc.delay, redialMax)
		}
		// Ten seconds of a peer that fails at once: count the dials.
		pc = &peerConn{}
		dials, start := 0, time.Now()
		for time.Since(start) < 10*time.Second {
			dials++
			time.Sleep(pc.backoffLocked())
		}
		if dials > 8 { // 1 + waits of at least 50, 100, ..., 3200 ms (6.35 s), the next at least 5 s
			t.Errorf("%d dials in 10 s of failures, want at most 8", dials)
		}
		t.Logf("%d dials in the first 10 s of failures", dials)
	})
}

// A session that ended at once switches an auto peer's framing only when
// the peer closed it with an error code and is not this project's peer
// (which answers in the client's framing); a clean close keeps it.
func TestFramingSuspect(t *testing.T) {
	for _, tc := range []struct {
		name    string
		profile bool
		err     error
		want    bool
	}{
		{"draft-04 peer reading a draft-02 STATUS", false, &quicpeer.CloseError{Code: wire.CodeEntityTooLarge, Remote: true}, true},
		{"frame error", false, &quicpeer.CloseError{Code: wire.CodeFrameError, Remote: true}, true},
		{"clean close", false, &quicpeer.CloseError{Code: wire.CodeNoError, Remote: true}, false},
		{"closed locally", false, &quicpeer.CloseError{Code: wire.CodeFrameError}, false},
		{"no error", false, nil, false},
		{"this project's peer", true, &quicpeer.CloseError{Code: wire.CodeFrameError, Remote: true}, false},
	} {
		ss := &sessState{n: quicpeer.Negotiated{Profile: tc.profile}}
		if got := framingSuspect(ss, tc.err); got != tc.want {
			t.Errorf("%s: framingSuspect = %v, want %v", tc.name, got, tc.want)
		}
	}
}
