#!/usr/bin/env bash
# Regenerates everything generated from proto/: Go code in gen/ and the served
# OpenAPI spec openapi/openapi.json. Local plugins only (go.mod `tool`
# directives); no Buf Schema Registry, no network beyond the Go proxy for a
# cold module cache.
set -euo pipefail
cd "$(dirname "$0")/.."

go tool buf lint
go tool buf format --diff --exit-code --path proto/pipestream
# buf.gen.yaml has clean: true (removes gen/ first, so deleted protos leave no
# stale files); the OpenAPI template runs second and writes gen/openapiv2/.
go tool buf generate
go tool buf generate --template buf.gen.openapi.yaml
go run ./openapi/internal/fixspec -in gen/openapiv2/pipestream.swagger.json -out openapi/openapi.json
echo "gen: ok (gen/, openapi/openapi.json)"
