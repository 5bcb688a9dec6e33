package storetest

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// SmallDocumentLifecycle commits what the bridge commits for one small
// document from submit to SUCCEEDED, for the backends' benchmarks: the
// Create batch (with its creation event), an update to RUNNING (entity + 2
// events) and the terminal update (entity + 3 events). Inline, the content
// rides in the Create batch and the result in the terminal batch (which
// deletes the content row); streamed, each is a streamed payload written
// and synced before its batch.
func SmallDocumentLifecycle(ctx context.Context, s Store, id string, content []byte, streamed bool) error {
	rec := lifecycleDoc(id, time.Now())
	create := &store.Batch{Create: rec, Events: []store.EventAppend{lifecycleEvent("#document", id, 1)}}
	if !streamed {
		rec.ContentPayload = false
		create.Payloads = []store.PayloadRecord{{DocID: id, Kind: store.PayloadContent, Body: content}}
	} else if err := syncedPayload(ctx, s, id, store.PayloadContent, content); err != nil {
		return err
	}
	if _, err := s.Commit(ctx, create); err != nil {
		return err
	}
	ent := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING, SizeBytes: uint64(len(content))}
	for rev, st := range []gatewayv1.State{gatewayv1.State_RUNNING, gatewayv1.State_SUCCEEDED} {
		up := lifecycleDoc(id, rec.Doc.CreateTime.AsTime())
		up.Doc.State, up.Doc.Rev = st, 3
		bt := &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: uint64(1 + rev*2)}},
			Entities: []store.EntityRecord{{DocID: id, Entity: ent}}}
		for e := range 2 + rev {
			bt.Events = append(bt.Events, lifecycleEvent("#status", id, uint64(2+rev*2+e)))
		}
		if st == gatewayv1.State_SUCCEEDED {
			up.Doc.Rev = 6
			if !streamed {
				up.ContentPayload = false
				bt.Payloads = []store.PayloadRecord{{DocID: id, Kind: store.PayloadResult, Body: content}, {DocID: id, Kind: store.PayloadContent}}
			} else if err := syncedPayload(ctx, s, id, store.PayloadResult, content); err != nil {
				return err
			}
		}
		if _, err := s.Commit(ctx, bt); err != nil {
			return err
		}
	}
	return nil
}

func lifecycleDoc(id string, created time.Time) *store.DocumentRecord {
	return &store.DocumentRecord{
		Tenant: "t",
		Doc: &gatewayv1.Document{
			Name: "documents/" + id, Id: id, State: gatewayv1.State_PENDING, Rev: 1,
			ContentType: "text/plain", CreateTime: timestamppb.New(created), UpdateTime: timestamppb.New(created),
		},
		BodyHash:       []byte("hash-" + id),
		ContentPayload: true,
	}
}

func lifecycleEvent(kind, docID string, rev uint64) store.EventAppend {
	return store.EventAppend{Tenant: "t", Event: &gatewayv1.Event{Time: timestamppb.Now(), Kind: kind, DocumentId: docID, Rev: rev, Since: rev - 1}}
}

// syncedPayload writes p to a new streamed payload and syncs it.
func syncedPayload(ctx context.Context, s Store, docID string, kind store.PayloadKind, p []byte) error {
	w, err := s.CreatePayload(ctx, docID, kind)
	if err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		w.Abort()
		return err
	}
	return w.Sync()
}

// GatewayDocumentLifecycle commits what the gateway's bridge committed per
// small document in `gateway bench --only small` (counted statement by
// statement in the SQLite writer, issue 25): the Create batch with the
// inline content and the creation event, then one terminal batch (the
// RUNNING progress is held and rides with it: flushHold) with the document
// update, the entity, the inline result, the deletion of the content row
// and 5 events. The bridge puts many documents' terminal updates in one
// flush batch; the writer groups batches into one transaction either way.
func GatewayDocumentLifecycle(ctx context.Context, s Store, id string, content []byte) error {
	rec := lifecycleDoc(id, time.Now())
	rec.ContentPayload = false
	create := &store.Batch{Create: rec, Events: []store.EventAppend{lifecycleEvent("#document", id, 1)},
		Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadContent, Body: content}}}
	if _, err := s.Commit(ctx, create); err != nil {
		return err
	}
	up := lifecycleDoc(id, rec.Doc.CreateTime.AsTime())
	up.ContentPayload = false
	up.Doc.State, up.Doc.Rev = gatewayv1.State_SUCCEEDED, 6
	ent := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE, SizeBytes: uint64(len(content))}
	bt := &store.Batch{Updates: []store.DocumentUpdate{{Record: up, PrevRev: 1}},
		Entities: []store.EntityRecord{{DocID: id, Entity: ent}},
		Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadResult, Body: content}, {DocID: id, Kind: store.PayloadContent}}}
	for e := range 5 {
		bt.Events = append(bt.Events, lifecycleEvent("#status", id, uint64(2+e)))
	}
	_, err := s.Commit(ctx, bt)
	return err
}

// GatewayRidingLifecycle commits what the bridge commits for a small
// document whose creation rides with its result (bridge/ridecreate.go,
// session 18): one Create batch holding the document in its terminal
// state, its entity, the inline result and its 6 events; no content row.
func GatewayRidingLifecycle(ctx context.Context, s Store, id string, content []byte) error {
	rec := lifecycleDoc(id, time.Now())
	rec.ContentPayload = false
	rec.BodyHash = nil // no request id
	rec.Doc.State, rec.Doc.Rev = gatewayv1.State_SUCCEEDED, 6
	ent := &gatewayv1.Entity{EntityId: 1, Status: gatewayv1.EntityStatus_ENTITY_STATUS_COMPLETE, SizeBytes: uint64(len(content))}
	bt := &store.Batch{Create: rec, Entities: []store.EntityRecord{{DocID: id, Entity: ent}},
		Payloads: []store.PayloadRecord{{DocID: id, Kind: store.PayloadResult, Body: content}},
		Events:   []store.EventAppend{lifecycleEvent("#document", id, 1)}}
	for e := range 5 {
		bt.Events = append(bt.Events, lifecycleEvent("#status", id, uint64(2+e)))
	}
	_, err := s.Commit(ctx, bt)
	return err
}
