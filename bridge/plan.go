package bridge

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"mime"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/pipestream/gateway/bridge/internal/split"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Profile metadata keys (docs/profile.md 4.4).
const (
	metaPrefix        = "pipestream."
	metaProcessor     = "pipestream.processor"
	metaFault         = "pipestream.fault"
	metaFaultChunks   = "pipestream.fault-chunks"
	metaClaimTTL      = "pipestream.claim-ttl-ms"
	metaMaxDepth      = "pipestream.max-depth"
	metaTotalChunks   = "pipestream.total-chunks"
	metaContentLength = "pipestream.content-length"
	metaContentSHA    = "pipestream.content-sha256"
	metaClaimID       = "pipestream.claim-id"
	metaRole          = "pipestream.role"
	// metaProfile marks every entity of a profile document (root, chunks,
	// redemptions): the peer reads an entity as the profile's only when it
	// carries it (docs/profile.md 1.1, 4).
	metaProfile    = "pipestream.profile"
	profileVersion = "1"
	// metaAcceptParts on every child tells the peer this gateway takes
	// streamed results (profile 4.3.1); a peer streams only to gateways
	// that say so.
	metaAcceptParts = "pipestream.accept-result-parts"
	// metaAcceptInline on the root of a whole document offers to take its
	// result inline in the COMPLETE status, up to the given number of
	// extension octets (profile 4.3.2, inlineresult.go).
	metaAcceptInline = "pipestream.accept-inline-result"
)

// clientMetaKeys are the reserved keys a client may set (tests, demos).
var clientMetaKeys = map[string]bool{metaFault: true, metaFaultChunks: true, metaClaimTTL: true}

// processors the peer runs (profile 4.4).
var processors = map[string]bool{"passthrough": true, "textstats": true, "sentences": true, "fault": true}

// faultActions of the fault processor (profile 4.4).
var faultActions = map[string]bool{"fail": true, "fail-once": true, "yield": true, "defer": true, "timeout": true, "timeout-once": true}

// plan is a validated submission: how the document is dispatched.
type plan struct {
	opts        *gatewayv1.SubmitOptions // normalized (defaults filled)
	strategy    gatewayv1.SplitStrategy
	chunkBytes  int
	faultChunks map[uint64]bool // nil: the fault applies to every chunk
}

// optionsOf turns a SubmitDocumentRequest into SubmitOptions.
func optionsOf(req *gatewayv1.SubmitDocumentRequest) *gatewayv1.SubmitOptions {
	return &gatewayv1.SubmitOptions{
		ContentType:      req.GetContentType(),
		RequestId:        req.GetRequestId(),
		Split:            req.GetSplit(),
		CompletionPolicy: req.GetCompletionPolicy(),
		Metadata:         req.GetMetadata(),
		DisplayName:      req.GetDisplayName(),
	}
}

// newPlan validates opts and fills defaults; errors wrap ErrInvalid and say
// what to fix.
func newPlan(in *gatewayv1.SubmitOptions) (*plan, error) {
	o := proto.Clone(in).(*gatewayv1.SubmitOptions)
	if o == nil {
		o = &gatewayv1.SubmitOptions{}
	}
	if o.ContentType == "" {
		o.ContentType = "application/octet-stream"
	}
	if len(o.ContentType) > maxContentTypeLen {
		return nil, invalidf("contentType is longer than %d bytes", maxContentTypeLen)
	}
	if _, _, err := mime.ParseMediaType(o.ContentType); err != nil {
		return nil, invalidf("contentType %q is not a media type (e.g. text/plain): %v", o.ContentType, err)
	}
	if len(o.RequestId) > maxRequestIDLen {
		return nil, invalidf("requestId is longer than %d bytes", maxRequestIDLen)
	}
	if len(o.DisplayName) > maxDisplayNameLen {
		return nil, invalidf("displayName is longer than %d bytes", maxDisplayNameLen)
	}
	if o.Split == nil {
		o.Split = &gatewayv1.SplitOptions{}
	}
	sp := o.Split
	switch sp.Strategy {
	case gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED, gatewayv1.SplitStrategy_SPLIT_NONE,
		gatewayv1.SplitStrategy_SPLIT_FIXED_BYTES, gatewayv1.SplitStrategy_SPLIT_LINES,
		gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS:
	default:
		return nil, invalidf("split.strategy %d is unknown (use SPLIT_NONE, SPLIT_FIXED_BYTES, SPLIT_LINES or SPLIT_PARAGRAPHS)", sp.Strategy)
	}
	if sp.ChunkBytes == 0 {
		sp.ChunkBytes = defaultChunkBytes
	}
	if sp.ChunkBytes > maxChunkBytes {
		return nil, invalidf("split.chunkBytes %d exceeds the maximum %d (16 MiB)", sp.ChunkBytes, maxChunkBytes)
	}
	if sp.MaxDepth > wire.MaxScopeDepth {
		return nil, invalidf("split.maxDepth %d is out of range 0-%d", sp.MaxDepth, wire.MaxScopeDepth)
	}
	if sp.Processor == "" {
		sp.Processor = "passthrough"
	}
	if !processors[sp.Processor] {
		return nil, invalidf("split.processor %q is unknown (use passthrough, textstats, sentences or fault)", sp.Processor)
	}
	if err := checkPolicy(o.CompletionPolicy); err != nil {
		return nil, err
	}
	p := &plan{opts: o, strategy: sp.Strategy, chunkBytes: int(sp.ChunkBytes)}
	if err := p.checkMetadata(); err != nil {
		return nil, err
	}
	return p, nil
}

