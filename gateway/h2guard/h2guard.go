// Package h2guard bounds HTTP/2 control-frame abuse on a server
// connection: it reads the frame headers of the bytes a client sends, as
// they pass, and cuts a connection whose client sends RST_STREAM (rapid
// reset, CVE-2023-44487), SETTINGS or PING frames faster than a token
// bucket allows: a GOAWAY with ENHANCE_YOUR_CALM (RFC 9113 section 5.4.1)
// when the server is not in the middle of writing a frame, then close.
// Resets also draw from a second bucket shared by every connection of
// one tenant (Conn.Attribute), so opening more connections does not buy
// more resets; and after a cut the client's address and the connection's
// tenant are in cooldown: new connections from the address are closed at
// once, and a connection is cut as soon as a request of the tenant
// authenticates on it. Neither net/http's HTTP/2 server nor grpc-go rate-limits
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
	frameData      = 0x0
	frameHeaders   = 0x1
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

// Guard is what the guarded connections of a server share: their
// budgets, the per-tenant reset buckets and the cooldowns after a cut.
type Guard struct {
	Limits       Limits
	TenantResets Budget
	// Cooldown: after a cut, the client's address and the connection's
	// tenant are refused for this long (0: no cooldown).
	Cooldown time.Duration
	// OnCut, if set, is told why a connection was cut (metrics, logs).
	OnCut func(reason string)

	mu      sync.Mutex
	buckets map[string]*rate.Limiter // tenant -> resets
	ips     map[string]time.Time     // address -> end of its cooldown
	tenants map[string]time.Time     // tenant -> end of its cooldown
}

// maxCooldowns bounds the addresses and tenants in cooldown; expired
// ones are pruned when it is reached, and above it no more are added.
const maxCooldowns = 1 << 16

// Wrap guards c. The client's preface decides whether it speaks HTTP/2
// (an HTTP/1 connection passes untouched); h2 says the server speaks
// HTTP/2 from its first octet (a gRPC listener, whose SETTINGS may go out
// before the client's preface arrives), so its frames are followed from
// the start. A connection from an address in cooldown is cut at its
// first frame unless it is exempt (Conn.Exempt); Listener refuses such
// connections at accept already.
func (g *Guard) Wrap(c net.Conn, h2 bool) *Conn {
	l := g.Limits
	gc := &Conn{Conn: c, g: g, ip: hostOf(c.RemoteAddr()), resets: l.Resets.limiter(), settings: l.Settings.limiter(),
		pings: l.Pings.limiter(), slot: make(chan struct{}, 1)}
	gc.isH2.Store(h2)
	return gc
}

