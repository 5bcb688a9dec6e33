package gateway

import (
	"slices"
	"sync/atomic"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// eventCacheSlots is the number of recent events whose encodings
// eventCache keeps (a power of two): a subscriber this far behind the
// newest event encodes for itself, as every subscriber did before.
const eventCacheSlots = 4096

// eventCache encodes each event of the log once per wire format for every
// subscriber of this process (issue 25: fan-out straight from the log).
// The event log hands every live subscriber the same *Event; the first
// subscriber to need an event in a format encodes it, the others take the
// bytes. Entries are found by seq in a ring of eventCacheSlots and belong
// to an event by identity (the same *Event) or, for events a subscriber
// replayed from the store (decoded afresh), by equal content: a seq names
// one event of the log, so the bytes are those the subscriber would have
// encoded itself. Events without a seq (#info) are not cached.
//
// Lock-free: a slot is an atomic pointer, an entry's encodings are atomic
// pointers set once (two subscribers racing on the first use both encode
// the same bytes; one copy wins). The cached slices have no spare capacity,
// so a caller that appends to one gets a copy.
type eventCache struct {
	slots [eventCacheSlots]atomic.Pointer[eventEntry]
}

// eventEntry is one event's encodings, each computed on first use.
type eventEntry struct {
	ev  *gatewayv1.Event
	seq uint64
	enc [numEncodings]atomic.Pointer[encoded]
}

// encoded is one encoding of an event, or the error encoding it gave.
type encoded struct {
	b   []byte
	err error
}

// The wire formats an event is encoded in.
const (
	encWSFrame = iota // WebSocket binary message (eventMessage)
	encJSON           // the REST marshaler's JSON of the event (SSE, pages)
	encNDJSON         // the REST marshaler's {"result": event} (NDJSON streams)
	numEncodings
)

// entry returns ev's entry, creating it (and evicting the slot's older
// event) when needed; nil for an event without a seq.
func (c *eventCache) entry(ev *gatewayv1.Event) *eventEntry {
	seq := ev.GetSeq()
	if c == nil || seq == 0 {
		return nil
	}
	slot := &c.slots[seq&(eventCacheSlots-1)]
	old := slot.Load()
	if old != nil && old.seq == seq && (old.ev == ev || proto.Equal(old.ev, ev)) {
		return old
	}
	e := &eventEntry{ev: ev, seq: seq}
	if old != nil && old.seq > seq {
		return e // an old event (a replay far behind): do not evict a newer one
	}
	if !slot.CompareAndSwap(old, e) {
		if cur := slot.Load(); cur != nil && cur.seq == seq && cur.ev == ev {
			return cur // another subscriber put the same event first
		}
	}
	return e
}

// get returns the encoding k of the entry's event, running encode on first
// use. A nil entry (uncached event) encodes every time.
func (e *eventEntry) get(k int, encode func() ([]byte, error)) ([]byte, error) {
	if e == nil {
		return encode()
	}
	if v := e.enc[k].Load(); v != nil {
		return v.b, v.err
	}
	b, err := encode()
	v := &encoded{b: slices.Clip(b), err: err}
	if !e.enc[k].CompareAndSwap(nil, v) {
		v = e.enc[k].Load()
	}
	return v.b, v.err
}

// wsMessage is the event's whole WebSocket message: the binary frame's
// header and the draft's message frame (appendEventFrame) as its payload,
// ready for the wire (corkConn.writeData). Shared: the caller must not
// modify it.
func (c *eventCache) wsMessage(ev *gatewayv1.Event) ([]byte, error) {
	return c.entry(ev).get(encWSFrame, func() ([]byte, error) { return eventMessage(ev) })
}

// eventMessage is ev's WebSocket message (wsMessage) without the cache.
func eventMessage(ev *gatewayv1.Event) ([]byte, error) {
	frame, err := appendEventFrame(nil, ev)
	if err != nil {
		return nil, err
	}
	return wsBinaryMessage(make([]byte, 0, len(frame)+10), frame), nil
}

// cachedMarshaler is the REST marshaler with the event cache in front of
// the two encodings event streams make of every event: the event itself
// (SSE data, page items) and grpc-gateway's NDJSON chunk {"result":
// event} (runtime.ForwardResponseStream). The bytes are the marshaler's
// own, computed once per event. A Document (the answer of most unary
// routes) is encoded by appendDocumentJSON, the same JSON as protojson
// writes (TestDocumentAnswerMatchesProtojson), without reflection. Every
// other value, and every event without a seq, goes to the marshaler as
// before.
type cachedMarshaler struct {
	runtime.Marshaler
	cache *eventCache
}

func (m *cachedMarshaler) Marshal(v any) ([]byte, error) {
	switch x := v.(type) {
	case *gatewayv1.Document:
		// The answer of submit, get, cancel and the rest: the snapshot's
		// hand encoder (snapshotjson.go), protojson for what it refuses.
		if b, ok := appendDocumentJSON(make([]byte, 0, 1024), x); ok {
			return b, nil
		}
	case *gatewayv1.Event:
		if e := m.cache.entry(x); e != nil {
			return e.get(encJSON, func() ([]byte, error) { return m.Marshaler.Marshal(v) })
		}
	case map[string]any:
		if ev, ok := x["result"].(*gatewayv1.Event); ok && len(x) == 1 {
			if e := m.cache.entry(ev); e != nil {
				return e.get(encNDJSON, func() ([]byte, error) {
					if b, ok := appendNDJSONEventChunk(make([]byte, 0, 512), ev); ok {
						return b, nil // eventjson.go
					}
					return m.Marshaler.Marshal(v)
				})
			}
		}
	}
	return m.Marshaler.Marshal(v)
}

// withEventCache puts c in front of the JSON marshaler inside a REST
// marshaler (restMarshaler: an HTTPBodyMarshaler, whose raw bodies pass
// through untouched).
func withEventCache(m runtime.Marshaler, c *eventCache) runtime.Marshaler {
	if hb, ok := m.(*runtime.HTTPBodyMarshaler); ok {
		return &runtime.HTTPBodyMarshaler{Marshaler: &cachedMarshaler{Marshaler: hb.Marshaler, cache: c}}
	}
	return &cachedMarshaler{Marshaler: m, cache: c}
}
