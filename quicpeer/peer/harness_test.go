package peer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/peer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

func TestMain(m *testing.M) {
	os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	goleak.VerifyTestMain(m)
}

// modes runs a test body with both serialization formats. Both codecs are
// required: a codec that cannot round-trip a minimal PipeDoc fails the
// subtest with the codec's error instead of skipping the test.
func modes(t *testing.T, f func(t *testing.T, format wire.Format)) {
	for _, format := range []wire.Format{wire.FormatCBOR, wire.FormatProtobuf} {
		t.Run(format.String(), func(t *testing.T) {
			if err := codecWorks(format, wire.CodecFor(format)); err != nil {
				t.Fatal(err)
			}
			f(t, format)
		})
	}
}

// codecWorks round-trips a minimal PipeDoc through codec, which must be the
// codec of format, and returns an error naming the codec when it cannot.
func codecWorks(format wire.Format, codec wire.Codec) error {
	if codec == nil {
		return fmt.Errorf("%s codec: wire.CodecFor returned nil; the dual-format tests need both codecs", format)
	}
	if got := codec.Format(); got != format {
		return fmt.Errorf("%s codec: wire.CodecFor returned the %s codec; the dual-format tests need both codecs", format, got)
	}
	in := &wire.PipeDoc{DocID: "x", EntityID: 1}
	b, err := codec.MarshalPipeDoc(in)
	if err != nil {
		return fmt.Errorf("%s codec: MarshalPipeDoc of a minimal PipeDoc failed: %w", format, err)
	}
	out, err := codec.UnmarshalPipeDoc(b)
	if err != nil {
		return fmt.Errorf("%s codec: UnmarshalPipeDoc of its own output failed: %w", format, err)
	}
	if out.DocID != in.DocID || out.EntityID != in.EntityID {
		return fmt.Errorf("%s codec: round trip changed the PipeDoc: got DocID %q EntityID %d, want %q %d",
			format, out.DocID, out.EntityID, in.DocID, in.EntityID)
	}
	return nil
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startPeer starts a peer on loopback; opts.DataDir defaults to a temp dir.
func startPeer(t *testing.T, opts peer.Options) *peer.Server {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.Offer == nil { // prefers Protobuf: a CBOR client still gets CBOR (profile 1)
		o := peer.DefaultOffer(true)
		opts.Offer = &o
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 5 * time.Second
	}
	s, err := peer.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

type result struct {
	h     *wire.EntityHeader
	data  []byte // nil when the recorder only hashes (hashOnly)
	sum   [32]byte
	n     int64
	err   error
	parts int // a streamed result (profile 4.3.1): its part count
}

// partsAsm assembles a streamed result's parts in part order (their
// streams may be handled in any order).
type partsAsm struct {
	next int
	n    int64
	hash hash.Hash
	data []byte
	err  error
}

// recorder is the test client's quicpeer.Handler: it records everything.
type recorder struct {
	mu       sync.Mutex
	changed  chan struct{}
	statuses []wire.StatusFrame
	digests  []wire.ScopeDigestFrame
	barriers []wire.BarrierFrame
	control  []string // stream 0 frames in arrival order: "STATUS DEHYDRATING 1@0", "BARRIER 1 1 waiting", "DIGEST 1"
	results  map[uint32]result
	asm      map[uint32]*partsAsm // streamed results being received, by root
	goaways  []wire.GoAwayFrame
	hashOnly bool // results are hashed while read, not kept (large documents)
	closed   bool
	closeErr error
}

func newRecorder() *recorder {
	return &recorder{changed: make(chan struct{}), results: map[uint32]result{}, asm: map[uint32]*partsAsm{}}
}

func (r *recorder) note(f func()) {
	r.mu.Lock()
	f()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) HandleStatus(_ *quicpeer.Session, f wire.StatusFrame) {
	f.Ext = slices.Clone(f.Ext)
	r.note(func() {
		r.statuses = append(r.statuses, f)
		r.control = append(r.control, fmt.Sprintf("STATUS %s %d@%d", f.Status, f.EntityID, f.ScopeID))
	})
}
func (r *recorder) HandleScopeDigest(_ *quicpeer.Session, f wire.ScopeDigestFrame) {
	r.note(func() {
		r.digests = append(r.digests, f)
		r.control = append(r.control, fmt.Sprintf("DIGEST %d", f.ScopeID))
	})
}
func (r *recorder) HandleBarrier(_ *quicpeer.Session, f wire.BarrierFrame) {
	r.note(func() {
		r.barriers = append(r.barriers, f)
		st := "waiting"
		if f.Released {
			st = "released"
		}
		r.control = append(r.control, fmt.Sprintf("BARRIER %d %d %s", f.ScopeID, f.ParentEntityID, st))
	})
}
func (r *recorder) HandleCheckpoint(*quicpeer.Session, *wire.CheckpointFrame) {}
func (r *recorder) HandleGoAway(_ *quicpeer.Session, f wire.GoAwayFrame) {
	r.note(func() { r.goaways = append(r.goaways, f) })
}
func (r *recorder) HandleEntity(_ *quicpeer.Session, e *quicpeer.IncomingEntity) {
	r.mu.Lock()
	hashOnly := r.hashOnly
	r.mu.Unlock()
	if e.Header.Metadata[peer.MetaRole] == "result-part" {
		r.resultPart(e, hashOnly)
		return
	}
	if e.Header.Metadata[peer.MetaResultParts] != "" {
		r.resultSummary(e, hashOnly)
		return
	}
	res := result{h: e.Header}
	if hashOnly {
		h := sha256.New()
		res.n, res.err = io.Copy(h, e.Payload)
		h.Sum(res.sum[:0])
	} else {
		res.data, res.err = io.ReadAll(e.Payload)
		res.sum, res.n = sha256.Sum256(res.data), int64(len(res.data))
	}
	r.note(func() { r.results[e.Header.EntityID] = res })
}

// partsTurn is a snapshot, taken under recorder.mu, of a streamed result's
// assembly when a part's turn came.
type partsTurn struct {
	a    *partsAsm
	next int
	n    int64
	data []byte
	err  error
}

// turn waits until part k of root's streamed result is next (or the
// assembly failed, or k is no part index) and returns its assembly with a
// snapshot of its state. Only the goroutine whose k is next touches the
// hash until it calls note; every other field changes under recorder.mu.
func (r *recorder) turn(root uint32, k int) partsTurn {
	for {
		r.mu.Lock()
		a := r.asm[root]
		if a == nil {
			a = &partsAsm{hash: sha256.New()}
			r.asm[root] = a
		}
		if a.next == k || a.err != nil || k < 0 || r.closed {
			t := partsTurn{a: a, next: a.next, n: a.n, data: a.data, err: a.err}
			r.mu.Unlock()
			return t
		}
		ch := r.changed
		r.mu.Unlock()
		<-ch
	}
}

// resultPart appends a result part (profile 4.3.1) in part order.
func (r *recorder) resultPart(e *quicpeer.IncomingEntity, hashOnly bool) {
	h := e.Header
	k := -1
	if h.ChunkInfo != nil {
		k = int(h.ChunkInfo.ChunkIndex)
	}
	t := r.turn(h.EntityID, k)
	var err error
	var m int64
	var buf bytes.Buffer
	switch {
	case t.err != nil:
		_, _ = io.Copy(io.Discard, e.Payload)
	case k < 0 || t.next != k || h.ChunkInfo.ChunkOffset != uint64(t.n):
		err = fmt.Errorf("result part %d has chunk-info %+v, the parts before it end at %d", k, h.ChunkInfo, t.n)
		_, _ = io.Copy(io.Discard, e.Payload)
	default:
		w := io.Writer(t.a.hash)
		if !hashOnly {
			w = io.MultiWriter(t.a.hash, &buf)
		}
		m, err = io.Copy(w, e.Payload) // the session checks the part's length and checksum
	}
	a := t.a
	r.note(func() {
		if err != nil && a.err == nil {
			a.err = err
		}
		a.n += m
		a.data = append(a.data, buf.Bytes()...)
		a.next++
	})
}

// resultSummary completes a streamed result once all its parts are in.
func (r *recorder) resultSummary(e *quicpeer.IncomingEntity, hashOnly bool) {
	h := e.Header
	_, _ = io.Copy(io.Discard, e.Payload)
	parts, _ := strconv.Atoi(h.Metadata[peer.MetaResultParts])
	t := r.turn(h.EntityID, parts)
	res := result{h: h, data: t.data, n: t.n, err: t.err, parts: parts}
	t.a.hash.Sum(res.sum[:0])
	if res.err == nil && (h.PayloadLength != 0 || h.Metadata[peer.MetaResultLength] != strconv.FormatInt(t.n, 10) ||
		h.Metadata[peer.MetaResultSHA256] != hex.EncodeToString(res.sum[:])) {
		res.err = fmt.Errorf("summary %d payload octets, metadata %v; the %d parts hold %d octets %x", h.PayloadLength, h.Metadata, parts, t.n, res.sum)
	}
	if !hashOnly && res.data == nil {
		res.data = []byte{}
	}
	r.note(func() {
		delete(r.asm, h.EntityID)
		r.results[h.EntityID] = res
	})
}

func (r *recorder) HandleClose(_ *quicpeer.Session, err error) {
	r.note(func() { r.closed, r.closeErr = true, err })
}

// waitFor blocks until cond (called under the lock) holds.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		ok, ch := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s; statuses: %s", what, fmtStatuses(r.statuses))
		}
	}
}

