package main

import (
	"fmt"
	"os"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const resultHelp = `Write the rehydrated result bytes of a SUCCEEDED or PARTIALLY_SUCCEEDED
document to stdout, or to -o FILE.

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
	body, err := c.docs.GetDocumentResult(c.ctx, &gatewayv1.GetDocumentResultRequest{Id: id})
	if err != nil {
		return fail(os.Stderr, "result", rpcError(err))
	}
	if *out == "" {
		if _, err := os.Stdout.Write(body.GetData()); err != nil {
			return fail(os.Stderr, "result", err)
		}
		return 0
	}
	if err := os.WriteFile(*out, body.GetData(), 0o644); err != nil {
		return fail(os.Stderr, "result", err)
	}
	fmt.Fprintf(os.Stderr, "wrote %d bytes (%s) to %s\n", len(body.GetData()), body.GetContentType(), *out)
	return 0
}
