package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The interop partners checked against each other and against the frozen
// reference bytes, independently of the product: if these pass, a failure
// of interop_test.go is the gateway's, not the partner's.

// vectorsDir is the repository's frozen copy of the reference vectors,
// quicpeer/wire/testdata/vectors (identical to ../shared/vectors; a clean
// clone has only the copy); E2E_VECTORS overrides it. The files are read
// as data: nothing of quicpeer is imported.
func vectorsDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("E2E_VECTORS"); d != "" {
		return d
	}
	gomod := goEnv("GOMOD")
	d := filepath.Join(filepath.Dir(gomod), "quicpeer", "wire", "testdata", "vectors")
	if _, err := os.Stat(filepath.Join(d, "index.tsv")); err != nil {
		t.Fatalf("the frozen vectors are not at %s (set E2E_VECTORS): %v", d, err)
	}
	return d
}

// vectorRow is one row of vectors/index.tsv.
type vectorRow struct {
	name, expectation, errName string
	bytes                      []byte
}

func vectorFolder(name string) string {
	switch {
	case strings.HasPrefix(name, "entity-"):
		return "entity"
	case strings.HasPrefix(name, "status-"), strings.HasPrefix(name, "goaway"):
		return "draft04-fixed-frames"
	}
	return "control-cbor"
}

// loadVectors reads index.tsv and every .bin it lists (checking the file
// against the row's hex).
func loadVectors(t *testing.T) []vectorRow {
	t.Helper()
	dir := vectorsDir(t)
	var rows []vectorRow
	for _, line := range strings.Split(readFile(t, filepath.Join(dir, "index.tsv")), "\n") {
		f := strings.Split(line, "\t")
		if strings.HasPrefix(line, "#") || len(f) < 6 || f[0] == "name" {
			continue
		}
		want, err := hex.DecodeString(f[5])
		if err != nil {
			t.Fatalf("index.tsv %s: %v", f[0], err)
		}
		p := filepath.Join(dir, vectorFolder(f[0]), f[1]+"-"+f[0]+".bin")
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("vector %s: file %s differs from index.tsv (%v)", f[0], p, err)
		}
		rows = append(rows, vectorRow{name: f[0], expectation: f[1], errName: f[2], bytes: got})
	}
	if len(rows) < 30 {
		t.Fatalf("only %d vectors in index.tsv", len(rows))
	}
	return rows
}

// decodeVectorStrict decodes a vector the way the reference's test does
// (decode_named): entities whole, everything else as one draft-04 frame.
func decodeVectorStrict(name string, b []byte) error {
	if strings.HasPrefix(name, "entity-") {
		_, err := decodeEntityStrict(b)
		return err
	}
	fr, err := decodeUCFD04(b)
	if err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(name, "capabilities-"), strings.HasPrefix(name, "cbor-"):
		_, err = decodeCapsStrict(fr.f)
	case strings.HasPrefix(name, "status-"):
		_, err = decodeStatusStrict(fr.f)
	case strings.HasPrefix(name, "goaway"):
		_, err = decodeGoaway(fr.f)
	case strings.HasPrefix(name, "checkpoint-"):
		_, err = decodeCheckpointStrict(fr.f)
	}
	return err
}

// TestInteropPartnerVectors: the draft-04 partners' decoders give every
// frozen vector the outcome the reference suite expects, the encoders
// reproduce the valid vectors byte for byte, and the draft-02 partners
// read what draft-02 shares.
func TestInteropPartnerVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		err := decodeVectorStrict(v.name, v.bytes)
		switch {
		case v.expectation == "valid" && err != nil:
			t.Errorf("%s: valid vector refused: %v", v.name, err)
		case v.expectation != "valid" && errName(err) != v.errName:
			t.Errorf("%s: got %q (%v), want %s", v.name, errName(err), err, v.errName)
		}
	}
	checkVectorEncoders(t)
	checkVectorsDraft02(t)
}

