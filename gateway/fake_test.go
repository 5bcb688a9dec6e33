package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// fakeBridge implements bridge.Service for transport-level tests: error
// mapping, framing, streaming and interceptors. It keeps documents in
// memory and follows the bridge's documented error contract.
type fakeBridge struct {
	mu   sync.Mutex
	docs map[string]*gatewayv1.Document
	next int

	notReady atomic.Pointer[error]
	closed   atomic.Bool

	// upload accounting
	uploadBytes   atomic.Int64
	uploadReads   atomic.Int64
	uploadMaxRead atomic.Int64
	uploadStarted chan struct{}
	uploadOnce    sync.Once

	log *fakeLog

	lastTenant atomic.Pointer[bridge.Tenant]

	// result, if set, answers Result for the ids it knows (ok).
	result func(id string) (ct string, size int64, rc io.ReadCloser, ok bool)
}

func newFakeBridge() *fakeBridge {
	return &fakeBridge{
		docs:          map[string]*gatewayv1.Document{},
		uploadStarted: make(chan struct{}),
		log:           &fakeLog{oldest: 10, latest: 20, live: make(chan *gatewayv1.Event, 16)},
	}
}

var _ bridge.Service = (*fakeBridge)(nil)

func (f *fakeBridge) add(state gatewayv1.State, size int) *gatewayv1.Document {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	id := fmt.Sprintf("doc-%d", f.next)
	d := &gatewayv1.Document{Name: "documents/" + id, Id: id, State: state, SizeBytes: uint64(size), CreateTime: timestamppb.Now()}
	f.docs[id] = d
	return d
}

func (f *fakeBridge) Submit(_ context.Context, t bridge.Tenant, req *gatewayv1.SubmitDocumentRequest) (*gatewayv1.Document, error) {
	f.lastTenant.Store(&t)
	if req.GetContentType() == "bad/type" {
		return nil, fmt.Errorf("contentType %q is not a MIME type: use e.g. text/plain: %w", req.GetContentType(), bridge.ErrInvalid)
	}
	if req.GetRequestId() == "reused" {
		return nil, fmt.Errorf("requestId \"reused\" was used with a different body: use a new requestId: %w", bridge.ErrConflict)
	}
	d := f.add(gatewayv1.State_PENDING, len(req.GetContent()))
	d.ContentType = req.GetContentType()
	return d, nil
}

