package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"time"

	"github.com/quic-go/quic-go"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
)

// bulk measures one large document (Options.BulkBytes) over REST
// (POST /v1/documents:upload, raw body) and gRPC (UploadDocument), each
// timed from the first byte sent to SUCCEEDED seen on a watch, against a
// raw quic-go stream copy and a bare grpc-go TLS client-stream upload of
// the same bytes.
func (b *runner) bulk(ctx context.Context) error {
	n := b.o.BulkBytes
	mb := float64(n) / 1e6
	add := func(path string, base bool, secs float64, ps procStats, ok bool, note string) {
		r := Result{Phase: "bulk", Path: path, Baseline: base, Unit: "MB/s", Rate: mb / secs, Count: n, Seconds: secs, Note: note}
		if !base {
			fill(&r, ps, ok, 0, secs)
		}
		b.add(r)
	}

	b.progress("  raw quic-go stream copy of %s", sizeStr(n))
	secs, err := rawQUICCopy(ctx, n)
	if err != nil {
		return fmt.Errorf("raw quic-go copy: %w", err)
	}
	add("raw quic-go stream (TLS 1.3)", true, secs, procStats{}, false, "")

	b.progress("  raw quic-go echo of %s (there and back at once)", sizeStr(n))
	secs, err = rawQUICEcho(ctx, n)
	if err != nil {
		return fmt.Errorf("raw quic-go echo: %w", err)
	}
	add("raw quic-go echo, there and back (TLS 1.3)", true, secs, procStats{}, false, "")

	b.progress("  bare grpc-go client-stream upload of %s", sizeStr(n))
	secs, err = grpcUpload(ctx, n)
	if err != nil {
		return fmt.Errorf("grpc-go baseline: %w", err)
	}
	add("bare grpc-go stream (TLS 1.3)", true, secs, procStats{}, false, "")

	for _, path := range []struct {
		name, what string
		upload     func(context.Context, int64) (time.Duration, error)
	}{
		{"REST", "upload", b.gw.restUpload},
		{"gRPC", "UploadDocument", b.gw.grpcUpload},
	} {
		b.progress("  gateway %s %s of %s", path.name, path.what, sizeStr(n))
		var start time.Time
		var answered time.Duration // from the upload's answer to SUCCEEDED
		ps, ok, err := b.gw.measure(func() (err error) {
			start = time.Now()
			answered, err = path.upload(ctx, n)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s upload: %w", path.name, err)
		}
		add("gateway "+path.name+" upload -> SUCCEEDED", false, since(start), ps, ok, "")
		b.note("bulk %s: %.2f s from the upload's answer to SUCCEEDED", path.name, answered.Seconds())
	}
	b.ratios("bulk")
	return nil
}

// pattern is n pseudo-random octets: one random 1 MiB block repeated
// (nothing on the path compresses or deduplicates).
type pattern struct {
	block []byte
	off   int
	left  int64
}

var patternBlock = func() []byte {
	b := make([]byte, 1<<20)
	r := rand.NewChaCha8([32]byte{'p', 'i', 'p', 'e'})
	_, _ = r.Read(b)
	return b
}()

func newPattern(n int64) *pattern { return &pattern{block: patternBlock, left: n} }

// writePattern writes n pattern octets to w in chunkBytes writes (the
// write size of every upload path).
func writePattern(w io.Writer, n int64) error {
	buf := make([]byte, chunkBytes)
	src := newPattern(n)
	for {
		k, rerr := io.ReadFull(src, buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return err
			}
		}
		if rerr != nil {
			return nil
		}
	}
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	k := copy(b[:min(int64(len(b)), p.left)], p.block[p.off:])
	p.off = (p.off + k) % len(p.block)
	p.left -= int64(k)
	return k, nil
}

func rawQUICCopy(ctx context.Context, n int64) (float64, error) {
	rq, err := newRawQUIC(ctx)
	if err != nil {
		return 0, err
	}
	defer rq.close()
	start := time.Now()
	st, err := rq.cc.OpenUniStreamSync(ctx)
	if err != nil {
		return 0, err
	}
	if err := writePattern(st, n); err != nil {
		return 0, err
	}
	st.Close()
	if got := <-rq.got; got != n {
		return 0, fmt.Errorf("the receiver read %d of %d octets", got, n)
	}
	return since(start), nil
}

