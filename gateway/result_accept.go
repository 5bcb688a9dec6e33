package gateway

import (
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
)

// ReasonNotAcceptable is the ErrorInfo reason of a result download whose
// Accept header allows neither the result's type nor
// application/octet-stream (HTTP 406).
const ReasonNotAcceptable = "NOT_ACCEPTABLE"

const octetStream = "application/octet-stream"

// maxAcceptRanges bounds the media ranges of an Accept header that
// negotiateResult looks at; the rest are ignored.
const maxAcceptRanges = 64

// negotiateResult picks the Content-Type of a result download from the
// request's Accept header (RFC 9110 section 12.5.1): the result's own type
// stored (already made safe by safeResultHeaders) when Accept is absent or
// allows it (*/*, type/*, the type itself), or application/octet-stream
// (the same bytes) when the client prefers or only accepts that. Of two
// acceptable types the higher q wins; a tie goes to application/octet-stream
// when the client named it exactly (generated clients list every type the
// spec declares and read the body as a byte stream), else to the stored
// type (browsers' */*). ok is false when neither is acceptable (406).
func negotiateResult(accept []string, stored string) (ct string, ok bool) {
	ranges := parseAccept(accept)
	if ranges == nil {
		return stored, true // no Accept (or nothing usable in it): anything goes
	}
	mt, _, err := mime.ParseMediaType(stored)
	if err != nil {
		mt = octetStream
	}
	qStored, _ := acceptQuality(ranges, strings.ToLower(mt))
	qOctet, named := acceptQuality(ranges, octetStream)
	switch {
	case qStored <= 0 && qOctet <= 0:
		return "", false
	case qOctet > qStored, qOctet == qStored && named == specExact:
		return octetStream, true
	default:
		return stored, true
	}
}

// acceptRange is one media range of an Accept header.
type acceptRange struct {
	typ, sub string // lower case; "*" for a wildcard
	q        float64
}

// parseAccept parses the media ranges of Accept header values; ranges that
// do not parse are skipped. It returns nil when there is no usable range.
func parseAccept(values []string) []acceptRange {
	var out []acceptRange
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			if len(out) == maxAcceptRanges {
				return out
			}
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			if part == "*" || strings.HasPrefix(part, "*;") { // a common shorthand for */*
				part = "*/*" + part[1:]
			}
			mt, params, err := mime.ParseMediaType(part)
			if err != nil {
				continue
			}
			typ, sub, found := strings.Cut(strings.ToLower(mt), "/")
			if !found || typ == "" || sub == "" || (typ == "*" && sub != "*") {
				continue
			}
			q := 1.0
			if s, has := params["q"]; has {
				if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 && f <= 1 {
					q = f
				} else {
					continue
				}
			}
			out = append(out, acceptRange{typ: typ, sub: sub, q: q})
		}
	}
	return out
}

// Specificity of the Accept range that matched a type.
const (
	specNone  = iota - 1
	specAny   // */*
	specType  // type/*
	specExact // type/subtype
)

// acceptQuality is the q of the most specific range that matches the media
// type mt (exact over type/* over */*) and that specificity; 0 and
// specNone when no range matches.
func acceptQuality(ranges []acceptRange, mt string) (float64, int) {
	typ, sub, _ := strings.Cut(mt, "/")
	best, q := specNone, 0.0
	for _, r := range ranges {
		spec := specNone
		switch {
		case r.typ == typ && r.sub == sub:
			spec = specExact
		case r.typ == typ && r.sub == "*":
			spec = specType
		case r.typ == "*" && r.sub == "*":
			spec = specAny
		}
		if spec > best || (spec == best && spec != specNone && r.q > q) {
			best, q = spec, r.q
		}
	}
	return q, best
}

// notAcceptable answers a result download that Accept rules out: 406 with
// a google.rpc.Status saying which types the client may ask for.
func (s *Server) notAcceptable(w http.ResponseWriter, r *http.Request, stored string) {
	accept := strings.Join(r.Header.Values("Accept"), ", ")
	if len(accept) > 200 {
		accept = accept[:200] + "..."
	}
	msg := fmt.Sprintf("the result is %s and Accept: %q allows neither that nor %s: send Accept: %s, %s or */*",
		stored, accept, octetStream, stored, octetStream)
	s.writeStatus(w, r, http.StatusNotAcceptable, statusError(codes.InvalidArgument, ReasonNotAcceptable, msg))
}