func (f *fakeBridge) Upload(ctx context.Context, _ bridge.Tenant, opts *gatewayv1.SubmitOptions, r io.Reader) (*gatewayv1.Document, error) {
	if opts.GetRequestId() == "reused" {
		return nil, fmt.Errorf("requestId \"reused\" was used with a different body: use a new requestId: %w", bridge.ErrConflict)
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := r.Read(buf)
		if n > 0 && opts.GetRequestId() == "refuse-after-first-read" {
			return nil, fmt.Errorf("the content is refused after its first %d bytes: %w", n, bridge.ErrInvalid)
		}
		if n > 0 {
			f.uploadOnce.Do(func() { close(f.uploadStarted) })
			f.uploadBytes.Add(int64(n))
			f.uploadReads.Add(1)
			for {
				old := f.uploadMaxRead.Load()
				if int64(n) <= old || f.uploadMaxRead.CompareAndSwap(old, int64(n)) {
					break
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	d := f.add(gatewayv1.State_PENDING, int(f.uploadBytes.Load()))
	d.ContentType = opts.GetContentType()
	d.DisplayName = opts.GetDisplayName()
	d.RequestId = opts.GetRequestId()
	d.Split = opts.GetSplit()
	d.CompletionPolicy = opts.GetCompletionPolicy()
	d.Metadata = opts.GetMetadata()
	return d, nil
}

func (f *fakeBridge) get(id string) (*gatewayv1.Document, error) {
	if id == "panic" {
		panic("fake bridge: boom")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.docs[id]
	if !ok {
		return nil, fmt.Errorf("document %q: %w: check the id returned by SubmitDocument", id, bridge.ErrNotFound)
	}
	return d, nil
}

func (f *fakeBridge) GetDocument(_ context.Context, _ bridge.Tenant, id string, _ bool) (*gatewayv1.Document, error) {
	return f.get(id)
}

func (f *fakeBridge) ListDocuments(context.Context, bridge.Tenant, *gatewayv1.ListDocumentsRequest) (*gatewayv1.ListDocumentsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &gatewayv1.ListDocumentsResponse{}
	for _, d := range f.docs {
		resp.Documents = append(resp.Documents, d)
	}
	return resp, nil
}

func (f *fakeBridge) Result(_ context.Context, _ bridge.Tenant, id string) (string, int64, io.ReadCloser, error) {
	if f.result != nil {
		if ct, size, rc, ok := f.result(id); ok {
			return ct, size, rc, nil
		}
	}
	d, err := f.get(id)
	if err != nil {
		return "", 0, nil, err
	}
	if d.GetState() != gatewayv1.State_SUCCEEDED {
		return "", 0, nil, fmt.Errorf("document %s is %s: wait until it is SUCCEEDED: %w", id, d.GetState(), bridge.ErrFailedPrecondition)
	}
	body := []byte("result of " + id)
	return "text/plain", int64(len(body)), io.NopCloser(bytes.NewReader(body)), nil
}

func (f *fakeBridge) Cancel(_ context.Context, _ bridge.Tenant, id string) (*gatewayv1.Document, error) {
	d, err := f.get(id)
	if err != nil {
		return nil, err
	}
	if d.GetState() >= gatewayv1.State_SUCCEEDED {
		return nil, fmt.Errorf("document %s is already %s and cannot be cancelled: %w", id, d.GetState(), bridge.ErrFailedPrecondition)
	}
	d.State = gatewayv1.State_CANCELLED
	return d, nil
}

func (f *fakeBridge) GetClaim(_ context.Context, _ bridge.Tenant, claimID string) (*gatewayv1.ClaimCheck, error) {
	if claimID != "42" {
		return nil, fmt.Errorf("claim %s: %w", claimID, bridge.ErrNotFound)
	}
	return &gatewayv1.ClaimCheck{Name: "claims/42", ClaimId: "42", State: gatewayv1.ClaimCheck_ISSUED}, nil
}

func (f *fakeBridge) Redeem(_ context.Context, _ bridge.Tenant, claimID string) (*gatewayv1.ClaimCheck, error) {
	switch claimID {
	case "1":
		return nil, fmt.Errorf("claim 1 was redeemed already; a claim is redeemed exactly once: %w", bridge.ErrClaimRedeemed)
	case "2":
		return nil, fmt.Errorf("claim 2 expired; resubmit the document: %w", bridge.ErrClaimExpired)
	case "3":
		return nil, fmt.Errorf("claim 3 was issued by the PipeStream peer 10.0.0.7:4433, unreachable since 2026-01-01T00:00:00Z; retry the redemption in a few seconds: %w", bridge.ErrPeerUnavailable)
	case "42":
		return &gatewayv1.ClaimCheck{Name: "claims/42", ClaimId: "42", State: gatewayv1.ClaimCheck_REDEEMED}, nil
	}
	return nil, fmt.Errorf("claim %s: %w", claimID, bridge.ErrNotFound)
}

// Watch sends three updates (RUNNING, RUNNING, SUCCEEDED) then returns.
func (f *fakeBridge) Watch(ctx context.Context, _ bridge.Tenant, id string, cursor uint64, send func(*gatewayv1.WatchDocumentResponse) error) error {
	d, err := f.get(id)
	if err != nil {
		return err
	}
	bridge.SubscriptionStarted(ctx)
	states := []gatewayv1.State{gatewayv1.State_RUNNING, gatewayv1.State_RUNNING, gatewayv1.State_SUCCEEDED}
	for i, st := range states {
		ev := &gatewayv1.Event{Seq: cursor + uint64(i) + 1, Kind: "#document", DocumentId: id, State: st, Rev: uint64(i + 2), Since: uint64(i + 1)}
		doc := &gatewayv1.Document{Id: d.GetId(), State: st}
		if err := send(&gatewayv1.WatchDocumentResponse{Event: ev, Document: doc}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (f *fakeBridge) Events() bridge.EventLog { return f.log }

// Peers reports one peer, so /healthz has a peers member to check.
func (f *fakeBridge) Peers() []bridge.PeerStatus {
	return []bridge.PeerStatus{{Addr: "127.0.0.1:4433", State: "connected", Framing: "draft-02", Profile: true, InFlight: 2, Window: 64,
		LastError: "dial: timeout", Since: "2026-01-01T00:00:00Z"}}
}

func (f *fakeBridge) Ready() error {
	if p := f.notReady.Load(); p != nil {
		return *p
	}
	return nil
}

func (f *fakeBridge) Close(context.Context) error {
	f.closed.Store(true)
	return nil
}

// fakeLog keeps events oldest..latest; live events come from live.
type fakeLog struct {
	oldest, latest uint64
	live           chan *gatewayv1.Event
	tooSlow        atomic.Bool
	// payload, if set before the server starts, is every logged event's
	// message (tests that need many bytes in the window).
	payload string
	// waiting counts subscriptions waiting for live events: a test that
	// pushes one waits until earlier subscriptions ended, or one of those
	// could take it.
	waiting atomic.Int32
}

func (l *fakeLog) event(seq uint64) *gatewayv1.Event {
	return &gatewayv1.Event{Seq: seq, Time: timestamppb.New(time.Unix(1700000000, 0)), Kind: "#status",
		DocumentId: "doc-1", Rev: seq, Since: seq - 1, EntityId: 7, EntityStatus: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE,
		Message: l.payload}
}

func (l *fakeLog) Subscribe(ctx context.Context, _ bridge.Tenant, _ string, cursor *uint64, _ bridge.EventFilter, send func(*gatewayv1.Event) error) error {
	if cursor != nil {
		c := *cursor
		if c > l.latest {
			return fmt.Errorf("cursor %d, latest %d: %w", c, l.latest, bridge.ErrFutureCursor)
		}
	}
	bridge.SubscriptionStarted(ctx)
	if cursor != nil {
		c := *cursor
		if c != 0 && c < l.oldest {
			if err := send(&gatewayv1.Event{Time: timestamppb.Now(), Kind: "#info", Name: "OutdatedCursor",
				Message: fmt.Sprintf("cursor %d is older than the window (oldest %d)", c, l.oldest)}); err != nil {
				return err
			}
		}
		if c < l.oldest {
			c = l.oldest
		}
		for s := c; s <= l.latest; s++ {
			if err := send(l.event(s)); err != nil {
				return err
			}
		}
	}
	if l.tooSlow.Load() {
		return fmt.Errorf("subscriber is 1000 events behind: %w", bridge.ErrConsumerTooSlow)
	}
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-l.live:
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

func (l *fakeLog) Window(context.Context) (*gatewayv1.EventWindow, error) {
	return &gatewayv1.EventWindow{OldestSeq: l.oldest, LatestSeq: l.latest, RetainedEvents: l.latest - l.oldest + 1}, nil
}

func (l *fakeLog) Snapshot(context.Context, bridge.Tenant) (*gatewayv1.Snapshot, error) {
	return &gatewayv1.Snapshot{Seq: l.latest}, nil
}

func (l *fakeLog) StreamSnapshotEncoded(ctx context.Context, t bridge.Tenant, n int, _ bridge.SnapshotPosition, send func([]byte, bridge.SnapshotPosition) error) error {
	return l.StreamSnapshot(ctx, t, n, func(c *gatewayv1.SnapshotChunk) error {
		b, err := proto.Marshal(c)
		if err != nil {
			return err
		}
		return send(b, bridge.SnapshotPosition{})
	})
}

func (l *fakeLog) StreamSnapshot(_ context.Context, _ bridge.Tenant, _ int, send func(*gatewayv1.SnapshotChunk) error) error {
	return send(&gatewayv1.SnapshotChunk{Seq: l.latest, Last: true})
}
