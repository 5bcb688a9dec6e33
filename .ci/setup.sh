#!/usr/bin/env bash
# Installs what the test command (.ci/test.sh) needs and is missing, and
# nothing else: apt packages (chromium, gcc, npm, postgresql...), grpcurl,
# go-swagger and the pinned npm tools in .ci/node. .ci/test.sh runs it first
# (SETUP=0 skips it); on a machine that has everything it only checks.
#
# apt needs root: run as root, or with passwordless sudo; otherwise the
# script names what is missing and how to install it, and fails. The Go
# tools go to $GOBIN (default /usr/local/bin as root, else $(go env GOPATH)/bin,
# which .ci/test.sh puts on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
[ -x /usr/local/go/bin/go ] && export PATH="/usr/local/go/bin:$PATH"
if [ -z "${GOBIN:-}" ]; then
  if [ "$(id -u)" = 0 ]; then GOBIN=/usr/local/bin; else GOBIN="$(go env GOPATH)/bin"; fi
fi
export GOBIN
export PATH="$PATH:$GOBIN"

# grpcurl is used by the e2e tests and is not a go.mod dependency. v1.9.3
# installs through the module proxy (later versions need
# github.com/jhump/protoreflect/v2@v2.0.0, which the proxy does not serve).
GRPCURL_VERSION=v1.9.3
# go-swagger generates a client from the served spec in e2e; v0.31 and older
# do not build with Go 1.26 (golang.org/x/tools v0.21).
SWAGGER_VERSION=v0.36.7

# retry CMD...: the network steps (apt, the module proxy, npm) are retried
# twice, 10 s then 20 s later, so one refused connection does not fail CI.
retry() {
  local i
  for i in 1 2 3; do
    "$@" && return 0
    [ "$i" = 3 ] && break
    echo "setup: attempt $i of 3 failed: $*; again in $((i * 10)) s" >&2
    sleep $((i * 10))
  done
  echo "setup: failed 3 times: $*" >&2
  return 1
}

echo "=== setup: apt packages"
pkgs=()
command -v git >/dev/null || pkgs+=(git)
command -v curl >/dev/null || pkgs+=(curl)
command -v gcc >/dev/null || pkgs+=(gcc libc6-dev) # -race needs cgo
command -v npm >/dev/null || pkgs+=(nodejs npm)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "${E2E_CHROMIUM:-}" ] || pkgs+=(chromium) # console and docs e2e
[ -e /etc/ssl/certs/ca-certificates.crt ] || pkgs+=(ca-certificates)
# PostgreSQL server for internal/pgtest (throwaway clusters for the
# PostgreSQL store's tests; they fail without it, they never skip).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || pkgs+=(postgresql)
if [ "${#pkgs[@]}" -eq 0 ]; then
  echo "nothing to install"
else
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "setup: missing ${pkgs[*]}; install them as root (apt-get install ${pkgs[*]}) or run .ci/test.sh as root or with passwordless sudo" >&2
      exit 1
    fi
  fi
  retry "${sudo[@]}" apt-get update
  retry "${sudo[@]}" apt-get install -y --no-install-recommends "${pkgs[@]}"
fi

# A checkout owned by another user is "dubious" to git (CI runs as root):
# git commands and Go's VCS stamping would fail in it.
if ! git rev-parse --git-dir >/dev/null 2>&1 && [ -e .git ]; then
  git config --global --add safe.directory "$PWD"
fi

echo "=== setup: grpcurl $GRPCURL_VERSION"
command -v grpcurl >/dev/null || (cd /tmp && retry go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION")
command -v grpcurl

echo "=== setup: go-swagger $SWAGGER_VERSION (e2e/genclient_test.go)"
command -v swagger >/dev/null || (cd /tmp && retry go install "github.com/go-swagger/go-swagger/cmd/swagger@$SWAGGER_VERSION")
command -v swagger

echo "=== setup: npm CI tools: OpenAPI validator, prebuilt buf (.ci/node, pinned by package-lock.json)"
# npm ci reinstalls from scratch: only when the tools are not there
# (scripts/gen.sh checks the buf version against go.mod's).
if [ -x .ci/node/node_modules/.bin/buf ] && [ -x .ci/node/node_modules/.bin/swagger-cli ]; then
  echo "installed"
else
  retry npm ci --prefix .ci/node --no-audit --no-fund
fi

echo "=== setup: Go modules (the gateway's and bench/jetstream's)"
retry go mod download
(cd bench/jetstream && retry go mod download)
