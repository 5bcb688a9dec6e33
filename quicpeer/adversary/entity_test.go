package adversary_test

import (
	"crypto/sha256"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Entity-stream attacks: the stream is refused with the draft's code, the
// connection lives on, and other clients are unaffected.

// TestHeaderLengthLies: a 4-octet Header Length of 4 GiB-1 is refused with
// 0x06 from the length alone, without allocating it; 0 is 0x05; a header
// cut short by FIN is refused; entity 0 in a header is 0x05.
func TestHeaderLengthLies(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	r := dialRaw(t, tg, allLayers())

	t.Run("4 GiB header length", func(t *testing.T) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		st := r.entityStream(0xFFFFFFFF, []byte{0xA1, 0x01})
		code := stopCode(t, st)
		runtime.ReadMemStats(&after)
		if code != wire.CodeEntityTooLarge {
			t.Errorf("Header Length 4 GiB-1: stream stopped with %s, want %s", code, wire.CodeEntityTooLarge)
		}
		// Everything the process allocated meanwhile (both endpoints, QUIC
		// included): far below even the 64 KiB header cap times a few.
		if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
			t.Errorf("refusing a 4 GiB Header Length allocated %d bytes in the process; nothing may be sized from it", d)
		}
		r.alive("after a 4 GiB Header Length")
	})
	t.Run("header length just over the cap", func(t *testing.T) {
		st := r.entityStream(64<<10+1, []byte{0xA1})
		if code := stopCode(t, st); code != wire.CodeEntityTooLarge {
			t.Errorf("Header Length 64 KiB+1: stream stopped with %s, want %s", code, wire.CodeEntityTooLarge)
		}
		r.alive("after Header Length 64 KiB+1")
	})
	t.Run("header length 0", func(t *testing.T) {
		st := r.entityStream(0, nil)
		if code := stopCode(t, st); code != wire.CodeEntityInvalid {
			t.Errorf("Header Length 0: stream stopped with %s, want %s", code, wire.CodeEntityInvalid)
		}
		r.alive("after Header Length 0")
	})
	t.Run("header cut short by FIN", func(t *testing.T) {
		hb := header(t, &wire.EntityHeader{EntityID: 1, PayloadLength: 3})
		st := r.entityStream(uint32(len(hb)), hb[:len(hb)/2])
		st.Close()
		r.alive("after a truncated header")
		waitLog(t, tg, "rejected entity stream", "entity stream ended inside the header")
	})
	t.Run("entity 0", func(t *testing.T) {
		hb := header(t, &wire.EntityHeader{EntityID: 1, PayloadLength: 1})
		// entity-id is the first map entry: "entity-id" (0x69 + 9 octets) then
		// the value 1 (0x01); make it 0 on the wire.
		i := strings.Index(string(hb), "entity-id")
		if i < 0 || hb[i+9] != 0x01 {
			t.Fatalf("unexpected CBOR header layout % x", hb)
		}
		hb[i+9] = 0x00
		st := r.entityStream(uint32(len(hb)), hb)
		if code := stopCode(t, st); code != wire.CodeEntityInvalid {
			t.Errorf("entity 0 in a header: stream stopped with %s, want %s", code, wire.CodeEntityInvalid)
		}
		r.alive("after entity 0")
	})
	t.Run("payload-length 2^62", func(t *testing.T) {
		hb := header(t, &wire.EntityHeader{EntityID: 7, PayloadLength: 1 << 62})
		st := r.entityStream(uint32(len(hb)), hb)
		st.Write([]byte("tiny"))
		if code := stopCode(t, st); code != wire.CodeEntityTooLarge {
			t.Errorf("payload-length 2^62: stream stopped with %s, want %s", code, wire.CodeEntityTooLarge)
		}
		r.waitStatus(7, wire.StatusFailed)
		r.alive("after payload-length 2^62")
	})
	completeDocument(t, tg, "after header-length lies")
}