func checkPolicy(cp *gatewayv1.CompletionPolicy) error {
	if cp == nil {
		return nil
	}
	if _, ok := gatewayv1.CompletionPolicy_Mode_name[int32(cp.Mode)]; !ok {
		return invalidf("completionPolicy.mode %d is unknown", cp.Mode)
	}
	for name, a := range map[string]gatewayv1.CompletionPolicy_Action{"onFailure": cp.OnFailure, "onTimeout": cp.OnTimeout} {
		if _, ok := gatewayv1.CompletionPolicy_Action_name[int32(a)]; !ok {
			return invalidf("completionPolicy.%s %d is unknown", name, a)
		}
	}
	r := float64(cp.MinSuccessRatio)
	if math.IsNaN(r) || r < 0 || r > 1 {
		return invalidf("completionPolicy.minSuccessRatio %v must be in [0, 1]", cp.MinSuccessRatio)
	}
	if cp.Mode == gatewayv1.CompletionPolicy_QUORUM && r == 0 {
		return invalidf("completionPolicy.mode QUORUM needs minSuccessRatio in (0, 1]")
	}
	if cp.Mode != gatewayv1.CompletionPolicy_QUORUM && r != 0 {
		return invalidf("completionPolicy.minSuccessRatio is only meaningful with mode QUORUM")
	}
	if cp.MaxRetries > 100 {
		return invalidf("completionPolicy.maxRetries %d exceeds 100", cp.MaxRetries)
	}
	if cp.OnFailure == gatewayv1.CompletionPolicy_RETRY && cp.MaxRetries == 0 {
		return invalidf("completionPolicy.onFailure RETRY needs maxRetries > 0")
	}
	return nil
}

func (p *plan) checkMetadata() error {
	md := p.opts.Metadata
	if len(md) > maxMetadataEntries {
		return invalidf("metadata has %d entries; at most %d", len(md), maxMetadataEntries)
	}
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
		if k == "" {
			return invalidf("metadata key must not be empty")
		}
		if strings.HasPrefix(k, metaPrefix) && !clientMetaKeys[k] {
			return invalidf("metadata key %q is in the reserved %q namespace (only %s, %s, %s may be set)",
				k, metaPrefix, metaFault, metaFaultChunks, metaClaimTTL)
		}
	}
	if n > maxMetadataBytes {
		return invalidf("metadata is %d bytes; at most %d", n, maxMetadataBytes)
	}
	if f, ok := md[metaFault]; ok && !faultActions[f] {
		return invalidf("metadata %s=%q is unknown (use fail, fail-once, yield, defer, timeout or timeout-once)", metaFault, f)
	}
	if v, ok := md[metaClaimTTL]; ok {
		if ms, err := strconv.ParseUint(v, 10, 32); err != nil || ms == 0 {
			return invalidf("metadata %s=%q must be a positive number of milliseconds", metaClaimTTL, v)
		}
	}
	if v, ok := md[metaFaultChunks]; ok {
		p.faultChunks = map[uint64]bool{}
		for _, s := range strings.Split(v, ",") {
			i, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
			if err != nil {
				return invalidf("metadata %s=%q must be a comma list of chunk indexes", metaFaultChunks, v)
			}
			p.faultChunks[i] = true
		}
	}
	return nil
}

// whole reports whether a document of size bytes is sent whole (profile 4.1).
func (p *plan) whole(size, inline int64) bool {
	switch p.strategy {
	case gatewayv1.SplitStrategy_SPLIT_NONE:
		return true
	case gatewayv1.SplitStrategy_SPLIT_STRATEGY_UNSPECIFIED:
		return size <= inline
	}
	return false
}

// splitStrategy maps the API strategy to the chunker's (unspecified: fixed).
func (p *plan) splitStrategy() split.Strategy {
	switch p.strategy {
	case gatewayv1.SplitStrategy_SPLIT_LINES:
		return split.Lines
	case gatewayv1.SplitStrategy_SPLIT_PARAGRAPHS:
		return split.Paragraphs
	}
	return split.FixedBytes
}

