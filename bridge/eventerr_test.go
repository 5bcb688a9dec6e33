package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// A future cursor is refused with one FutureCursor error whose message
// names the condition once and says which cursor to use instead (latest
// seq N given), for Subscribe and Watch alike.
func TestFutureCursorMessage(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	doc := e.submit([]byte("hello"), nil)
	e.wait(doc.Id, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := e.b.Events().Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	latest := w.GetLatestSeq()
	if latest == 0 {
		t.Fatal("no events after a finished document")
	}
	future := latest + 1000
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, bridge.ErrFutureCursor) {
			t.Fatalf("%s: err = %v, want ErrFutureCursor", what, err)
		}
		msg := err.Error()
		if n := strings.Count(msg, "FutureCursor"); n != 1 {
			t.Errorf("%s: message names FutureCursor %d times, want once: %q", what, n, msg)
		}
		if n := strings.Count(msg, "ahead of the latest"); n != 1 {
			t.Errorf("%s: message says \"ahead of the latest\" %d times, want once: %q", what, n, msg)
		}
		if want := fmt.Sprintf("cursor <= %d", latest); !strings.Contains(msg, want) {
			t.Errorf("%s: message %q does not say %q", what, msg, want)
		}
	}
	err = e.b.Events().Subscribe(ctx, "", "k", &future, bridge.EventFilter{}, func(*gatewayv1.Event) error { return nil })
	check("Subscribe", err)
	err = e.b.Watch(ctx, "", doc.Id, future, func(*gatewayv1.WatchDocumentResponse) error { return nil })
	check("Watch", err)
}