func fmtStatuses(fs []wire.StatusFrame) string {
	var b bytes.Buffer
	for _, f := range fs {
		b.WriteString(" ")
		b.WriteString(f.Status.String())
		b.WriteString("(")
		b.WriteString(itoa(f.EntityID))
		if f.ScopeID != 0 {
			b.WriteString("@" + itoa(f.ScopeID))
		}
		b.WriteString(")")
	}
	return b.String()
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func (r *recorder) historyLocked(scope, id uint32) []wire.Status {
	var out []wire.Status
	for _, f := range r.statuses {
		if f.ScopeID == scope && f.EntityID == id {
			out = append(out, f.Status)
		}
	}
	return out
}

// history is the sequence of statuses the peer sent for (scope, id).
func (r *recorder) history(scope, id uint32) []wire.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []wire.Status
	for _, f := range r.statuses {
		if f.ScopeID == scope && f.EntityID == id {
			out = append(out, f.Status)
		}
	}
	return out
}

func (r *recorder) lastLocked(scope, id uint32) (wire.StatusFrame, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last(scope, id)
}

func (r *recorder) last(scope, id uint32) (wire.StatusFrame, bool) {
	for i := len(r.statuses) - 1; i >= 0; i-- {
		if f := r.statuses[i]; f.ScopeID == scope && f.EntityID == id {
			return f, true
		}
	}
	return wire.StatusFrame{}, false
}

