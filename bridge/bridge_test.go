package bridge_test

import (
	"bytes"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

func TestSmallDocumentPassthrough(t *testing.T) {
	e := newEnv(t)
	e.waitReady()
	content := []byte("hello, pipestream\n")
	doc := e.submit(content, &gatewayv1.SubmitDocumentRequest{ContentType: "text/plain"})
	if doc.State != gatewayv1.State_PENDING && doc.State != gatewayv1.State_RUNNING {
		t.Fatalf("state after submit %s", doc.State)
	}
	got := e.wait(doc.Id, 10*time.Second)
	if got.State != gatewayv1.State_SUCCEEDED {
		t.Fatalf("state %s error %q", got.State, got.Error)
	}
	if res := e.result(doc.Id); !bytes.Equal(res, content) {
		t.Fatalf("result %q, want %q", res, content)
	}
}