func checkVectorEncoders(t *testing.T) {
	dir := vectorsDir(t)
	vec := func(folder, name string) []byte {
		return []byte(readFile(t, filepath.Join(dir, folder, "valid-"+name+".bin")))
	}
	payload := []byte("PipeStream Layer 0\n")
	const ct = "text/plain; charset=utf-8"
	eight := uint32(8)
	cp := checkpointMsg{ID: "entity-7", Seq: 1, EntityID: 8, Flags: ptr(uint8(0))}
	ack := cp
	ack.Flags = ptr(uint8(1))
	for _, c := range []struct {
		name string
		got  []byte
		want []byte
	}{
		{"capabilities-default", varFrame(ftCaps, mustCBOR(referenceCaps())), vec("control-cbor", "capabilities-default")},
		{"checkpoint-request", varFrame(ftCheckpoint, mustCBOR(cp)), vec("control-cbor", "checkpoint-request")},
		{"checkpoint-ack", varFrame(ftCheckpoint, mustCBOR(ack)), vec("control-cbor", "checkpoint-ack")},
		{"status-heartbeat", encodeStatus(framingD04, connLevel, stUnspecified, nil), vec("draft04-fixed-frames", "status-heartbeat")},
		{"status-pending", encodeStatus(framingD04, 7, stPending, nil), vec("draft04-fixed-frames", "status-pending")},
		{"status-processing", encodeStatus(framingD04, 7, stProcessing, nil), vec("draft04-fixed-frames", "status-processing")},
		{"status-complete", encodeStatus(framingD04, 7, stComplete, nil), vec("draft04-fixed-frames", "status-complete")},
		{"status-cursor", encodeStatus(framingD04, connLevel, stUnspecified, &eight), vec("draft04-fixed-frames", "status-cursor")},
		{"goaway", encodeGoaway(framingD04, 7), vec("draft04-fixed-frames", "goaway")},
		{"entity-text", referenceEntity(7, nil, payload, ct), vec("entity", "entity-text")},
		{"entity-child", referenceEntity(8, ptr(uint32(7)), payload, ct), vec("entity", "entity-child")},
		{"entity-text (draft-02 encoder)", plainEntity(entityHeader{EntityID: 7, ContentType: ct}, payload), vec("entity", "entity-text")},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("encoder for %s:\n got %x\nwant %x", c.name, c.got, c.want)
		}
	}
}