// TestChecksumLie: a payload whose SHA-256 does not match the header's
// checksum is refused (FAILED; PIPESTREAM_INTEGRITY_ERROR on the stream),
// and the same connection then completes a correct entity.
func TestChecksumLie(t *testing.T) {
	tg := startTarget(t, peer.Options{})
	r := dialRaw(t, tg, allLayers())
	payload := envelope(t, wire.FormatCBOR, 1, []byte("the truth"))
	lie := sha256.Sum256([]byte("a lie"))
	r.sendEntity(&wire.EntityHeader{EntityID: 1, ContentType: "text/plain", PayloadLength: uint64(len(payload)), Checksum: lie[:], Metadata: profileMD(nil)}, payload)
	r.waitStatus(1, wire.StatusFailed)
	waitLog(t, tg, "PIPESTREAM_INTEGRITY_ERROR")
	r.alive("after a checksum lie")

	// A wrong length (declared 10 octets more) is 0x05, also per stream.
	p2 := envelope(t, wire.FormatCBOR, 2, []byte("short"))
	r.sendEntity(&wire.EntityHeader{EntityID: 2, ContentType: "text/plain", PayloadLength: uint64(len(p2) + 10), Metadata: profileMD(nil)}, p2)
	r.waitStatus(2, wire.StatusFailed)
	r.alive("after a length lie")

	p3 := envelope(t, wire.FormatCBOR, 3, []byte("honest"))
	sum := sha256.Sum256(p3)
	r.sendEntity(&wire.EntityHeader{EntityID: 3, ContentType: "text/plain", PayloadLength: uint64(len(p3)), Checksum: sum[:], Metadata: profileMD(nil)}, p3)
	r.waitStatus(3, wire.StatusComplete)
	completeDocument(t, tg, "after checksum lies")
}

// TestSlowloris opens every stream the peer allows on several connections
// and sends one octet on each (a Header Length that never completes). The
// peer's MAX_STREAMS cap holds (no stream beyond it opens), its goroutines
// stay bounded by the cap, a well-behaved client completes a document
// meanwhile, and the goroutines go away with the attacker.
func TestSlowloris(t *testing.T) {
	const maxStreams, conns = 32, 4
	tg := startTarget(t, peer.Options{Limits: quicpeer.Limits{MaxIncomingStreams: maxStreams}})
	completeDocument(t, tg, "before slowloris") // warm up: workers, pools
	// The warm-up's entity workers exit after a second idle: count from
	// when none is left.
	waitWorkers(t, func(n int) bool { return n == 0 }, "the warm-up's idle entity workers exit")
	base := runtime.NumGoroutine()

	var attackers []*raw
	for range conns {
		r := dialRaw(t, tg, allLayers())
		attackers = append(attackers, r)
		for i := range maxStreams {
			st, err := r.conn.OpenUniStream()
			if err != nil {
				t.Fatalf("stream %d of %d (within the cap): %v", i+1, maxStreams, err)
			}
			if _, err := st.Write([]byte{0}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := r.conn.OpenUniStream()
		var limit *quic.StreamLimitReachedError
		if !errors.As(err, &limit) {
			t.Errorf("stream %d on one connection: %v, want the peer's stream limit (%d) to hold", maxStreams+1, err, maxStreams)
		}
	}
	// Count once the peer runs a worker for every held stream (each waits
	// for the rest of its header).
	waitWorkers(t, func(n int) bool { return n >= conns*maxStreams }, "the peer accepts every held stream")
	completeDocument(t, tg, "during slowloris")
	during := runtime.NumGoroutine()
	// Per held stream the peer runs one worker; the rest is slack for the
	// attack's own QUIC connections (client and server side) and the
	// well-behaved session.
	if limit := base + conns*maxStreams + 30*conns + 40; during > limit {
		t.Errorf("%d goroutines during slowloris (base %d, %d connections x %d streams): above %d", during, base, conns, maxStreams, limit)
	}
	for _, r := range attackers {
		r.alive("slowloris connection")
		r.conn.CloseWithError(0, "")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+10 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+10 {
		t.Errorf("%d goroutines 5 s after the slowloris connections closed, base %d: the held streams were not released", n, base)
	}
	t.Logf("goroutines: base %d, during %d (%d held streams), after %d", base, during, conns*maxStreams, runtime.NumGoroutine())
}

// waitLog waits until the peer's log contains every fragment on one line.
func waitLog(t *testing.T, tg *target, fragments ...string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(tg.logs.String(), "\n") {
			ok := true
			for _, f := range fragments {
				ok = ok && strings.Contains(line, f)
			}
			if ok {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("the peer never logged a line with %q", fragments)
}

// entityWorker is the function of the session's entity-stream workers
// (quicpeer/entity.go), one per stream being read.
const entityWorker = "quicpeer.(*entityWorkers).run("

// waitWorkers waits, polling the goroutine stacks, until ok holds for the
// number of entity-stream workers; it fails after waitLimit.
func waitWorkers(t *testing.T, ok func(n int) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	buf := make([]byte, 1<<20)
	for {
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		n := strings.Count(string(buf), entityWorker)
		if ok(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (%d entity workers)", what, waitLimit, n)
		}
		buf = buf[:cap(buf)]
		time.Sleep(20 * time.Millisecond) // polling period of a condition with a deadline
	}
}
