package main

import (
	"os"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

const getHelp = `Print a document (state, entity counts, digests, claim checks, timestamps)
as JSON, in the same shape as GET /v1/documents/{id}.

Example:
  gateway get --entities 3f1c9a...`

func runGet(args []string) int {
	fs := newFlags("get", "gateway get [flags] ID", getHelp)
	cf := addClientFlags(fs)
	entities := fs.Bool("entities", "GATEWAY_ENTITIES", false, "include the entity tree")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	id, ok := oneArg(fs, "document ID")
	if !ok {
		return 2
	}
	c, err := cf.dial()
	if err != nil {
		return fail(os.Stderr, "get", err)
	}
	defer c.Close()
	doc, err := c.docs.GetDocument(c.ctx, &gatewayv1.GetDocumentRequest{Id: id, IncludeEntities: *entities})
	if err != nil {
		return fail(os.Stderr, "get", rpcError(err))
	}
	if err := printJSON(doc); err != nil {
		return fail(os.Stderr, "get", err)
	}
	return 0
}
