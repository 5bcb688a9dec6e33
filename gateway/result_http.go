package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
)

const resultMethod = "/pipestream.gateway.v1.DocumentService/GetDocumentResult"

// handleResult serves GET /v1/documents/{id}/result: the result file
// streamed straight from bridge.Result into the response body through a
// resultCopyBytes buffer, with the result's Content-Type (made safe by
// safeResultHeaders; application/octet-stream instead when the Accept
// header asks for that, 406 when it allows neither: negotiateResult) and,
// when known, Content-Length. It does not go
// through the REST proxy's gRPC connection: a download whose client stops
// reading then costs its buffer and an open file, not a gRPC stream slot
// and flow-control window, and cannot delay other tenants' calls. The
// checks the gRPC route has are applied here: authentication (admit),
// Config.Limiter and the rate limit, and the per-tenant download cap. An
// error before the status line answers its HTTP status with a
// google.rpc.Status body; an error after it aborts the connection, so the
// client sees a short body (with Content-Length, or a chunked body without
// its last chunk), never a silently truncated result.
func (s *Server) handleResult(w http.ResponseWriter, r *http.Request) {
	_, outbound := runtime.MarshalerForRequest(s.gwMux, r)
	fail := func(err error) { runtime.HTTPError(r.Context(), s.gwMux, outbound, w, r, err) }
	tenant, _ := tenantFrom(r.Context())
	id := r.PathValue("id")
	if err := requireID("id", id); err != nil {
		fail(err)
		return
	}
	release, err := s.admitCall(r.Context(), tenant, resultMethod)
	if err != nil {
		fail(err)
		return
	}
	defer release()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ct, size, rc, err := s.cfg.Bridge.Result(ctx, tenant, id)
	if err != nil {
		fail(toStatus(err))
		return
	}
	defer rc.Close()
	h := w.Header()
	safeResultHeaders(h, ct, id)
	h.Add("Vary", "Accept")
	served, ok := negotiateResult(r.Header.Values("Accept"), h.Get("Content-Type"))
	if !ok {
		h.Del("Content-Disposition")
		s.notAcceptable(w, r, h.Get("Content-Type"))
		return
	}
	h.Set("Content-Type", served)
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	buf := make([]byte, resultCopyBytes)
	var sent int64
	start := time.Now()
	defer func() { // also after abortResult's panic
		s.log.Info("result download", "id", id, "tenant", string(tenant), "bytes", sent,
			"duration", time.Since(start), "request_id", httpRequestID(r))
	}()
	for {
		n, rerr := rc.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client went away or stalled past the write deadline
			}
			sent += int64(n)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			s.abortResult(r, fmt.Errorf("read result after %d bytes: %w", sent, rerr))
		}
	}
	if size >= 0 && sent != size {
		s.abortResult(r, status.Errorf(codes.DataLoss, "sent %d bytes, the stored result has %d", sent, size))
	}
}

// abortResult ends a download that failed after its status line.
func (s *Server) abortResult(r *http.Request, err error) {
	s.log.Warn("result download failed after the status line; aborting the connection",
		"path", r.URL.Path, "request_id", httpRequestID(r), "error", err)
	panic(http.ErrAbortHandler)
}

// admitCall applies, for a call the HTTP side serves itself, what the
// gRPC interceptors apply after authentication: Config.Limiter, the
// per-tenant rate limit and the concurrency cap of method. release ends
// the call's concurrency slot.
func (s *Server) admitCall(ctx context.Context, tenant bridge.Tenant, method string) (release func(), err error) {
	if err := s.admitTenant(ctx, tenant, method); err != nil {
		return nil, err
	}
	release, err = s.limits.acquire(method, tenant)
	if err != nil {
		s.metrics.rejected.WithLabelValues("concurrency").Inc()
		return nil, err
	}
	return release, nil
}

// activeTypes are media types a browser would run or render as a page on
// the gateway's origin (script, markup, stylesheets, embeddable
// documents); a result of such a type is served as an attachment.
var activeTypes = []string{
	"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml",
	"text/javascript", "application/javascript", "application/ecmascript", "text/ecmascript",
	"text/css", "application/pdf", "text/xsl", "application/xslt+xml", "text/vtt",
	"application/wasm", "multipart/x-mixed-replace", "application/x-shockwave-flash",
}

// isActiveType reports whether the media type mt (lower case, without
// parameters) is active content: one of activeTypes, any +xml type, any
// type of JavaScript or a scripting language by name.
func isActiveType(mt string) bool {
	for _, a := range activeTypes {
		if mt == a {
			return true
		}
	}
	return strings.HasSuffix(mt, "+xml") || strings.Contains(mt, "javascript") || strings.Contains(mt, "ecmascript")
}

// safeResultHeaders sets the headers of a result download: the
// submitter's Content-Type if it parses (else application/octet-stream),
// X-Content-Type-Options: nosniff and Content-Security-Policy: sandbox on
// every result, and Content-Disposition: attachment for active content
// (isActiveType) and unparsable types, so a result never runs as a page of
// the gateway's origin (where /docs/ lives).
func safeResultHeaders(h http.Header, ct, id string) {
	mt, params, err := mime.ParseMediaType(ct)
	active := true
	if err == nil {
		mt = strings.ToLower(mt)
		active = isActiveType(mt)
		ct = mime.FormatMediaType(mt, params)
	}
	if err != nil || ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	if active {
		h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": id + ".result"}))
	}
}