func hostOf(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// Refuses reports whether connections from a's address are in cooldown.
func (g *Guard) Refuses(a net.Addr) bool { return g.cooling(false, hostOf(a)) }

// cooling reports whether key is in cooldown among the addresses
// (tenant false) or the tenants; the maps are read under the lock (punish
// creates them).
func (g *Guard) cooling(tenant bool, key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.ips
	if tenant {
		m = g.tenants
	}
	until, ok := m[key]
	return ok && time.Now().Before(until)
}

// punish starts the cooldown of a cut connection's address and tenant
// (an unauthenticated one has none).
func (g *Guard) punish(ip, tenant string) {
	if g.Cooldown <= 0 {
		return
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ips == nil {
		g.ips, g.tenants = map[string]time.Time{}, map[string]time.Time{}
	}
	if ip != "" {
		g.coolLocked(g.ips, ip, now)
	}
	if tenant != "" { // "" is every caller of a server without tokens
		g.coolLocked(g.tenants, tenant, now)
	}
}

func (g *Guard) coolLocked(m map[string]time.Time, key string, now time.Time) {
	if len(m) >= maxCooldowns {
		for k, until := range m {
			if !now.Before(until) {
				delete(m, k)
			}
		}
	}
	if len(m) < maxCooldowns {
		m[key] = now.Add(g.Cooldown)
	}
}

// bucket returns tenant's reset bucket (nil: no per-tenant budget).
func (g *Guard) bucket(tenant string) *rate.Limiter {
	if g.TenantResets.Burst <= 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.buckets == nil {
		g.buckets = map[string]*rate.Limiter{}
	}
	l := g.buckets[tenant]
	if l == nil {
		l = g.TenantResets.limiter()
		g.buckets[tenant] = l
	}
	return l
}

// Listener closes connections from addresses in cooldown at accept and
// guards the others.
func (g *Guard) Listener(l net.Listener) net.Listener { return guardListener{Listener: l, g: g} }

type guardListener struct {
	net.Listener
	g *Guard
}

func (l guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.g.Refuses(c.RemoteAddr()) {
			_ = c.Close()
			if l.g.OnCut != nil {
				l.g.OnCut("cooldown")
			}
			continue
		}
		return l.g.Wrap(c, false), nil
	}
}

// Conn is a server connection under guard.
type Conn struct {
	net.Conn
	g  *Guard
	ip string

	resets, settings, pings *rate.Limiter
	tenantResets            atomic.Pointer[rate.Limiter]
	tenant                  atomic.Pointer[string]

	// exempt, if set, is asked once, at the first frame: an exempt
	// connection (the REST proxy's own) is not counted.
	exempt  func(remote net.Addr) bool
	checked bool

	// read side (the connection's one reader)
	mode      int         // modeDetect, modeH2, modeOff
	isH2      atomic.Bool // the server's writes are HTTP/2 frames
	http1     atomic.Bool // the first bytes were not the preface: HTTP/1 for good
	preface   int         // preface octets matched so far
	hdr       [frameHeaderLen]byte
	hdrN      int
	skip      int           // payload octets still to pass
	lastID    atomic.Uint32 // highest client stream id seen
	cut       atomic.Bool
	cutReason atomic.Value // string

	// write side: the server's writes are serialized by the server; slot
	// lets the GOAWAY of a cut take a turn without waiting (try-only).
	slot     chan struct{}
	sentData atomic.Bool // a HEADERS or DATA frame was written since the last client PING
	w        writeFrames
	goAwayed bool
}

// writeFrames follows the frame boundaries of the server's writes.
type writeFrames struct {
	hdr  [frameHeaderLen]byte
	n    int // header octets seen
	skip int // payload octets still to pass
}

// scan advances over b, the next written octets, and reports whether a
// DATA or HEADERS frame header ended in them. On a copy it previews the
// write without advancing.
func (w *writeFrames) scan(b []byte) (data bool) {
	for len(b) > 0 {
		if w.skip > 0 {
			k := min(w.skip, len(b))
			w.skip -= k
			b = b[k:]
			continue
		}
		k := copy(w.hdr[w.n:], b)
		w.n += k
		b = b[k:]
		if w.n == frameHeaderLen {
			w.n = 0
			w.skip = int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
			if t := w.hdr[3]; t == frameData || t == frameHeaders {
				data = true
			}
		}
	}
	return data
}

const (
	modeDetect = iota // HTTP/1 or h2c prior knowledge: look for the preface
	modeH2
	modeOff // HTTP/1: nothing to count
)

// Attribute records the tenant of a request authenticated on c: its
// resets then also draw from the tenant's bucket (the first tenant
// decides), and a tenant in cooldown has the connection cut at once.
func (c *Conn) Attribute(tenant string) {
	if !c.isH2.Load() {
		return // HTTP/1: nothing of this is counted
	}
	if c.g.cooling(true, tenant) {
		c.tenant.CompareAndSwap(nil, &tenant)
		c.abort("tenant_cooldown")
		return
	}
	if c.tenant.CompareAndSwap(nil, &tenant) {
		if b := c.g.bucket(tenant); b != nil {
			c.tenantResets.Store(b)
		}
		// A request that authenticates after its connection was cut (a
		// rapid reset's streams start their handlers late) still puts
		// its tenant in cooldown; abort, which may have run before, did
		// not know the tenant.
		if c.cut.Load() {
			c.g.punish("", tenant)
		}
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
		if reason, rest := c.scan(p[:n]); reason != "" {
			// The server still gets the frames before the offending one
			// (their requests authenticate and name the tenant, which
			// then cools down: Attribute); the next Read fails.
			c.abort(reason)
			return max(0, n-rest-frameHeaderLen), nil
		}
	}
	return n, err
}

// scan follows the frame headers in b; it returns why the connection
// must be cut ("" if not) and how many octets of b follow the header of
// the frame that decided it.
func (c *Conn) scan(b []byte) (string, int) {
	for len(b) > 0 {
		switch {
		case c.mode == modeOff:
			return "", 0
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
				return "", 0
			}
			c.hdrN = 0
			if reason := c.frame(); reason != "" {
				return reason, len(b)
			}
		}
	}
	return "", 0
}

