package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/gateway"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestRESTUploadStreams pushes 64 MiB from a generator through POST
// /v1/documents:upload. The generator stops after 2 MiB until the bridge has
// received bytes: a handler that buffered the whole body would deadlock here.
func TestRESTUploadStreams(t *testing.T) {
	h := start(t, nil)
	const total = 64 << 20
	pr, pw := io.Pipe()
	genErr := make(chan error, 1)
	go func() {
		block := make([]byte, 64<<10)
		for i := range block {
			block[i] = byte(i)
		}
		for sent := 0; sent < total; sent += len(block) {
			if sent == 2<<20 {
				select {
				case <-h.fake.uploadStarted:
				case <-time.After(20 * time.Second):
					pw.CloseWithError(errors.New("bridge saw no bytes after 2 MiB: the upload is buffered"))
					genErr <- errors.New("bridge saw no bytes after 2 MiB were sent: the handler buffers the body")
					return
				}
			}
			if _, err := pw.Write(block); err != nil {
				genErr <- err
				return
			}
		}
		genErr <- pw.Close()
	}()

	q := "?displayName=big.bin&requestId=r1&split.strategy=fixed_bytes&split.chunkBytes=1048576&split.processor=textstats" +
		"&completionPolicy.mode=QUORUM&completionPolicy.minSuccessRatio=0.5&completionPolicy.onFailure=RETRY&completionPolicy.maxRetries=2&metadata.owner=alice"
	req, _ := http.NewRequest("POST", h.base+"/v1/documents:upload"+q, pr)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := h.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := <-genErr; err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, b)
	}
	if got := h.fake.uploadBytes.Load(); got != total {
		t.Fatalf("bridge received %d bytes, want %d", got, total)
	}
	if reads, maxRead := h.fake.uploadReads.Load(), h.fake.uploadMaxRead.Load(); reads < 64 || maxRead > 256<<10 {
		t.Errorf("bridge got %d reads of at most %d bytes; want many reads of at most one 256 KiB chunk", reads, maxRead)
	}
	checkForwardedOptions(t, b)
}

// checkForwardedOptions checks that the upload's query options reached the
// document TestRESTUploadStreams got back.
func checkForwardedOptions(t *testing.T, b []byte) {
	t.Helper()
	var doc struct {
		SizeBytes, ContentType, DisplayName, RequestId string
		Split                                          struct{ Strategy, ChunkBytes, Processor any }
		CompletionPolicy                               struct {
			Mode, OnFailure string
			MinSuccessRatio float64
			MaxRetries      int
		}
		Metadata map[string]string
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SizeBytes != "67108864" || doc.ContentType != "application/x-ndjson" || doc.DisplayName != "big.bin" || doc.RequestId != "r1" {
		t.Errorf("document %s: options not forwarded", b)
	}
	if doc.Split.Strategy != "SPLIT_FIXED_BYTES" || doc.Split.ChunkBytes != float64(1<<20) || doc.Split.Processor != "textstats" {
		t.Errorf("split options %+v not forwarded: %s", doc.Split, b)
	}
	if doc.CompletionPolicy.Mode != "QUORUM" || doc.CompletionPolicy.OnFailure != "RETRY" || doc.CompletionPolicy.MinSuccessRatio != 0.5 || doc.CompletionPolicy.MaxRetries != 2 {
		t.Errorf("completion policy %+v not forwarded", doc.CompletionPolicy)
	}
	if doc.Metadata["owner"] != "alice" {
		t.Errorf("metadata %v, want owner=alice", doc.Metadata)
	}
}

func TestRESTUploadLimitsAndOptions(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.MaxUploadBytes = 1 << 20 })

	// Chunked body (no Content-Length) over the limit: cut off with 413.
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 64<<10)
		for i := 0; i < 40; i++ {
			if _, err := pw.Write(buf); err != nil {
				return
			}
		}
		pw.Close()
	}()
	code, _, b := h.do("POST", "/v1/documents:upload", pr)
	pr.Close()
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversize: HTTP %d, want 413: %s", code, b)
	}
	if st := decodeStatus(t, b); st.reason() != "TOO_LARGE" || !strings.Contains(st.Message, "--max-upload-bytes") {
		t.Errorf("413 body %s: want reason TOO_LARGE and a message naming the limit", b)
	}

	// Declared Content-Length over the limit: refused before reading.
	code, _, b = h.do("POST", "/v1/documents:upload", strings.NewReader(strings.Repeat("x", 2<<20)))
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("Content-Length oversize: HTTP %d, want 413: %s", code, b)
	}

	// Typos in option names are errors, not silent defaults.
	code, _, b = h.do("POST", "/v1/documents:upload?split.stratgy=lines", strings.NewReader("hi"))
	if st := decodeStatus(t, b); code != 400 || !strings.Contains(st.Message, `unknown query parameter "split.stratgy"`) {
		t.Errorf("HTTP %d %s, want 400 naming the unknown parameter", code, b)
	}
	code, _, b = h.do("POST", "/v1/documents:upload?split.strategy=diagonal", strings.NewReader("hi"))
	if st := decodeStatus(t, b); code != 400 || !strings.Contains(st.Message, "SPLIT_LINES") {
		t.Errorf("HTTP %d %s, want 400 listing the strategies", code, b)
	}

	// Content type defaults to the request's Content-Type.
	code, _, b = h.do("POST", "/v1/documents:upload", strings.NewReader("hello"), "Content-Type", "text/plain")
	if code != 200 || !strings.Contains(string(b), `"contentType":"text/plain"`) {
		t.Errorf("HTTP %d %s, want the document with contentType text/plain", code, b)
	}
}

