// Package h2guard bounds HTTP/2 control-frame abuse on a server
// connection: it reads the frame headers of the bytes a client sends, as
// they pass, and cuts a connection whose client sends RST_STREAM (rapid
// reset, CVE-2023-44487), SETTINGS or PING frames faster than a token
// bucket allows: a GOAWAY with ENHANCE_YOUR_CALM (RFC 9113 section 5.4.1)
// when the server is not in the middle of writing a frame, then close.
// Resets may also draw from a second bucket shared by every connection of
// one tenant (Conn.Attribute), so opening more connections does not buy
// more resets. Neither net/http's HTTP/2 server nor grpc-go rate-limits
// these frames (they bound handler goroutines and queued control frames
// only; grpc-go bounds pings with its keepalive policy).
//
// It parses frame headers only (9 octets each) and never buffers
// payloads; bytes pass through unchanged.
package h2guard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Preface is the client connection preface (RFC 9113 section 3.4).
const Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Frame types counted (RFC 9113 section 6).
const (
	frameRSTStream = 0x3
	frameSettings  = 0x4
	framePing      = 0x6
	flagAck        = 0x1
	frameHeaderLen = 9
	frameGoAway    = 0x7
	errEnhanceCalm = 0xb
	goAwayDeadline = 100 * time.Millisecond
)

// Budget is a token bucket: Burst frames at once, PerSecond sustained.
// A zero Budget does not limit.
type Budget struct {
	PerSecond float64
	Burst     int
}

func (b Budget) limiter() *rate.Limiter {
	if b.Burst <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(b.PerSecond), b.Burst)
}

// Limits are a connection's budgets.
type Limits struct {
	Resets, Settings, Pings Budget
}

// Conn is a server connection under guard.
type Conn struct {
	net.Conn
	// onCut, if set, is told why a connection was cut (metrics, logs).
	onCut func(reason string)

	resets, settings, pings *rate.Limiter
	tenantResets            atomic.Pointer[rate.Limiter]

	// exempt, if set, is asked once, at the first frame: an exempt
	// connection (the REST proxy's own) is not counted.
	exempt  func(remote net.Addr) bool
	checked bool

	// read side (the connection's one reader)
	mode      int         // modeDetect, modeH2, modeOff
	isH2      atomic.Bool // mode == modeH2, for the write side
	preface   int         // preface octets matched so far
	hdr       [frameHeaderLen]byte
	hdrN      int
	skip      int    // payload octets still to pass
	lastID    uint32 // highest client stream id seen
	cut       atomic.Bool
	cutReason atomic.Value // string

	// write side: the server's writes are serialized by the server; slot
	// lets the GOAWAY of a cut take a turn without waiting (try-only).
	slot     chan struct{}
	wHdr     [frameHeaderLen]byte
	wHdrN    int
	wSkip    int
	goAwayed bool
}

const (
	modeDetect = iota // HTTP/1 or h2c prior knowledge: look for the preface
	modeH2
	modeOff // HTTP/1: nothing to count
)

// NewConn guards c. The client's preface decides whether it speaks
// HTTP/2 (an HTTP/1 connection passes untouched); h2 says the server
// speaks HTTP/2 from its first octet (a gRPC listener, whose SETTINGS may
// go out before the client's preface arrives), so its frames are
// followed from the start.
func NewConn(c net.Conn, lim Limits, h2 bool, onCut func(reason string)) *Conn {
	g := &Conn{Conn: c, onCut: onCut, resets: lim.Resets.limiter(), settings: lim.Settings.limiter(),
		pings: lim.Pings.limiter(), slot: make(chan struct{}, 1)}
	g.isH2.Store(h2)
	return g
}

// Attribute makes resets on c also draw from b, a bucket shared by the
// connections of one tenant (the first authenticated request decides).
func (c *Conn) Attribute(b *rate.Limiter) {
	if b != nil {
		c.tenantResets.CompareAndSwap(nil, b)
	}
}

// ErrCut is the read error of a connection cut for abuse.
var ErrCut = errors.New("h2guard: connection cut: HTTP/2 control frames above their rate (ENHANCE_YOUR_CALM)")

// Read passes the client's bytes and counts its frames; after a cut it
// fails.
func (c *Conn) Read(p []byte) (int, error) {
	if c.cut.Load() {
		return 0, ErrCut
	}
	n, err := c.Conn.Read(p)
	if n > 0 && c.mode != modeOff {
		if reason := c.scan(p[:n]); reason != "" {
			c.abort(reason)
			return 0, ErrCut
		}
	}
	return n, err
}

// scan follows the frame headers in b; it returns why the connection
// must be cut, or "".
func (c *Conn) scan(b []byte) string {
	for len(b) > 0 {
		switch {
		case c.mode == modeOff:
			return ""
		case c.mode == modeDetect:
			b = c.detect(b)
		case c.skip > 0:
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
		default:
			k := copy(c.hdr[c.hdrN:], b)
			c.hdrN += k
			b = b[k:]
			if c.hdrN < frameHeaderLen {
				return ""
			}
			c.hdrN = 0
			if reason := c.frame(); reason != "" {
				return reason
			}
		}
	}
	return ""
}

