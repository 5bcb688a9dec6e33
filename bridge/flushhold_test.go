package bridge_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// Progress is held back for flushHold to ride with the document's next
// change, but never longer: a document that stays PROCESSING still gets
// its RUNNING and #status PROCESSING events committed (and published)
// without any further change.
func TestHeldProgressCommitsWithoutFurtherChange(t *testing.T) {
	p, b := newScriptedEnv(t, false)
	req := wholeReq()
	req.Content = []byte("held")
	d, err := b.Submit(context.Background(), "", req)
	must(t, err)
	a := p.next(t)
	status(t, a.s, wire.StatusProcessing, a.h.EntityID, 0, 0)

	start := time.Now()
	defer func() { t.Logf("events after %v", time.Since(start)) }()
	var running, processing bool
	err = b.Events().Subscribe(ctxTimeout(t, 5*time.Second), "", "held", new(uint64), bridge.EventFilter{DocumentID: d.Id}, func(ev *gatewayv1.Event) error {
		switch {
		case ev.Kind == "#document" && ev.State == gatewayv1.State_RUNNING:
			running = true
		case ev.Kind == "#status" && ev.EntityStatus == gatewayv1.EntityStatus_ENTITY_STATUS_PROCESSING:
			processing = true
		}
		if running && processing {
			return io.EOF
		}
		return nil
	})
	if !running || !processing {
		t.Fatalf("RUNNING event %v, PROCESSING event %v, want both committed while the document stays PROCESSING (%v)", running, processing, err)
	}
}
