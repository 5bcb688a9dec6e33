package gateway_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/gateway"
)

// Fuzz targets for the REST inputs a client controls: the JSON body of
// POST /v1/documents, the query strings of :upload and :subscribe, and the
// path ids and page tokens of the read routes. Each runs the whole HTTP
// chain in-process (real listeners, the REST proxy's real gRPC connection,
// the real bridge with its SQLite store and event log, whose peer is
// unreachable) and asserts the security.md robustness contract:
//
//   - no 5xx except 503 (the peer is unavailable), and no dropped
//     connection (a handler panic closes it without a response);
//   - memory stays bounded: one request allocates at most fuzzAllocBudget,
//     whatever sizes, counts or page sizes the input claims, and the live
//     heap never passes fuzzHeapCeiling.
//
// The seed corpora are in testdata/fuzz/<Target>/ and FUZZ_TARGETS lists
// the targets for .ci/test.sh.

const (
	// fuzzJSONLimit and fuzzUploadLimit shrink the body limits so that the
	// 413 paths are reached by small inputs.
	fuzzJSONLimit   = 64 << 10
	fuzzUploadLimit = 1 << 20
	// fuzzAllocBudget bounds the bytes one request may allocate (all
	// goroutines, so it includes the proxy, gRPC and SQLite): far above
	// what a 64 KiB body needs, far below what allocating from a claimed
	// length (page size 2^31, Content-Length 2^62) would take.
	fuzzAllocBudget = 64 << 20
	// fuzzHeapCeiling bounds the live heap during a fuzz run.
	fuzzHeapCeiling = 512 << 20
	// fuzzRequestTimeout bounds one request; streaming routes are cut
	// after their headers.
	fuzzRequestTimeout = 5 * time.Second
	// fuzzStreamWait is how long a streaming route gets to answer: a
	// refused request answers at once, an accepted one streams (or, on an
	// idle log, may not send its headers yet), and a panic drops the
	// connection (an error that is not a timeout).
	fuzzStreamWait = 300 * time.Millisecond
)

// fuzzServer is a gateway over the real bridge with an unreachable peer.
type fuzzServer struct {
	base   string
	client *http.Client
}

func startFuzzServer(f *testing.F) *fuzzServer {
	f.Helper()
	b, err := bridge.New(context.Background(), bridge.Options{
		DataDir:   f.TempDir(),
		PeerAddr:  "127.0.0.1:9", // discard port: nothing answers QUIC there
		PeerCAPEM: fuzzCertPEM(f),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := gateway.New(gateway.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Bridge: b,
		Logger:           slog.New(slog.DiscardHandler),
		MaxJSONBodyBytes: fuzzJSONLimit, MaxUploadBytes: fuzzUploadLimit,
		RateLimit: -1, MaxUploadsPerTenant: -1, MaxSubscribersPerTenant: -1,
		UploadIdleTimeout: time.Second,
	})
	if err != nil {
		f.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		f.Fatal(err)
	}
	fs := &fuzzServer{base: "http://" + srv.HTTPAddr(), client: &http.Client{Transport: &http.Transport{}}}
	f.Cleanup(func() {
		fs.client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			f.Errorf("shutdown: %v", err)
		}
	})
	return fs
}

// check sends one request and applies the contract. stream: the route
// streams (subscribe); only the status line is awaited.
func (fs *fuzzServer) check(t *testing.T, method, path, contentType string, body []byte, stream bool) {
	t.Helper()
	timeout := fuzzRequestTimeout
	if stream {
		timeout = fuzzStreamWait
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, fs.base+path, bytes.NewReader(body))
	if err != nil {
		return // not a request any client could send (bad URL)
	}
	if !validHeaderValue(contentType) {
		return // net/http refuses to send it; so would any client library
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, err := fs.client.Do(req)
	if err != nil && stream && errors.Is(err, context.DeadlineExceeded) {
		return // an open stream that has nothing to send yet
	}
	if err != nil {
		t.Fatalf("%s %s (%d-byte body): no response: %v (a handler panic drops the connection)", method, path, len(body), err)
	}
	if !stream {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 8<<20))
	}
	resp.Body.Close()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s %s: reading the response: %v", method, path, err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s %s (%d-byte body %q): HTTP %d, want no 5xx but 503", method, path, len(body), trunc(body), resp.StatusCode)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > fuzzAllocBudget {
		t.Fatalf("%s %s (%d-byte body): the request allocated %d bytes, above the %d-byte budget", method, path, len(body), d, fuzzAllocBudget)
	}
	if after.HeapInuse > fuzzHeapCeiling {
		t.Fatalf("heap in use %d bytes after %s %s, above %d", after.HeapInuse, method, path, fuzzHeapCeiling)
	}
}