// detect matches the preface; a mismatch is HTTP/1.
func (c *Conn) detect(b []byte) []byte {
	want := Preface[c.preface:]
	k := min(len(want), len(b))
	if !bytes.Equal(b[:k], []byte(want[:k])) {
		c.mode = modeOff
		return nil
	}
	c.preface += k
	if c.preface == len(Preface) {
		c.mode = modeH2
		c.isH2.Store(true)
	}
	return b[k:]
}

// frame counts the frame whose header is in c.hdr.
func (c *Conn) frame() string {
	length := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
	typ, flags := c.hdr[3], c.hdr[4]
	id := binary.BigEndian.Uint32(c.hdr[5:9]) & 0x7fffffff
	c.skip = length
	if id > c.lastID && id%2 == 1 {
		c.lastID = id
	}
	if !c.checked {
		c.checked = true
		if c.exempt != nil && c.exempt(c.Conn.RemoteAddr()) {
			c.mode = modeOff // the rest of the connection passes uncounted
			return ""
		}
	}
	switch typ {
	case frameRSTStream:
		if !allow(c.resets) {
			return "rst_stream"
		}
		if !allow(c.tenantResets.Load()) {
			return "rst_stream_tenant"
		}
	case frameSettings:
		if flags&flagAck == 0 && !allow(c.settings) {
			return "settings"
		}
	case framePing:
		if flags&flagAck == 0 && !allow(c.pings) {
			return "ping"
		}
	}
	return ""
}

func allow(l *rate.Limiter) bool { return l == nil || l.Allow() }

// abort cuts the connection: GOAWAY if the server is between frames and
// not writing, then close.
func (c *Conn) abort(reason string) {
	if !c.cut.CompareAndSwap(false, true) {
		return
	}
	c.cutReason.Store(reason)
	if c.onCut != nil {
		c.onCut(reason)
	}
	select {
	case c.slot <- struct{}{}: // the server is not writing: a frame boundary is known
		if c.wHdrN == 0 && c.wSkip == 0 && !c.goAwayed {
			c.goAwayed = true
			_ = c.Conn.SetWriteDeadline(time.Now().Add(goAwayDeadline))
			_, _ = c.Conn.Write(goAway(c.lastID, reason))
		}
		<-c.slot
	default: // mid-write: no GOAWAY, which would land inside a frame
	}
	_ = c.Conn.Close()
}

// goAway is a GOAWAY frame: last stream id, ENHANCE_YOUR_CALM, reason as
// debug data.
func goAway(lastID uint32, reason string) []byte {
	debug := "h2guard: too many " + reason + " frames"
	f := make([]byte, frameHeaderLen+8+len(debug))
	n := 8 + len(debug)
	f[0], f[1], f[2] = byte(n>>16), byte(n>>8), byte(n)
	f[3] = frameGoAway
	binary.BigEndian.PutUint32(f[9:], lastID)
	binary.BigEndian.PutUint32(f[13:], errEnhanceCalm)
	copy(f[17:], debug)
	return f
}

// Write passes the server's bytes, following its frame boundaries so
// that a cut's GOAWAY never lands inside a frame.
func (c *Conn) Write(p []byte) (int, error) {
	c.slot <- struct{}{}
	defer func() { <-c.slot }()
	if c.cut.Load() {
		return 0, ErrCut
	}
	n, err := c.Conn.Write(p)
	if c.isH2.Load() {
		c.follow(p[:n])
	}
	return n, err
}

// follow tracks the server's frame boundaries over written bytes.
func (c *Conn) follow(b []byte) {
	for len(b) > 0 {
		if c.wSkip > 0 {
			k := min(c.wSkip, len(b))
			c.wSkip -= k
			b = b[k:]
			continue
		}
		k := copy(c.wHdr[c.wHdrN:], b)
		c.wHdrN += k
		b = b[k:]
		if c.wHdrN == frameHeaderLen {
			c.wHdrN = 0
			c.wSkip = int(c.wHdr[0])<<16 | int(c.wHdr[1])<<8 | int(c.wHdr[2])
		}
	}
}

// CutReason is why the connection was cut ("" if it was not).
func (c *Conn) CutReason() string {
	r, _ := c.cutReason.Load().(string)
	return r
}

// Exempt sets the check of a connection's remote address that exempts
// it from counting (asked once, at its first frame). Call before use.
func (c *Conn) Exempt(f func(remote net.Addr) bool) { c.exempt = f }

// Listener guards every accepted connection.
type Listener struct {
	net.Listener
	Limits Limits
	// H2: connections speak HTTP/2 from the first octet (gRPC).
	H2    bool
	OnCut func(reason string)
}

// Accept wraps the next connection.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return NewConn(c, l.Limits, l.H2, l.OnCut), nil
}

// Tenants holds the per-tenant reset buckets.
type Tenants struct {
	budget Budget
	mu     sync.Mutex
	m      map[string]*rate.Limiter
}

// NewTenants makes per-tenant buckets of b (nil: no per-tenant bound).
func NewTenants(b Budget) *Tenants {
	if b.Burst <= 0 {
		return nil
	}
	return &Tenants{budget: b, m: map[string]*rate.Limiter{}}
}

// Bucket returns tenant's bucket (nil on a nil Tenants).
func (t *Tenants) Bucket(tenant string) *rate.Limiter {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.m[tenant]
	if l == nil {
		l = t.budget.limiter()
		t.m[tenant] = l
	}
	return l
}