// rawQUICEcho is the transport floor of the gateway's bulk path with a
// peer on the same machine: the content goes to the peer and the result
// (as large, for passthrough) comes back over the same connection while
// the upload goes on (streamed results, docs/profile.md 4.3.1). Here n
// octets cross one loopback quic-go connection there and back at once (a
// bidirectional stream the server echoes), timed until the last echoed
// octet is read.
func rawQUICEcho(ctx context.Context, n int64) (float64, error) {
	cert, pemCert, err := quicpeer.SelfSignedCert()
	if err != nil {
		return 0, err
	}
	ctls, err := quicpeer.ClientTLS(pemCert)
	if err != nil {
		return 0, err
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", quicpeer.ServerTLS(cert), &quic.Config{})
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		sc, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		st, err := sc.AcceptStream(ctx)
		if err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			k, rerr := st.Read(buf)
			if k > 0 {
				if _, err := st.Write(buf[:k]); err != nil {
					return
				}
			}
			if rerr != nil {
				break
			}
		}
		st.Close()
		<-sc.Context().Done() // the client reads the echo to EOF, then closes
	}()
	cc, err := quic.DialAddr(ctx, ln.Addr().String(), ctls, &quic.Config{})
	if err != nil {
		return 0, err
	}
	defer func() {
		cc.CloseWithError(0, "")
		<-served
	}()
	start := time.Now()
	st, err := cc.OpenStreamSync(ctx)
	if err != nil {
		return 0, err
	}
	wrote := make(chan error, 1)
	go func() {
		if err := writePattern(st, n); err != nil {
			wrote <- err
			return
		}
		wrote <- st.Close()
	}()
	got, err := io.CopyBuffer(io.Discard, st, make([]byte, 64<<10))
	if werr := <-wrote; err == nil {
		err = werr
	}
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("the echo returned %d of %d octets", got, n)
	}
	return since(start), nil
}

func grpcUpload(ctx context.Context, n int64) (float64, error) {
	g, err := newGRPCBaseline(true)
	if err != nil {
		return 0, err
	}
	defer g.close()
	// Connect first: the handshake is not part of the copy.
	if err := g.conn.Invoke(ctx, unaryMethod, new([]byte), new([]byte)); err != nil {
		return 0, err
	}
	start := time.Now()
	st, err := g.conn.NewStream(ctx, &baselineDesc.Streams[0], uploadMethod)
	if err != nil {
		return 0, err
	}
	src := newPattern(n)
	for {
		// grpc-go may still read a message after SendMsg returns (the raw
		// codec hands it the slice itself), so every message gets its own
		// buffer: the same one copy a protobuf Marshal would make.
		buf := make([]byte, chunkBytes)
		k, rerr := io.ReadFull(src, buf)
		if k > 0 {
			m := buf[:k]
			if err := st.SendMsg(&m); err != nil {
				return 0, err
			}
		}
		if rerr != nil {
			break
		}
	}
	if err := st.CloseSend(); err != nil {
		return 0, err
	}
	var out []byte
	if err := st.RecvMsg(&out); err != nil {
		return 0, err
	}
	if len(out) != 8 || int64(binary.BigEndian.Uint64(out)) != n {
		return 0, fmt.Errorf("the server counted %x, want %d octets", out, n)
	}
	return since(start), nil
}

// restUpload posts n octets to /v1/documents:upload and waits for
// SUCCEEDED on the REST watch stream.
// restUpload uploads n octets over REST and follows the document to
// SUCCEEDED; it returns the time from the upload's answer to SUCCEEDED.
func (g *gatewayProc) restUpload(ctx context.Context, n int64) (time.Duration, error) {
	u := "http://" + g.httpAddr + "/v1/documents:upload?contentType=application%2Foctet-stream&displayName=bench-bulk"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, newPattern(n))
	if err != nil {
		return 0, err
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/octet-stream")
	g.authorize(req)
	var doc struct {
		ID string `json:"id"`
	}
	if err := g.doJSON(req, &doc); err != nil {
		return 0, err
	}
	answered := time.Now()
	err = g.restWatch(ctx, doc.ID)
	return time.Since(answered), err
}