// checkVectorsDraft02: the shared entities decode leniently (an unknown
// member is tolerated under draft-02); draft-04 fixed frames mapped back
// to draft-02 read the same through the draft-02 frame reader.
func checkVectorsDraft02(t *testing.T) {
	dir := vectorsDir(t)
	for _, name := range []string{"valid-entity-text", "valid-entity-child", "invalid-entity-unknown-field"} {
		e, err := decodeEntityLenient([]byte(readFile(t, filepath.Join(dir, "entity", name+".bin"))))
		if err != nil || string(e.payload) != "PipeStream Layer 0\n" || e.hdr.EntityID < 7 {
			t.Errorf("draft-02 decode of %s: %v %+v", name, err, e.hdr)
		}
	}
	for _, name := range []string{"status-heartbeat", "status-pending", "status-processing", "status-complete", "status-cursor", "goaway", "goaway-reserved"} {
		b := []byte(readFile(t, filepath.Join(dir, "draft04-fixed-frames", "valid-"+name+".bin")))
		d04, err := decodeUCFD04(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d02, err := readFrameD02(bytes.NewReader(append([]byte{b[0]}, d04.f...)))
		if err != nil || !bytes.Equal(d02.f, d04.f) {
			t.Errorf("%s mapped to draft-02 reads back %x (%v), want %x", name, d02.f, err, d04.f)
		}
		if d04.typ == ftStatus {
			s1, e1 := decodeStatusLenient(d02.f)
			s2, e2 := decodeStatusStrict(d04.f)
			if e1 != nil || e2 != nil || s1 != s2 {
				t.Errorf("%s: draft-02 %v (%v) vs draft-04 %v (%v)", name, s1, e1, s2, e2)
			}
		}
	}
}

// TestInteropPartnersDraft02: the plain draft-02 client against the plain
// draft-02 peer: whole entities of several sizes, 50 concurrent, a
// dehydrated parent (the peer answers each child; it never reports the
// parent), and the refusing and stalling variants.
func TestInteropPartnersDraft02(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, time.Minute)
	p := startD02Peer(t, peerEcho)
	c, err := dialD02Client(ctx, p.addr, p.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for _, n := range []int{0, 1 << 10, 3 << 20} {
		in := textCorpus(n)
		id, res, err := c.roundTrip(ctx, in, "text/plain", nil)
		if err != nil {
			t.Fatalf("%d octets: %v", n, err)
		}
		if res.hdr.ParentID == nil || *res.hdr.ParentID != id || res.hdr.EntityID < peerResultBase || !bytes.Equal(res.payload, bytes.ToUpper(in)) {
			t.Errorf("%d octets: result %+v (%d octets)", n, res.hdr, len(res.payload))
		}
	}
	partnerConcurrent(ctx, t, c, 50)
	partnerDehydrate(ctx, t, c, p)
	if _, statusIn, offered, errs, _ := p.snapshot(); len(errs) > 0 || len(offered) != 1 || len(statusIn) == 0 {
		t.Errorf("peer: errors %v, offered %v, statuses %v", errs, offered, statusIn)
	}
	if errs := c.protocolErrors(); len(errs) > 0 {
		t.Errorf("client protocol errors: %v", errs)
	}
	partnerVariants(ctx, t)
}

func partnerConcurrent(ctx context.Context, t *testing.T, c *d02Client, n int) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := binaryData(4096+i, uint64(i))
			if _, res, err := c.roundTrip(ctx, in, "application/octet-stream", nil); err != nil || !bytes.Equal(res.payload, bytes.ToUpper(in)) {
				errs <- fmt.Errorf("concurrent %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func partnerDehydrate(ctx context.Context, t *testing.T, c *d02Client, p *d02Peer) {
	r := c.newID()
	if err := c.sendStatus(r, stDehydrating); err != nil {
		t.Fatal(err)
	}
	kids := []uint32{c.newID(), c.newID()}
	for i, id := range kids {
		h := entityHeader{EntityID: id, ParentID: ptr(r), ContentType: "text/plain", ChunkInfo: &chunkInfo{Total: 2, Index: uint64(i), Offset: uint64(i * 3)}}
		if err := c.sendEntity(ctx, h, []byte("abc")); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range kids {
		if res, err := c.awaitResult(ctx, id); err != nil || string(res.payload) != "ABC" {
			t.Errorf("child %d: %v %q", id, err, res.payload)
		}
	}
	if err := p.wait(ctx, "DEHYDRATING at the peer", func() bool {
		for _, s := range p.statusIn {
			if s.entity == r && s.stat == stDehydrating {
				return true
			}
		}
		return false
	}); err != nil {
		t.Error(err)
	}
	if ss := c.statusesOf(r); len(ss) != 0 {
		t.Errorf("the peer reported the parent: %v", namesOf(ss))
	}
}

func partnerVariants(ctx context.Context, t *testing.T) {
	ref := startD02Peer(t, peerRefuse)
	if _, err := dialD02Client(ctx, ref.addr, ref.caPEM); err == nil {
		t.Error("the refusing peer completed a handshake")
	} else if code, remote := closeCode(err); code != errLayerUnsupported || !remote {
		t.Errorf("refusing peer: %v, want a close with 0x0C", err)
	}
	if err := ref.wait(ctx, "the refusal", func() bool { return ref.conns == 1 && len(ref.offered) == 1 }); err != nil {
		t.Error(err)
	}
	st := startD02Peer(t, peerStall)
	c, err := dialD02Client(ctx, st.addr, st.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	id := c.newID()
	if err := c.sendEntity(ctx, entityHeader{EntityID: id, ContentType: "text/plain"}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.wait(ctx, "PROCESSING from the stalling peer", func() bool { return len(c.statuses[id]) > 0 }); err != nil {
		t.Fatal(err)
	}
	if ss := c.statusesOf(id); len(ss) != 1 || ss[0] != stProcessing {
		t.Errorf("stalling peer: %v", namesOf(ss))
	}
}

// TestInteropPartnersDraft04: the reference client conversation against
// the reference server conversation, then the server's refusals: an
// unknown CAPABILITIES member (0x0D) and draft-02 framing after
// CAPABILITIES (a STATUS read as a 5-octet header: length over 1 MiB,
// 0x06).
func TestInteropPartnersDraft04(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, time.Minute)
	s := startD04Server(t)
	in := []byte("PipeStream Layer 0\n")
	rep, err := runD04Client(ctx, s.addr, s.caPEM, 7, in, "text/plain; charset=utf-8")
	if err != nil {
		t.Fatalf("reference conversation: %v (server: %s)", err, errorsText(s.errs))
	}
	if rep.goaway != 7 || len(rep.statuses) != 2 || *rep.ack.Flags != checkpointAck {
		t.Errorf("client report %+v", rep)
	}
	big := binaryData(2<<20, 9)
	if _, err := runD04Client(ctx, s.addr, s.caPEM, 1, big, "application/octet-stream"); err != nil {
		t.Fatalf("reference conversation, 2 MiB: %v (server: %s)", err, errorsText(s.errs))
	}
	if err := s.wait(ctx, "the sessions", func() bool { return len(s.sessions) == 2 }); err != nil {
		t.Fatal(err)
	}
	sess, _, _ := s.snapshot()
	if !bytes.Equal(sess[1].entity.payload, big) {
		t.Errorf("2 MiB entity: server got %d octets", len(sess[1].entity.payload))
	}
	e := sess[0].entity
	if !bytes.Equal(e.payload, in) || len(e.keys) != 5 || sess[0].checkpoint == nil || sess[0].cursor != 8 {
		t.Errorf("server session %+v keys %v", sess[0], e.keys)
	}
	refusal := func(what string, frames ...[]byte) {
		conn, err := dialPartner(ctx, s.addr, s.caPEM)
		if err != nil {
			t.Fatal(err)
		}
		ctl, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames {
			_, _ = ctl.Write(f)
		}
		<-conn.Context().Done()
		code, remote := closeCode(context.Cause(conn.Context()))
		want := map[string]int64{"unknown member": errFrame, "draft-02 framing": errLimitExceeded}[what]
		if code != want || !remote {
			t.Errorf("%s: closed with %d (remote %v), want %d", what, code, remote, want)
		}
	}
	extra := append(mustCBOR(referenceCaps())[:0:0], mustCBOR(referenceCaps())...)
	extra[0]++ // a map of seven: append one member
	extra = append(extra, mustCBOR("pipestream-profile")...)
	extra = append(extra, 0x01)
	refusal("unknown member", varFrame(ftCaps, extra))
	refusal("draft-02 framing", varFrame(ftCaps, mustCBOR(referenceCaps())), encodeStatus(framingD02, connLevel, stUnspecified, nil))
	if err := s.wait(ctx, "the two refusals recorded", func() bool { return len(s.errs) == 2 }); err != nil {
		t.Error(err)
	}
}
