// Package gateway is the public API of PipeStream: gRPC services over
// bridge.Service (DocumentService, EventService and
// google.longrunning.Operations over documents, docs/operations.md), the
// grpc-gateway REST mux (which dials the gRPC listener over a real client
// connection, so server streams become NDJSON), the
// streaming upload route, the AT-sync WebSocket event stream, health,
// metrics, docs, and graceful shutdown (docs/architecture.md: "Public API",
// "Event log" and "Security and limits").
//
// Routes (HTTP listener):
//
//	POST /v1/documents                  SubmitDocument (JSON, base64 content)
//	POST /v1/documents:upload           raw body -> UploadDocument stream; options as query params; 413 over the limit
//	GET  /v1/documents[/{id}]           ListDocuments / GetDocument
//	GET  /v1/documents/{id}:watch       WatchDocument, NDJSON
//	GET  /v1/documents/{id}/result      GetDocumentResult stream as raw bytes, with Content-Length (result_http.go)
//	POST /v1/documents/{id}:cancel      CancelDocument
//	GET  /v1/claims/{id}, POST :redeem  GetClaimCheck / RedeemClaimCheck
//	GET  /v1/events:subscribe?cursor=N  SubscribeEvents, NDJSON
//	GET  /v1/events:window, :snapshot   GetEventWindow / GetSnapshot
//	GET  /v1/events/ws?cursor=N         WebSocket, draft-holmgren-at-synchronization-00 CBOR frames
//	POST /v1/events:ticket              single-use WebSocket ticket (?ticket=) for browsers (ticket.go)
//	GET  /v1/operations[/{id}]          google.longrunning ListOperations / GetOperation (operations_http.go)
//	POST /v1/operations/{id}:wait       WaitOperation (at most 60 s); :cancel CancelOperation
//	GET  /healthz, /metrics, /openapi.json, /docs/
//	GET  /ui/                           the web console, embedded static files (console.go)
//
// Streams: SubscribeEvents and WatchDocument send their gRPC response
// headers once the subscription started, i.e. the cursor was accepted
// (bridge.WithStartHook), never before: a refused cursor (FutureCursor) or
// an unknown document is a plain error status (REST: 400 / 404 with a
// google.rpc.Status body; WebSocket: FutureCursor as an error frame after
// the upgrade, as draft-holmgren-at-synchronization-00 "Error Frames"
// asks). The REST proxy writes "200 application/json" and flushes as soon
// as those headers arrive (flushStreamHeaders), so an idle stream answers
// at once; no event is invented to carry them (the AT sync draft has no
// such frame). An error after the start ends the NDJSON body with an
// {"error": Status} line.
//
// Results: GetDocumentResult is a server stream of google.api.HttpBody
// chunks (resultChunkBytes each; the first carries the content type, the
// header x-pipestream-result-size the total), so results of any size pass
// the gRPC message limit and are never held whole. Over REST the gateway's
// own route writes the bytes themselves (grpc-gateway's stream encoding
// would put a newline after every chunk); an error after the status line
// aborts the connection, so a short body is never mistaken for a result.
//
// Errors are google.rpc.Status (JSON over REST) with an ErrorInfo reason
// where a client must tell cases apart (see the Reason constants).
//
// Security (docs/security.md): Config.Authenticator maps bearer tokens to
// tenants (TokenFile: a file of SHA-256 token hashes, reloadable; health,
// reflection, /healthz, /metrics, /openapi.json and /docs/ stay open); with
// NoAuth, New refuses non-loopback addresses unless AllowInsecureNoAuth.
// Unauthenticated REST calls answer 401 with WWW-Authenticate: Bearer.
// Per-tenant limits (rate with RetryInfo / Retry-After, concurrent uploads,
// concurrent event streams) run right after auth, then Config.Limiter;
// uploads are cut after UploadIdleTimeout without data. ServerTLSFiles
// builds Config.GRPCTLS / HTTPTLS / InternalDialTLS.
package gateway