// doJSON runs req and decodes a 200 JSON answer into v.
func (g *gatewayProc) doJSON(req *http.Request, v any) error {
	resp, err := g.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("%s %s: HTTP %d: %s", req.Method, req.URL.Path, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// restWatch follows GET /v1/documents/{id}:watch (NDJSON) until the
// document is terminal; anything but SUCCEEDED is an error.
func (g *gatewayProc) restWatch(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.httpAddr+"/v1/documents/"+url.PathEscape(id)+":watch", nil)
	if err != nil {
		return err
	}
	g.authorize(req)
	resp, err := g.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return fmt.Errorf("watch %s: HTTP %d: %s", id, resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var line struct {
			Result *struct {
				Document *struct {
					State string `json:"state"`
					Error string `json:"error"`
				} `json:"document"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return fmt.Errorf("watch %s: %w", id, err)
		}
		if line.Error != nil {
			return fmt.Errorf("watch %s: %s", id, line.Error.Message)
		}
		if line.Result == nil || line.Result.Document == nil {
			continue
		}
		switch s := line.Result.Document.State; s {
		case "SUCCEEDED":
			return nil
		case "PARTIALLY_SUCCEEDED", "FAILED", "CANCELLED":
			return fmt.Errorf("document %s ended %s: %s", id, s, line.Result.Document.Error)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("watch %s: %w", id, err)
	}
	return fmt.Errorf("watch %s ended before the document was terminal", id)
}

// grpcUpload streams n octets through UploadDocument and waits for
// SUCCEEDED on WatchDocument.
// grpcUpload is restUpload over gRPC UploadDocument.
func (g *gatewayProc) grpcUpload(ctx context.Context, n int64) (time.Duration, error) {
	st, err := g.docs.UploadDocument(g.ctx(ctx))
	if err != nil {
		return 0, err
	}
	if err := st.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "application/octet-stream", DisplayName: "bench-bulk"}}); err != nil {
		return 0, err
	}
	buf := make([]byte, chunkBytes)
	src := newPattern(n)
	for {
		k, rerr := io.ReadFull(src, buf)
		if k > 0 {
			if err := st.Send(&gatewayv1.UploadDocumentRequest{Chunk: buf[:k]}); err != nil {
				break // the answer below says why
			}
		}
		if rerr != nil {
			break
		}
	}
	doc, err := st.CloseAndRecv()
	if err != nil {
		return 0, err
	}
	answered := time.Now()
	err = g.grpcWatch(ctx, doc.GetId())
	return time.Since(answered), err
}

// grpcWatch follows WatchDocument until the document is terminal.
func (g *gatewayProc) grpcWatch(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	ws, err := g.docs.WatchDocument(g.ctx(ctx), &gatewayv1.WatchDocumentRequest{Id: id})
	if err != nil {
		return err
	}
	for {
		m, err := ws.Recv()
		if err != nil {
			return fmt.Errorf("watch %s: %w", id, err)
		}
		if err := terminal(id, m.GetDocument().GetState(), m.GetDocument().GetError()); err != errNotTerminal {
			return err
		}
	}
}

var errNotTerminal = fmt.Errorf("not terminal")

// terminal is nil for SUCCEEDED, errNotTerminal while running, else why.
func terminal(id string, s gatewayv1.State, msg string) error {
	switch s {
	case gatewayv1.State_SUCCEEDED:
		return nil
	case gatewayv1.State_PARTIALLY_SUCCEEDED, gatewayv1.State_FAILED, gatewayv1.State_CANCELLED:
		return fmt.Errorf("document %s ended %s: %s", id, s, msg)
	}
	return errNotTerminal
}

func sizeStr(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