func TestGRPCUpload(t *testing.T) {
	h := start(t, func(c *gateway.Config) { c.MaxUploadBytes = 1 << 20 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	up, err := h.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = up.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{ContentType: "text/plain", DisplayName: "a.txt"}, Chunk: []byte("hello ")})
	_ = up.Send(&gatewayv1.UploadDocumentRequest{Chunk: []byte("world")})
	doc, err := up.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if doc.GetSizeBytes() != 11 || doc.GetDisplayName() != "a.txt" {
		t.Errorf("document %v, want 11 bytes named a.txt", doc)
	}

	up, err = h.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 256<<10)
	_ = up.Send(&gatewayv1.UploadDocumentRequest{Options: &gatewayv1.SubmitOptions{}})
	for i := 0; i < 5; i++ {
		if up.Send(&gatewayv1.UploadDocumentRequest{Chunk: chunk}) != nil {
			break
		}
	}
	_, err = up.CloseAndRecv()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "upload limit") {
		t.Errorf("oversize gRPC upload: %v, want InvalidArgument naming the upload limit", err)
	}

	up, err = h.docs.UploadDocument(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = up.CloseAndRecv()
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty upload stream: %v, want InvalidArgument", err)
	}
}

// TestRESTUploadBridgeRefusesMidBody: the bridge refuses an upload after
// its first bytes while the client still owes the rest and sends
// nothing. The REST route answers the bridge's error at once: the
// handler's read of the body, blocked on the silent client, is stopped
// (gateway/localupload.go finish), not waited for until the idle timeout
// (an hour here), and the stop is not taken for a stalled body (408).
func TestRESTUploadBridgeRefusesMidBody(t *testing.T) {
	// What the client still owes decides what net/http does with it: above
	// 256 KiB it gives up on the connection, below it reads the rest
	// before answering; both must answer at once and close.
	for _, tc := range []struct {
		name  string
		total int
	}{{"rest above net/http's drain", 1000000}, {"rest below net/http's drain", 400 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, func(c *gateway.Config) { c.UploadIdleTimeout = time.Hour })
			conn, err := net.Dial("tcp", h.srv.HTTPAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			part := strings.Repeat("x", 300<<10) // more than one 256 KiB chunk
			fmt.Fprintf(conn, "POST /v1/documents:upload?requestId=refuse-after-first-read HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", tc.total, part)
			_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second)) // the test's guard; the answer comes at once
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while the client owes the rest of its body: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || !strings.Contains(string(body), "refused after its first") {
				t.Errorf("HTTP %d %s, want 400 with the bridge's reason", resp.StatusCode, body)
			}
			if !resp.Close {
				t.Errorf("answer without Connection: close while %d bytes of the body are unread", tc.total-len(part))
			}
			// The server drains what was sent for a moment after the
			// answer (lingerAfterStop), so the close is a FIN; a reset
			// (data the drain had no time for) still closes it.
			if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("after the answer the connection gave %v, want it closed", err)
			}
		})
	}
}
