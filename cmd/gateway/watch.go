package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const watchHelp = `Print one line per update of a document until it reaches a terminal state
(SUCCEEDED, PARTIALLY_SUCCEEDED, FAILED, CANCELLED). Exit status 0 when it
SUCCEEDED or PARTIALLY_SUCCEEDED, 3 when it FAILED or was CANCELLED.

Example:
  gateway watch 3f1c9a...
  gateway watch --json --cursor 120 3f1c9a...   # resume from event seq 120`

func runWatch(args []string) int {
	fs := newFlags("watch", "gateway watch [flags] ID", watchHelp)
	cf := addClientFlags(fs)
	asJSON := fs.Bool("json", "GATEWAY_JSON", false, "print each update as one JSON object (NDJSON)")
	cursor := fs.Uint("cursor", "GATEWAY_CURSOR", 0, "resume from this event seq (inclusive); 0 starts with the current state")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	id, ok := oneArg(fs, "document ID")
	if !ok {
		return 2
	}
	c, err := cf.dial()
	if err != nil {
		return fail(os.Stderr, "watch", err)
	}
	defer c.Close()
	stream, err := c.docs.WatchDocument(c.ctx, &gatewayv1.WatchDocumentRequest{Id: id, Cursor: uint64(*cursor)})
	if err != nil {
		return fail(os.Stderr, "watch", rpcError(err))
	}
	var last gatewayv1.State
	for {
		u, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(os.Stderr, "watch", rpcError(err))
		}
		last = u.GetDocument().GetState()
		if *asJSON {
			b, _ := protojson.Marshal(u)
			fmt.Println(string(b))
			continue
		}
		fmt.Println(describeUpdate(u))
	}
	switch last {
	case gatewayv1.State_SUCCEEDED, gatewayv1.State_PARTIALLY_SUCCEEDED:
		return 0
	case gatewayv1.State_FAILED, gatewayv1.State_CANCELLED:
		return 3
	}
	return fail(os.Stderr, "watch", fmt.Errorf("stream ended with the document in state %s", last))
}

// describeUpdate renders one update as "seq=12 #status entity=3 COMPLETE doc=RUNNING 2/4 complete".
func describeUpdate(u *gatewayv1.WatchDocumentResponse) string {
	ev, d := u.GetEvent(), u.GetDocument()
	var b strings.Builder
	if ev.GetKind() == "" {
		b.WriteString("current")
	} else {
		fmt.Fprintf(&b, "seq=%d %s", ev.GetSeq(), ev.GetKind())
	}
	switch ev.GetKind() {
	case "#status":
		fmt.Fprintf(&b, " entity=%d scope=%d %s", ev.GetEntityId(), ev.GetScopeId(),
			strings.TrimPrefix(ev.GetEntityStatus().String(), "ENTITY_STATUS_"))
	case "#claim":
		fmt.Fprintf(&b, " claim=%s %s", ev.GetClaimId(), ev.GetClaimAction())
	case "#info":
		fmt.Fprintf(&b, " %s: %s", ev.GetName(), ev.GetMessage())
	}
	n := d.GetEntityCounts()
	fmt.Fprintf(&b, " doc=%s %d/%d complete", d.GetState(), n.GetComplete(), n.GetTotal())
	if n.GetFailed() > 0 {
		fmt.Fprintf(&b, " %d failed", n.GetFailed())
	}
	if d.GetError() != "" {
		fmt.Fprintf(&b, " error=%q", d.GetError())
	}
	return b.String()
}
