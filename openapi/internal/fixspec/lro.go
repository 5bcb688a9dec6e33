package main

import "errors"

// addLongRunning documents the REST routes of google.longrunning.Operations
// (gateway/operations_http.go, docs/operations.md). They are hand-written
// over grpc-gateway's runtime, not generated from a proto of ours, so the
// generator does not see them.
func addLongRunning(paths, defs obj) error {
	if _, ok := defs["State"]; !ok {
		return errors.New("generated spec lacks definition State: update openapi/internal/fixspec with the proto")
	}
	// protoc-gen-openapiv2 emits only messages that an RPC reaches, and
	// ResultRef (gateway.proto) is reached only through the Any of an
	// Operation: its schema is written here, field for field.
	defs["ResultRef"] = obj{
		"type":        "object",
		"description": "The response of a done Operation whose document SUCCEEDED or PARTIALLY_SUCCEEDED: where its result is, not its bytes.",
		"properties": obj{
			"documentId":  obj{"type": "string", "description": "The document the operation tracks."},
			"document":    obj{"type": "string", "description": "Resource name of the document: documents/{id}."},
			"resultPath":  obj{"type": "string", "description": "REST path of the result bytes (GET); empty when the peer returned no result (resultAbsent)."},
			"sizeBytes":   obj{"type": "string", "format": "uint64", "description": "Size of the rehydrated result in bytes."},
			"contentType": obj{"type": "string", "description": "Media type of the result."},
			"state":       obj{"$ref": "#/definitions/State"},
		},
	}
	defs["Operation"] = obj{
		"type": "object",
		"description": "A google.longrunning.Operation over a document: `operations/{id}`, id = the document id. " +
			"`metadata` is the Document (`@type` type.googleapis.com/pipestream.gateway.v1.Document). Once `done`, either `response` " +
			"(a ResultRef, `@type` type.googleapis.com/pipestream.gateway.v1.ResultRef: the document SUCCEEDED or PARTIALLY_SUCCEEDED) " +
			"or `error` (google.rpc.Status: code 1 CANCELLED for a cancelled document, 13 INTERNAL with the document's error for a FAILED one) is set.",
		"properties": obj{
			"name":     obj{"type": "string", "description": "operations/{id}."},
			"metadata": obj{"$ref": "#/definitions/Any"},
			"done":     obj{"type": "boolean", "description": "True once the document is in a terminal state."},
			"error":    obj{"$ref": "#/definitions/Status"},
			"response": obj{"$ref": "#/definitions/Any"},
		},
		"example": obj{"name": "operations/d-7f3a9c2e", "done": true,
			"metadata": obj{"@type": "type.googleapis.com/pipestream.gateway.v1.Document", "id": "d-7f3a9c2e", "state": "SUCCEEDED"},
			"response": obj{"@type": "type.googleapis.com/pipestream.gateway.v1.ResultRef", "documentId": "d-7f3a9c2e",
				"document": "documents/d-7f3a9c2e", "resultPath": "/v1/documents/d-7f3a9c2e/result", "sizeBytes": "412",
				"contentType": "application/json", "state": "SUCCEEDED"}},
	}
	defs["ListOperationsResponse"] = obj{"type": "object", "properties": obj{
		"operations":    obj{"type": "array", "items": obj{"$ref": "#/definitions/Operation"}},
		"nextPageToken": obj{"type": "string", "description": "Pass as pageToken for the next page; empty on the last."},
		"unreachable": obj{"type": "array", "items": obj{"type": "string"},
			"description": "Resources that could not be listed (google.longrunning; always empty here: every operation is a document of this gateway)."},
	}}
	// ResultRef is only reached through Any; keep it in the spec.
	defs["Operation"].(obj)["x-response-type"] = obj{"$ref": "#/definitions/ResultRef"}
	status := obj{"$ref": "#/definitions/Status"}
	opResp := func(desc string, schema obj, errs obj) obj {
		r := obj{"200": obj{"description": desc, "schema": schema}, "default": obj{"description": "An unexpected error response.", "schema": status}}
		for k, v := range errs {
			r[k] = obj{"description": v, "schema": status}
		}
		return r
	}
	op := obj{"$ref": "#/definitions/Operation"}
	idParam := obj{"name": "id", "in": "path", "required": true, "type": "string", "description": "The document id (operation operations/{id})."}
	notFound := obj{"404": "NotFound: no such document for this tenant."}
	tags := []any{"google.longrunning.Operations"}
	paths["/v1/operations"] = obj{"get": obj{
		"tags": tags, "operationId": "Operations_ListOperations", "summary": "List operations",
		"description": "The caller's operations, one per document, newest first, in pages (ListDocuments' order and page tokens).",
		"parameters": []any{
			obj{"name": "pageSize", "in": "query", "required": false, "type": "integer", "format": "int32"},
			obj{"name": "pageToken", "in": "query", "required": false, "type": "string"},
			obj{"name": "filter", "in": "query", "required": false, "type": "string", "description": "Not supported: must be empty."},
		},
		"responses": opResp("A page of operations.", obj{"$ref": "#/definitions/ListOperationsResponse"},
			obj{"400": "InvalidArgument: a filter, or a bad pageToken or pageSize."}),
	}}
	paths["/v1/operations/{id}"] = obj{"get": obj{
		"tags": tags, "operationId": "Operations_GetOperation", "summary": "Get an operation",
		"description": "The operation of document {id}: metadata is the Document; once done, response is a ResultRef or error a google.rpc.Status.",
		"parameters":  []any{idParam}, "responses": opResp("The operation.", op, notFound),
	}, "delete": obj{
		"tags": tags, "operationId": "Operations_DeleteOperation", "summary": "Delete an operation (not supported)",
		"description": "Always 501 UNIMPLEMENTED: an operation is its document, which the gateway keeps. Use :cancel to stop it.",
		"parameters":  []any{idParam}, "responses": opResp("Never answered.", obj{"type": "object"}, obj{"501": "Unimplemented: operations are not deleted."}),
	}}
	paths["/v1/operations/{id}:wait"] = obj{"post": obj{
		"tags": tags, "operationId": "Operations_WaitOperation", "summary": "Wait for an operation",
		"description": "Returns when the document is terminal or after `timeout` (at most 60 s, also the default), whichever is first; the operation is then not done yet and the client waits again.",
		"parameters": []any{idParam, obj{"name": "body", "in": "body", "required": false, "schema": obj{"type": "object", "properties": obj{
			"timeout": obj{"type": "string", "description": "A duration such as \"30s\"."}}}}},
		"responses": opResp("The operation, done or not.", op, obj{"400": "InvalidArgument: a bad timeout.", "404": "NotFound: no such document for this tenant."}),
	}}
	paths["/v1/operations/{id}:cancel"] = obj{"post": obj{
		"tags": tags, "operationId": "Operations_CancelOperation", "summary": "Cancel an operation",
		"description": "Cancels document {id} (as CancelDocument); the operation then becomes done with error code 1 CANCELLED. The body is ignored.",
		"parameters":  []any{idParam, obj{"name": "body", "in": "body", "required": false, "schema": obj{"type": "object"}}},
		"responses": opResp("Cancelled: the operation is done with error CANCELLED.", obj{"type": "object"},
			obj{"400": "FailedPrecondition: the document is already terminal.", "404": "NotFound: no such document for this tenant."}),
	}}
	return nil
}
