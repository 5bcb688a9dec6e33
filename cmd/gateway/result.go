package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/genproto/googleapis/api/httpbody"
	"google.golang.org/grpc"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const resultHelp = `Write the rehydrated result bytes of a SUCCEEDED or PARTIALLY_SUCCEEDED
document to stdout, or to -o FILE. The result is streamed, so it may be of
any size; with -o, FILE appears only once the whole result arrived.

Example:
  gateway result -o stats.json 3f1c9a...`

func runResult(args []string) int {
	fs := newFlags("result", "gateway result [flags] ID", resultHelp)
	cf := addClientFlags(fs)
	out := fs.String("o", "GATEWAY_OUTPUT", "", "write to this file instead of stdout")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	id, ok := oneArg(fs, "document ID")
	if !ok {
		return 2
	}
	c, err := cf.dial()
	if err != nil {
		return fail(os.Stderr, "result", err)
	}
	defer c.Close()
	stream, err := c.docs.GetDocumentResult(c.ctx, &gatewayv1.GetDocumentResultRequest{Id: id})
	if err != nil {
		return fail(os.Stderr, "result", rpcError(err))
	}
	if *out == "" {
		if _, _, err := copyResult(os.Stdout, stream); err != nil {
			return fail(os.Stderr, "result", err)
		}
		return 0
	}
	// Write next to FILE, rename when complete: a failed download never
	// leaves a truncated FILE behind.
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".part-*")
	if err != nil {
		return fail(os.Stderr, "result", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: gone already
	n, ct, err := copyResult(tmp, stream)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), *out)
	}
	if err != nil {
		return fail(os.Stderr, "result", err)
	}
	fmt.Fprintf(os.Stderr, "wrote %d bytes (%s) to %s\n", n, ct, *out)
	return 0
}

// copyResult writes the chunks of a GetDocumentResult stream to w in order
// and returns the byte count and the content type (first message).
func copyResult(w io.Writer, stream grpc.ServerStreamingClient[httpbody.HttpBody]) (int64, string, error) {
	var n int64
	var ct string
	for first := true; ; first = false {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return n, ct, nil
		}
		if err != nil {
			return n, ct, fmt.Errorf("after %d bytes: %w", n, rpcError(err))
		}
		if first {
			ct = m.GetContentType()
		}
		k, err := w.Write(m.GetData())
		n += int64(k)
		if err != nil {
			return n, ct, err
		}
	}
}