// waitStatus waits until the last status of root-scope entity id is st.
func (r *recorder) waitStatus(t *testing.T, id uint32, st wire.Status) wire.StatusFrame {
	t.Helper()
	var f wire.StatusFrame
	r.waitFor(t, "entity "+itoa(id)+" "+st.String(), func() bool {
		var ok bool
		f, ok = r.last(0, id)
		return ok && f.Status == st
	})
	return f
}

func (r *recorder) waitResult(t *testing.T, id uint32) result {
	t.Helper()
	var res result
	r.waitFor(t, "result of "+itoa(id), func() bool {
		var ok bool
		res, ok = r.results[id]
		return ok
	})
	if res.err != nil {
		t.Fatalf("result stream of %d: %v", id, res.err)
	}
	if res.parts == 0 && !bytes.Equal(res.h.Checksum, res.sum[:]) || res.h.Metadata[peer.MetaRole] != "result" {
		t.Fatalf("result header %+v: checksum or role wrong", res.h)
	}
	return res
}

type client struct {
	sess   *quicpeer.Session
	rec    *recorder
	format wire.Format
}

// dial opens a client session to srv preferring format.
func dial(t *testing.T, srv *peer.Server, format wire.Format, offer *wire.Capabilities) *client {
	t.Helper()
	return dialWith(t, srv, format, offer, nil)
}

// dialWith is dial with cfg adjusting the client's config (nil: none).
func dialWith(t *testing.T, srv *peer.Server, format wire.Format, offer *wire.Capabilities, cfg func(*quicpeer.Config)) *client {
	t.Helper()
	tlsConf, err := quicpeer.ClientTLS(srv.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	o := peer.DefaultOffer(format == wire.FormatProtobuf)
	if offer != nil {
		o = *offer
	}
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	qc := quicpeer.Config{TLS: tlsConf, Offer: o, Handler: rec, Logger: testLogger(t)}
	if cfg != nil {
		cfg(&qc)
	}
	sess, err := quicpeer.Dial(ctx, srv.Addr().String(), qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.CloseWithError(wire.CodeNoError, "test done")
		<-sess.Done()
	})
	if got := sess.Negotiated().Format; got != format {
		t.Fatalf("negotiated format %s, want %s", got, format)
	}
	return &client{sess: sess, rec: rec, format: format}
}

