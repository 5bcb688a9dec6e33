package e2e

import (
	"bytes"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// TestCLIVerbs drives the gateway binary's client verbs against a running
// gateway: submit prints an id, watch ends at a terminal state with the
// documented exit status, result writes the bytes, get prints the document
// as JSON, redeem redeems a claim.
func TestCLIVerbs(t *testing.T) {
	g := shared(t)
	in := textCorpus(300 << 10)
	path := writeTemp(t, "cli-input.txt", in)

	out, errb, code := cli(t, g, "submit", "--split", "lines", "--chunk-bytes", "65536", path)
	if code != 0 {
		t.Fatalf("gateway submit: exit %d: %s", code, errb)
	}
	id := strings.TrimSpace(string(out))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("gateway submit printed %q, want exactly the document id", out)
	}

	out, errb, code = cli(t, g, "watch", id)
	lines := scanLines(out)
	if code != 0 || len(lines) == 0 || !strings.Contains(lines[len(lines)-1], "SUCCEEDED") {
		t.Fatalf("gateway watch %s: exit %d, want 0 and a last line at SUCCEEDED\nstdout:\n%s\nstderr:\n%s", id, code, out, errb)
	}

	out, errb, code = cli(t, g, "result", id)
	if code != 0 || !bytes.Equal(out, in) {
		t.Fatalf("gateway result %s: exit %d, %d bytes (want the %d input bytes)\nstderr: %s", id, code, len(out), len(in), errb)
	}

	out, errb, code = cli(t, g, "get", id)
	if code != 0 {
		t.Fatalf("gateway get %s: exit %d: %s", id, code, errb)
	}
	d := &gatewayv1.Document{}
	decode(t, out, d)
	if d.GetId() != id || d.GetState() != gatewayv1.State_SUCCEEDED || d.GetDisplayName() != "cli-input.txt" || d.GetSizeBytes() != uint64(len(in)) {
		t.Errorf("gateway get: id %s state %v displayName %q size %d; want %s SUCCEEDED cli-input.txt %d",
			d.GetId(), d.GetState(), d.GetDisplayName(), d.GetSizeBytes(), id, len(in))
	}

	// A failing document: watch exits 3.
	failing := submitREST(t, g, map[string]any{"content": b64([]byte("fail me")), "split": map[string]any{"processor": "fault"},
		"metadata": map[string]string{"pipestream.fault": "fail"}})
	out, errb, code = cli(t, g, "watch", failing.GetId())
	if code != 3 {
		t.Errorf("gateway watch of a FAILED document: exit %d, want 3\nstdout:\n%s\nstderr:\n%s", code, out, errb)
	}

	// Unknown id: non-zero exit and a NotFound message on stderr.
	_, errb, code = cli(t, g, "result", "no-such-document")
	if code == 0 || !strings.Contains(string(errb), "NotFound") {
		t.Errorf("gateway result of an unknown id: exit %d, stderr %q; want non-zero and NotFound", code, errb)
	}

	// redeem: a claim issued for a document submitted over REST.
	dd := submitREST(t, g, deferredDoc([]byte("redeem via cli"), time.Minute, nil, nil))
	claim := awaitClaims(t, g, dd.GetId(), 1).GetClaimChecks()[0].GetClaimId()
	out, errb, code = cli(t, g, "redeem", claim)
	if code != 0 {
		t.Fatalf("gateway redeem %s: exit %d: %s", claim, code, errb)
	}
	cc := &gatewayv1.ClaimCheck{}
	decode(t, out, cc)
	if cc.GetState() != gatewayv1.ClaimCheck_REDEEMED {
		t.Errorf("gateway redeem printed state %v, want REDEEMED", cc.GetState())
	}
	if fin := awaitREST(t, g, dd.GetId()); fin.GetState() != gatewayv1.State_SUCCEEDED {
		t.Errorf("document after CLI redemption: %v, want SUCCEEDED", fin.GetState())
	}
	_, errb, code = cli(t, g, "redeem", claim)
	if code == 0 || !strings.Contains(string(errb), "CLAIM_ALREADY_REDEEMED") && !strings.Contains(string(errb), "FailedPrecondition") {
		t.Errorf("gateway redeem replay: exit %d stderr %q; want non-zero FailedPrecondition", code, errb)
	}
}
