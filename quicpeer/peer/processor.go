package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// Profile metadata keys (docs/profile.md 4.4).
const (
	MetaProcessor        = "pipestream.processor"
	MetaFault            = "pipestream.fault"
	MetaFaultChunks      = "pipestream.fault-chunks"
	MetaClaimTTL         = "pipestream.claim-ttl-ms"
	MetaMaxDepth         = "pipestream.max-depth"
	MetaTotalChunks      = "pipestream.total-chunks"
	MetaContentLength    = "pipestream.content-length"
	MetaContentSHA256    = "pipestream.content-sha256"
	MetaClaimID          = "pipestream.claim-id"
	MetaRole             = "pipestream.role"
	MetaChildrenComplete = "pipestream.children-complete"
	MetaChildrenTotal    = "pipestream.children-total"
)

// Input is one entity handed to a Processor (draft-02 Section 8.4, PROCESS).
// Payload is verified content (checksum and length checked before any
// processing starts); the processor must not modify or retain it beyond
// the call unless it copies. Header is read-only.
type Input struct {
	Header  *wire.EntityHeader
	Payload []byte
	// Depth is the entity's scope nesting depth D (0 = root scope).
	Depth int
	// MaxDepth is the deepest depth sub-entities may use: the negotiated
	// max-scope-depth, lowered by pipestream.max-depth. -1 when Layer 1 is
	// off (no nested dehydration).
	MaxDepth int
	// ChunkIndex is the chunk-index of a dehydration child, -1 otherwise.
	ChunkIndex int
	// Attempt counts retries: 0 on the first attempt.
	Attempt int
	// Resume is the continuation state of a verified yield token; nil on a
	// fresh start. Yields counts how often this entity yielded already.
	Resume []byte
	Yields int
	// RootMeta is the root entity's metadata when it is already known
	// (children may be processed before the root envelope arrives); nil
	// otherwise.
	RootMeta map[string]string
	// Redeemed is set when the entity is processed for a redeemed claim
	// check: fault injection is off.
	Redeemed bool
}

// Output is what a Processor returns: exactly one of a result (Data), a
// request to dehydrate into sub-entities (Dehydrate, Layer 1), a yield
// (Yield) or a deferral (Defer, Layer 2).
type Output struct {
	Data        []byte
	ContentType string
	// Layer is the data layer of Data (0 bytes, 2 ParsedData).
	Layer uint8
	// Partial is processor-private merge state for Rehydrate (N:1).
	Partial any

	// Dehydrate asks the peer to split the entity into these sub-entities
	// in a new scope (docs/profile.md 6). The peer processes each as a leaf
	// whose output is the bytes as given, then calls Rehydrate on them.
	// More than the scope may hold (max-entities-per-scope, the
	// children-per-MB ratio) fails the entity with
	// PIPESTREAM_ENTITY_TOO_LARGE, unless the processor is a Concatenator:
	// then consecutive sub-entities are joined, whole and in order, into as
	// many as allowed.
	Dehydrate [][]byte
	Yield     *YieldRequest
	Defer     *DeferRequest
}

// YieldRequest pauses the entity (YIELDED, draft-02 Section 6.6.2). State is
// handed back as Input.Resume once the peer verified the token.
type YieldRequest struct {
	Reason uint8
	State  []byte
}

// DeferRequest detaches the entity with a claim check (DEFERRED, Section
// 6.5.2). TTL 0 means the claim-check expiry limit.
type DeferRequest struct {
	TTL time.Duration
}

// Processor transforms entities (1:1) and merges siblings (N:1).
// Implementations must be safe for concurrent use.
type Processor interface {
	// Process handles one entity. It must return promptly when ctx ends.
	Process(ctx context.Context, in *Input) (*Output, error)
	// Rehydrate merges the outputs of the children of one parent, given in
	// chunk-index order (only those the completion policy keeps), into the
	// parent's result.
	Rehydrate(ctx context.Context, parts []*Output) (*Output, error)
}

// ErrUnknownProcessor is returned for a pipestream.processor the peer lacks.
var ErrUnknownProcessor = errors.New("unknown processor")

// Processors maps pipestream.processor values to implementations.
type Processors map[string]Processor

// DefaultProcessors returns the built-in processors: passthrough (the
// default), textstats, sentences and fault.
func DefaultProcessors() Processors {
	return Processors{
		"passthrough": Passthrough{},
		"textstats":   TextStats{},
		"sentences":   Sentences{},
		"fault":       Fault{},
	}
}

// lookup returns the processor named in md (passthrough when absent).
func (p Processors) lookup(md map[string]string) (string, Processor, error) {
	name := md[MetaProcessor]
	if name == "" {
		name = "passthrough"
	}
	proc, ok := p[name]
	if !ok {
		return name, nil, fmt.Errorf("%w %q: use one of passthrough, textstats, sentences, fault", ErrUnknownProcessor, name)
	}
	return name, proc, nil
}

// concatParts joins part data in order, the N:1 merge of byte outputs.
func concatParts(parts []*Output) []byte {
	n := 0
	for _, p := range parts {
		n += len(p.Data)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p.Data...)
	}
	return out
}

// Passthrough returns its input unchanged (layer 0) and concatenates
// children on rehydration.
type Passthrough struct{}

func (Passthrough) Process(_ context.Context, in *Input) (*Output, error) {
	return &Output{Data: in.Payload, ContentType: contentTypeOf(in.Header, "application/octet-stream")}, nil
}

func (Passthrough) Rehydrate(_ context.Context, parts []*Output) (*Output, error) {
	ct := "application/octet-stream"
	if len(parts) > 0 && parts[0].ContentType != "" {
		ct = parts[0].ContentType
	}
	return &Output{Data: concatParts(parts), ContentType: ct}, nil
}

// ConcatType makes Passthrough a Concatenator: the result is streamed from
// the spooled child outputs (content-type of the first, layer 0).
func (Passthrough) ConcatType(first *Output) (string, uint8) {
	if first.ContentType != "" {
		return first.ContentType, 0
	}
	return "application/octet-stream", 0
}

func contentTypeOf(h *wire.EntityHeader, def string) string {
	if h != nil && h.ContentType != "" {
		return h.ContentType
	}
	return def
}