func (c *client) assign(t *testing.T) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, err := c.sess.AssignID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// send sends a profile entity: it marks h with pipestream.profile = 1
// (profile 4) and sends it.
func (c *client) send(t *testing.T, h *wire.EntityHeader, payload []byte) error {
	t.Helper()
	h.Metadata = profileMD(h.Metadata)
	return c.sendPlain(t, h, payload)
}

// profileMD returns md with the profile marker (a copy; md is not changed).
func profileMD(md map[string]string) map[string]string {
	out := make(map[string]string, len(md)+1)
	for k, v := range md {
		out[k] = v
	}
	out[peer.MetaProfile] = peer.ProfileVersion
	return out
}

// sendPlain sends h as it is (no profile marker unless h has one), with
// payload-length and checksum set from payload.
func (c *client) sendPlain(t *testing.T, h *wire.EntityHeader, payload []byte) error {
	t.Helper()
	sum := sha256.Sum256(payload)
	h.PayloadLength, h.Checksum = uint64(len(payload)), sum[:]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.sess.SendEntity(ctx, h, bytes.NewReader(payload))
}

func (c *client) envelope(t *testing.T, id uint32, blob []byte) []byte {
	t.Helper()
	b, err := wire.CodecFor(c.format).MarshalPipeDoc(&wire.PipeDoc{DocID: "doc-" + itoa(id), EntityID: id,
		Ownership: &wire.OwnershipContext{OwnerID: "tenant"}, Blob: blob})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendWhole sends a document whole (profile 4.1) and returns its root ID.
func (c *client) sendWhole(t *testing.T, content string, md map[string]string, pol *wire.CompletionPolicy) uint32 {
	t.Helper()
	id := c.assign(t)
	h := &wire.EntityHeader{EntityID: id, ContentType: "text/plain", Metadata: md, CompletionPolicy: pol}
	if err := c.send(t, h, c.envelope(t, id, []byte(content))); err != nil {
		t.Fatal(err)
	}
	return id
}

// sendDehydrated sends chunks as children, in the order given by
// rootFirst: false sends every child before DEHYDRATING and the root
// envelope (the orphan case). It returns the root and child IDs.
func (c *client) sendDehydrated(t *testing.T, chunks []string, md map[string]string, pol *wire.CompletionPolicy, rootFirst bool) (uint32, []uint32) {
	t.Helper()
	root := c.assign(t)
	if pol != nil {
		c.sess.SetPolicy(root, pol)
	}
	ids := make([]uint32, len(chunks))
	for i := range chunks {
		ids[i] = c.assign(t)
	}
	announce := func() {
		if err := c.sess.SendStatus(wire.StatusFrame{Status: wire.StatusDehydrating, EntityID: root}); err != nil {
			t.Fatal(err)
		}
	}
	total, off := 0, 0
	content := sha256.New()
	for _, ch := range chunks {
		total += len(ch)
		content.Write([]byte(ch))
	}
	sendRoot := func() {
		rmd := map[string]string{peer.MetaTotalChunks: itoa(uint32(len(chunks))), peer.MetaContentLength: itoa(uint32(total)),
			peer.MetaContentSHA256: hex.EncodeToString(content.Sum(nil))}
		for k, v := range md {
			rmd[k] = v
		}
		h := &wire.EntityHeader{EntityID: root, ContentType: "text/plain", Metadata: rmd, CompletionPolicy: pol}
		if err := c.send(t, h, c.envelope(t, root, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if rootFirst {
		announce()
	}
	cmd := map[string]string{peer.MetaAcceptResultParts: "1"} // as the gateway sends children
	for k, v := range md {
		cmd[k] = v
	}
	for i := len(chunks) - 1; i >= 0; i-- { // reverse order: out-of-order arrival
		p := root
		h := &wire.EntityHeader{EntityID: ids[i], ParentID: &p, ContentType: "text/plain", Metadata: cmd,
			ChunkInfo: &wire.ChunkInfo{TotalChunks: uint64(len(chunks)), ChunkIndex: uint64(i), ChunkOffset: uint64(off)}}
		if err := c.send(t, h, []byte(chunks[i])); err != nil {
			t.Fatal(err)
		}
	}
	if !rootFirst {
		// wait until every child was processed before announcing the root
		for _, id := range ids {
			c.rec.waitFor(t, "child settled", func() bool {
				f, ok := c.rec.last(0, id)
				return ok && f.Status != wire.StatusProcessing
			})
		}
		announce()
	}
	sendRoot()
	return root, ids
}