// detect matches the preface; a mismatch is HTTP/1.
func (c *Conn) detect(b []byte) []byte {
	want := Preface[c.preface:]
	k := min(len(want), len(b))
	if !bytes.Equal(b[:k], []byte(want[:k])) {
		c.mode = modeOff
		c.http1.Store(true)
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
	if id > c.lastID.Load() && id%2 == 1 {
		c.lastID.Store(id)
	}
	if !c.checked {
		c.checked = true
		if c.exempt != nil && c.exempt(c.Conn.RemoteAddr()) {
			c.mode = modeOff // the rest of the connection passes uncounted
			return ""
		}
		if c.g.cooling(false, c.ip) {
			return "cooldown"
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
		// A ping while the server sends responses is a client measuring
		// the path (grpc-go's BDP estimator pings once per round trip of
		// received data): only pings with no HEADERS or DATA written
		// since the last one count, as grpc-go's keepalive policy does.
		if flags&flagAck == 0 && !c.sentData.Swap(false) && !allow(c.pings) {
			return "ping"
		}
	}
	return ""
}

func allow(l *rate.Limiter) bool { return l == nil || l.Allow() }

// abort cuts the connection: GOAWAY once the server is between frames
// and not writing (waiting at most goAwayDeadline for its write to end),
// then close.
func (c *Conn) abort(reason string) {
	if !c.cut.CompareAndSwap(false, true) {
		return
	}
	c.cutReason.Store(reason)
	if c.g.OnCut != nil {
		c.g.OnCut(reason)
	}
	tenant := ""
	if t := c.tenant.Load(); t != nil {
		tenant = *t
	}
	c.g.punish(c.ip, tenant)
	t := time.NewTimer(goAwayDeadline)
	defer t.Stop()
	select {
	case c.slot <- struct{}{}: // the server is not writing (or finished its write): a frame boundary is known
		if c.isH2.Load() && c.w.n == 0 && c.w.skip == 0 && !c.goAwayed {
			c.goAwayed = true
			_ = c.Conn.SetWriteDeadline(time.Now().Add(goAwayDeadline))
			_, _ = c.Conn.Write(goAway(c.lastID.Load(), reason))
		}
		<-c.slot
	case <-t.C: // a write blocked on a slow client: no GOAWAY, which would land inside a frame
	}
	_ = c.Conn.Close()
}

// goAway is a GOAWAY frame: last stream id, ENHANCE_YOUR_CALM, reason as
// debug data.
func goAway(lastID uint32, reason string) []byte {
	debug := "h2guard: too many " + reason + " frames"
	switch reason {
	case "tenant_cooldown":
		debug = "h2guard: tenant_cooldown: this tenant's connection was cut for HTTP/2 abuse moments ago"
	case "cooldown":
		debug = "h2guard: cooldown: a connection from this address was cut for HTTP/2 abuse moments ago"
	}
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
	h2 := c.isH2.Load()
	after := c.w
	if h2 && after.scan(p) {
		// Marked before the octets go out: the client may read them and
		// answer with its BDP PING before Write returns, and that ping
		// must find the data sent (marking it after the write counted
		// such pings, and cut a busy grpc-go client).
		c.sentData.Store(true)
	}
	n, err := c.Conn.Write(p)
	if h2 {
		if n == len(p) {
			c.w = after // the whole write went out: its scan holds
		} else {
			c.follow(p[:n])
		}
	}
	return n, err
}

// HTTP1Conn returns the connection under c once its first bytes were not
// the HTTP/2 preface (an HTTP/1 connection, such as a hijacked one): the
// guard has nothing to follow or cut there, so its owner may write to the
// returned connection directly (reads and Close still go through c). ok
// is false while undecided and for HTTP/2.
func (c *Conn) HTTP1Conn() (raw net.Conn, ok bool) {
	if !c.http1.Load() {
		return nil, false
	}
	return c.Conn, true
}

// follow tracks the server's frame boundaries over written bytes.
func (c *Conn) follow(b []byte) {
	if c.w.scan(b) {
		c.sentData.Store(true)
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