// fuzzCertPEM makes a certificate to pin; nothing listens behind it.
func fuzzCertPEM(f *testing.F) []byte {
	f.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nobody"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		f.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// validHeaderValue reports whether net/http's client would send v as a
// header value (no control characters but tab).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func trunc(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// FuzzSubmitJSON fuzzes the JSON body of POST /v1/documents (and the
// Content-Type it comes with).
func FuzzSubmitJSON(f *testing.F) {
	for _, s := range []string{
		`{"content":"aGVsbG8=","contentType":"text/plain"}`,
		`{"content":"aGVsbG8=","split":{"strategy":"SPLIT_FIXED_BYTES","chunkBytes":1,"processor":"fault"},"completionPolicy":{"mode":"QUORUM","minSuccessRatio":2.5,"timeoutMs":4294967295},"metadata":{"pipestream.fault":"defer","pipestream.claim-ttl-ms":"-1"}}`,
		`{"content":"!!!"}`,
		`{"content":null,"requestId":"` + strings.Repeat("r", 300) + `"}`,
		`{"metadata":{"pipestream.processor":"x"}}`,
		`[1,2,3]`,
		`{"content":"aGVsbG8=","split":{"maxDepth":4294967295,"chunkBytes":0}}`,
		`{"displayName":"\u0000\ud800","contentType":"../../etc/passwd"}`,
		`{"content":"aGVsbG8=","unknownField":{"a":[[[[[[[[[[[[]]]]]]]]]]]]}}`,
		strings.Repeat("[", 10000),
		`{"content":"` + strings.Repeat("QUFB", 30000) + `"}`,
	} {
		f.Add([]byte(s), "application/json")
	}
	f.Add([]byte(`{"content":"aGk="}`), "text/plain")
	f.Add([]byte{0xff, 0xfe, 0x00}, "")
	fs := startFuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		fs.check(t, "POST", "/v1/documents", contentType, body, false)
	})
}

// FuzzUploadQuery fuzzes the query string (options) and the raw body of
// POST /v1/documents:upload.
func FuzzUploadQuery(f *testing.F) {
	for _, q := range []string{
		"split.strategy=fixed_bytes&split.chunkBytes=1048576",
		"split.strategy=lines&split.chunkBytes=0&split.processor=textstats",
		"split.chunkBytes=-1&split.maxDepth=99999999999999999999",
		"contentType=%00&requestId=" + strings.Repeat("x", 500),
		"metadata.pipestream.fault=defer&metadata.pipestream.claim-ttl-ms=9999999999999999",
		"completionPolicy.mode=QUORUM&completionPolicy.minSuccessRatio=NaN",
		"completionPolicy.timeoutMs=4294967296",
		"split.strategy=%zz",
		"a=b&a=c&;;&&==",
	} {
		f.Add(q, []byte("hello fuzz"), "application/octet-stream")
	}
	f.Add("", bytes.Repeat([]byte("x"), fuzzUploadLimit+1), "")
	fs := startFuzzServer(f)
	f.Fuzz(func(t *testing.T, query string, body []byte, contentType string) {
		if len(body) > 2*fuzzUploadLimit {
			body = body[:2*fuzzUploadLimit]
		}
		fs.check(t, "POST", "/v1/documents:upload?"+query, contentType, body, false)
	})
}

// FuzzSubscribeQuery fuzzes the query string of GET /v1/events:subscribe
// (cursor, filters): the stream's status line must not be a 5xx.
func FuzzSubscribeQuery(f *testing.F) {
	for _, q := range []string{
		"cursor=0", "cursor=18446744073709551615", "cursor=-1", "cursor=1e9",
		"documentId=..%2f..%2fetc", "cursor=0&documentId=" + strings.Repeat("a", 4096),
		"cursor=0&kinds=%23claim&kinds=", "cursor=%00",
	} {
		f.Add(q)
	}
	fs := startFuzzServer(f)
	f.Fuzz(func(t *testing.T, query string) {
		fs.check(t, "GET", "/v1/events:subscribe?"+query, "", nil, true)
		fs.check(t, "GET", "/v1/events:window?"+query, "", nil, false)
	})
}

// FuzzIDsAndPageTokens fuzzes the path ids of the document and claim
// routes and the page size and token of GET /v1/documents.
func FuzzIDsAndPageTokens(f *testing.F) {
	for _, s := range []struct {
		id, token string
		size      int64
	}{
		{"01J0000000000000000000000", "", 2},
		{"..%2f..%2fetc%2fpasswd", "AAAA", 2147483647},
		{"%00", "eyJ0IjoiIn0", -1},
		{"18446744073709551615", "not-base64!!", 0},
		{strings.Repeat("9", 200), strings.Repeat("A", 2000), 1 << 40},
		{"0", "%FF%FE", -2147483648},
	} {
		f.Add(s.id, s.token, s.size)
	}
	fs := startFuzzServer(f)
	f.Fuzz(func(t *testing.T, id, token string, size int64) {
		pid := url.PathEscape(id)
		if strings.Contains(id, "%") { // also as the raw, already-escaped path
			pid = id
		}
		fs.check(t, "GET", "/v1/documents/"+pid, "", nil, false)
		fs.check(t, "GET", "/v1/documents/"+pid+"/result", "", nil, false)
		fs.check(t, "POST", "/v1/documents/"+pid+":cancel", "application/json", []byte("{}"), false)
		fs.check(t, "GET", "/v1/claims/"+pid, "", nil, false)
		fs.check(t, "POST", "/v1/claims/"+pid+":redeem", "application/json", []byte("{}"), false)
		q := url.Values{"pageToken": {token}, "pageSize": {fmt.Sprint(size)}}
		fs.check(t, "GET", "/v1/documents?"+q.Encode(), "", nil, false)
	})
}
