package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// mapStoreErr turns store errors into bridge errors with a message.
func mapStoreErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%s does not exist: %w", what, ErrNotFound)
	case errors.Is(err, store.ErrBadPageToken):
		return fmt.Errorf("pageToken is not from a previous ListDocuments with the same filter: %w", ErrInvalid)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("the gateway is shutting down: %w", ErrUnavailable)
	case errors.Is(err, store.ErrClaimRedeemed):
		return fmt.Errorf("%s was already redeemed (a claim is redeemed exactly once): %w", what, ErrClaimRedeemed)
	case errors.Is(err, store.ErrClaimCancelled):
		return fmt.Errorf("%s was cancelled: its document ended before the claim was redeemed, so nothing waits for the deferred entity: %w", what, ErrClaimCancelled)
	case errors.Is(err, store.ErrClaimExpired):
		return fmt.Errorf("%s has expired; the deferred entity was abandoned: %w", what, ErrClaimExpired)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// GetDocument returns the stored document (entity tree when withEntities).
func (b *Bridge) GetDocument(ctx context.Context, t Tenant, id string, withEntities bool) (*gatewayv1.Document, error) {
	if id == "" {
		return nil, invalidf("document id is empty")
	}
	rec, err := b.st.GetDocument(ctx, string(t), id, withEntities)
	if err != nil {
		return nil, mapStoreErr("document "+id, err)
	}
	return b.publicDoc(rec), nil
}

// ListDocuments returns one page of the tenant's documents, newest first.
func (b *Bridge) ListDocuments(ctx context.Context, t Tenant, req *gatewayv1.ListDocumentsRequest) (*gatewayv1.ListDocumentsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, invalidf("pageSize must not be negative")
	}
	if _, ok := gatewayv1.State_name[int32(req.GetState())]; !ok {
		return nil, invalidf("state %d is unknown", req.GetState())
	}
	recs, next, err := b.st.ListDocuments(ctx, string(t), store.ListQuery{State: req.GetState(), PageSize: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if err != nil {
		return nil, mapStoreErr("list documents", err)
	}
	out := &gatewayv1.ListDocumentsResponse{NextPageToken: next}
	for _, r := range recs {
		out.Documents = append(out.Documents, b.publicDoc(r))
	}
	return out, nil
}

// Result opens the rehydrated output of a SUCCEEDED or PARTIALLY_SUCCEEDED
// document: the inline row (ResultPayload false, content.go) or the
// streamed result payload (an io.ReadSeeker too, for ranged serving).
func (b *Bridge) Result(ctx context.Context, t Tenant, id string) (string, int64, io.ReadCloser, error) {
	rec, err := b.st.GetDocument(ctx, string(t), id, false)
	if err != nil {
		return "", 0, nil, mapStoreErr("document "+id, err)
	}
	switch s := rec.Doc.GetState(); s {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED:
	default:
		return "", 0, nil, fmt.Errorf("document %s is %s; the result exists once it is SUCCEEDED or PARTIALLY_SUCCEEDED: %w", id, s, ErrFailedPrecondition)
	}
	if rec.Doc.GetResultAbsent() {
		return "", 0, nil, fmt.Errorf("document %s SUCCEEDED without a result: the peer returned none (it does not speak this project's profile; docs/profile.md 9): %w", id, ErrResultAbsent)
	}
	ct := rec.ResultContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	if !rec.ResultPayload {
		body, err := b.st.GetPayload(ctx, string(t), id, store.PayloadResult)
		if err != nil {
			return "", 0, nil, fmt.Errorf("document %s: stored result: %w", id, err)
		}
		return ct, int64(len(body)), io.NopCloser(bytes.NewReader(body)), nil
	}
	f, err := b.st.OpenPayload(ctx, id, store.PayloadResult)
	if err != nil {
		return "", 0, nil, fmt.Errorf("document %s: stored result: %w", id, err)
	}
	return ct, f.Size(), f, nil
}

// Cancel cancels a non-terminal document (profile 7): CANCELLED, the peer is
// told ABANDONED (Layer 2) or FAILED, open streams are reset.
func (b *Bridge) Cancel(ctx context.Context, t Tenant, id string) (*gatewayv1.Document, error) {
	rec, err := b.st.GetDocument(ctx, string(t), id, false)
	if err != nil {
		return nil, mapStoreErr("document "+id, err)
	}
	d := lockDocOf(b.reg, func() *docRun { return b.docs[id] })
	if d == nil || d.terminal() {
		state := rec.Doc.GetState()
		if d != nil {
			state = d.rec.Doc.GetState()
		}
		unlockFound(d)
		if d == nil && b.shared() && !store.IsTerminal(state) {
			return b.cancelElsewhere(ctx, t, id) // remotecancel.go
		}
		return nil, fmt.Errorf("document %s is already %s; only PENDING or RUNNING documents can be cancelled: %w", id, state, ErrFailedPrecondition)
	}
	if ss, a := d.sess(), d.att; ss != nil && !b.sessClosed(ss) {
		b.sendCancelLocked(ss, d)
		if e := a.ents[rootKey(a.rootID)]; e != nil && a.rootID != 0 {
			e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_ABANDONED
			if !ss.n.Layer2 {
				e.Status = gatewayv1.EntityStatus_ENTITY_STATUS_FAILED
			}
			e.Message = "cancelled by the client"
			d.setEntity(rootKey(a.rootID), e)
		}
	}
	d.finishLocked(gatewayv1.State_CANCELLED, "cancelled by the client")
	snap := d.snapshot()
	out := b.publicDoc(snap)
	d.unlock()
	// Read your writes: answer once the cancel is durable, so that the
	// next GetDocument or GetOperation, on any replica, shows it.
	if err := b.waitDurable(ctx, d, snap.Doc.GetRev()); err != nil {
		return nil, err
	}
	return out, nil
}