// bodyHash is the idempotency hash: SHA-256 over the deterministic encoding
// of the options (request id excluded) and the content's SHA-256. The
// request id's field is cut out of the options' encoding rather than
// cleared on a clone (a clone was 2% of a small document's CPU): a
// deterministic encoding writes the fields in number order, so without
// that one field the bytes are exactly those of the options with an empty
// request id, the hash every stored document carries
// (TestBodyHashIsTheClearedEncoding).
func (p *plan) bodyHash(contentSum [32]byte) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p.opts)
	h := sha256.New()
	writeWithoutField(h, b, requestIDField)
	h.Write(contentSum[:])
	return h.Sum(nil)
}

// requestIDField is SubmitOptions.request_id's field number.
const requestIDField = 2

// writeWithoutField writes the top-level fields of the encoded message b to
// w, every occurrence of field num left out. b comes from proto.Marshal, so
// it parses; should it not, the rest is written as it is.
func writeWithoutField(w io.Writer, b []byte, num protowire.Number) {
	for len(b) > 0 {
		n, typ, tl := protowire.ConsumeTag(b)
		vl := -1
		if tl > 0 {
			vl = protowire.ConsumeFieldValue(n, typ, b[tl:])
		}
		if vl < 0 {
			_, _ = w.Write(b)
			return
		}
		if n != num {
			_, _ = w.Write(b[:tl+vl])
		}
		b = b[tl+vl:]
	}
}

// wirePolicy is the completion-policy of the root header (draft Section 8.3).
func (p *plan) wirePolicy() *wire.CompletionPolicy {
	cp := p.opts.CompletionPolicy
	if cp == nil {
		return nil
	}
	mode := wire.CompletionMode(cp.Mode)
	out := &wire.CompletionPolicy{Mode: &mode}
	if cp.MaxRetries > 0 {
		out.MaxRetries = &cp.MaxRetries
	}
	if cp.RetryDelayMs > 0 {
		out.RetryDelayMs = &cp.RetryDelayMs
	}
	if cp.TimeoutMs > 0 {
		out.TimeoutMs = &cp.TimeoutMs
	}
	if cp.Mode == gatewayv1.CompletionPolicy_QUORUM {
		r := cp.MinSuccessRatio
		out.MinSuccessRatio = &r
	}
	if cp.OnTimeout != 0 {
		a := wire.FailureAction(cp.OnTimeout)
		out.OnTimeout = &a
	}
	if cp.OnFailure != 0 {
		a := wire.FailureAction(cp.OnFailure)
		out.OnFailure = &a
	}
	return out
}

// retries is how many times the peer retries a failed entity itself.
func (p *plan) retries() uint32 {
	cp := p.opts.CompletionPolicy
	if cp.GetOnFailure() != gatewayv1.CompletionPolicy_RETRY {
		return 0
	}
	return cp.GetMaxRetries()
}

// needsMetadata names what of the document only entity metadata carries
// to the peer, "" when nothing: a processor other than passthrough, request
// metadata (the fault keys among them) or a split depth. A draft-04 entity
// header has no metadata member (docs/profile.md 9.3), so placement gives
// such a document only to a peer that receives metadata; sent to a
// draft-04 peer it would run as passthrough and succeed with another
// result than the one asked for.
func (p *plan) needsMetadata() string {
	switch {
	case p.opts.Split.Processor != "passthrough":
		return "split.processor " + p.opts.Split.Processor
	case len(p.opts.Metadata) > 0:
		return "request metadata"
	case p.opts.Split.MaxDepth > 0:
		return "split.maxDepth"
	}
	return ""
}

// rootMetadata is the metadata of the root header: the request metadata plus
// the profile keys (with the profile marker when profile is set).
func (p *plan) rootMetadata(profile bool) map[string]string {
	md := make(map[string]string, len(p.opts.Metadata)+5)
	for k, v := range p.opts.Metadata {
		md[k] = v
	}
	if profile {
		md[metaProfile] = profileVersion
	}
	md[metaProcessor] = p.opts.Split.Processor
	if p.opts.Split.MaxDepth > 0 {
		md[metaMaxDepth] = strconv.FormatUint(uint64(p.opts.Split.MaxDepth), 10)
	}
	return md
}

// childMetadata is what a chunk's header carries: the processor, depth and
// the fault keys (the fault only on the selected chunks); with profile, the
// marker and the streamed-result opt-in too.
func (p *plan) childMetadata(index uint64, profile bool) map[string]string {
	md := map[string]string{metaProcessor: p.opts.Split.Processor}
	if profile {
		md[metaProfile], md[metaAcceptParts] = profileVersion, "1"
	}
	if p.opts.Split.MaxDepth > 0 {
		md[metaMaxDepth] = strconv.FormatUint(uint64(p.opts.Split.MaxDepth), 10)
	}
	src := p.opts.Metadata
	if f, ok := src[metaFault]; ok && (p.faultChunks == nil || p.faultChunks[index]) {
		md[metaFault] = f
		if v, ok := src[metaFaultChunks]; ok {
			md[metaFaultChunks] = v
		}
	}
	if v, ok := src[metaClaimTTL]; ok {
		md[metaClaimTTL] = v
	}
	return md
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}
