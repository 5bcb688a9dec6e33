#!/usr/bin/env bash
# Regenerates everything generated from proto/: Go code in gen/ and the served
# OpenAPI spec openapi/openapi.json. Local plugins only (go.mod `tool`
# directives); no Buf Schema Registry, no network beyond the Go proxy for a
# cold module cache.
#
# buf itself: the prebuilt binary of the npm package @bufbuild/buf pinned in
# .ci/node (installed by `npm ci --prefix .ci/node`, which .ci/setup.sh does) when
# it is there and its version is the go.mod one; otherwise `go tool buf`,
# which compiles buf from source (about 100 s with a cold build cache).
# BUF=/path/to/buf overrides both.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${BUF:-}" ]; then
  want="$(go list -m -f '{{.Version}}' github.com/bufbuild/buf)"
  want="${want#v}"
  # The platform package's binary directly (npm installs only the one for
  # this machine); .bin/buf is a node wrapper around it that costs a second a
  # call on a busy machine.
  npmbuf=.ci/node/node_modules/.bin/buf
  for b in .ci/node/node_modules/@bufbuild/buf-*/bin/buf; do
    if [ -x "$b" ]; then npmbuf="$b"; fi
  done
  if [ -x "$npmbuf" ] && got="$("$npmbuf" --version 2>/dev/null)" && [ "$got" = "$want" ]; then
    BUF="$npmbuf"
  else
    if [ -x "$npmbuf" ]; then
      echo "gen: $npmbuf is buf ${got:-(does not run)}, go.mod pins $want; using go tool buf (set the same version in .ci/node/package.json and run npm install --prefix .ci/node)" >&2
    fi
    BUF="go tool buf"
  fi
fi
echo "gen: buf $($BUF --version) ($BUF)"

$BUF lint
$BUF format --diff --exit-code --path proto/pipestream
# buf.gen.yaml has clean: true (removes gen/ first, so deleted protos leave no
# stale files); the OpenAPI template runs second and writes gen/openapiv2/.
$BUF generate
$BUF generate --template buf.gen.openapi.yaml
go run ./openapi/internal/fixspec -in gen/openapiv2/pipestream.swagger.json -out openapi/openapi.json
echo "gen: ok (gen/, openapi/openapi.json)"
