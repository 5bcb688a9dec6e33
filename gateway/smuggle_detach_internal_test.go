package gateway

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestGuardDetachesOnHijack: once a handler hijacks a guarded connection
// (as the WebSocket route does), the guard's follower ends and Read reads
// the connection itself, losing, duplicating or reordering no byte the
// client sent before, during or after the hijack (seeded random chunks
// and pauses, over a real TCP connection and http.Server with the guard's
// listener and ConnState hook); read deadlines set after the detach apply
// to the connection, and a deadline passing is an error the handler
// sees, after which reading resumes. GUARD_SEED replays a seed.
func TestGuardDetachesOnHijack(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("GUARD_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (replay: GUARD_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	type result struct {
		got      []byte
		direct   bool
		checked  bool // the deadline check ran (nothing was pending)
		timedOut bool
		err      error
	}
	results := make(chan result, 1)
	srv := &http.Server{ConnState: guardConnState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nc, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			results <- result{err: err}
			return
		}
		defer nc.Close()
		g := nc.(*guardConn)
		var res result
		// Wait for the detach (the follower's last step), then check
		// that a deadline on the detached connection cuts a read.
		for range 1000 {
			g.mu.Lock()
			res.direct = g.direct
			g.mu.Unlock()
			if res.direct {
				break
			}
			time.Sleep(time.Millisecond)
		}
		g.mu.Lock()
		pending := g.out.len()
		g.mu.Unlock()
		if brw.Reader.Buffered() == 0 && pending == 0 {
			res.checked = true
			_ = nc.SetReadDeadline(time.Now().Add(-time.Second))
			_, err := brw.Reader.Read(make([]byte, 1))
			res.timedOut = errors.Is(err, os.ErrDeadlineExceeded)
			_ = nc.SetReadDeadline(time.Time{})
		}
		_, _ = nc.Write([]byte("go\n")) // the client sends the rest now
		res.got, res.err = io.ReadAll(brw.Reader)
		results <- res
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(guardListener{Listener: ln, maxHead: http.DefaultMaxHeaderBytes})
	defer srv.Close()

	checked := 0
	for round := range 30 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		// Behind the request head, before the hijack: nothing, or the
		// start of a next request head, which the follower's parser holds
		// (unfinished) when the hijack kicks it; a WebSocket client sends
		// nothing before the 101 (RFC 6455 4.1), and bytes that are no
		// request would be refused as one.
		var want []byte
		if rng.IntN(3) > 0 {
			want = []byte("GET /next HTTP/1.1\r\nHost: y\r\nX-Pad: ")
			for range rng.IntN(3000) {
				want = append(want, byte('!'+rng.IntN(90)))
			}
		}
		before := len(want)
		for range 1 + rng.IntN(200000) {
			want = append(want, byte(rng.IntN(256)))
		}
		head := "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"
		if _, err := c.Write(append([]byte(head), want[:before]...)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 3)); err != nil { // "go\n"
			t.Fatalf("seed %d round %d: %v", seed, round, err)
		}
		for rest := want[before:]; len(rest) > 0; {
			k := 1 + rng.IntN(min(len(rest), 40000))
			if _, err := c.Write(rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
			if rng.IntN(4) == 0 {
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			}
		}
		c.(*net.TCPConn).CloseWrite()
		res := <-results
		c.Close()
		if res.err != nil {
			t.Fatalf("seed %d round %d: %v", seed, round, res.err)
		}
		if !res.direct {
			t.Fatalf("seed %d round %d: the guard did not detach from the hijacked connection", seed, round)
		}
		if res.checked {
			checked++
		}
		if res.checked && !res.timedOut {
			t.Fatalf("seed %d round %d: a read deadline on the detached connection did not cut the read", seed, round)
		}
		if !bytes.Equal(res.got, want) {
			t.Fatalf("seed %d round %d: the handler read %d bytes, the client sent %d (or they differ)", seed, round, len(res.got), len(want))
		}
	}
	if checked == 0 {
		t.Fatalf("seed %d: no round checked a read deadline", seed)
	}
}
