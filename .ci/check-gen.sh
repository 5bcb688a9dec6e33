#!/usr/bin/env bash
# Fails when the committed generated files (gen/, openapi/openapi.json) are
# not what scripts/gen.sh produces from the committed sources. It regenerates
# into the work tree, so a failure leaves the fresh files in place: review
# them with `git diff` and commit.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(gen/ openapi/openapi.json)

# scripts/gen.sh runs the prebuilt buf of .ci/node (npm @bufbuild/buf) when
# its version is the go.mod one; the two pins must move together, or every
# run silently falls back to compiling buf from source.
gomod_buf="$(go list -m -f '{{.Version}}' github.com/bufbuild/buf)"
npm_buf="$(sed -n 's/.*"@bufbuild\/buf": *"\([^"]*\)".*/\1/p' .ci/node/package.json)"
if [ "v$npm_buf" != "$gomod_buf" ]; then
  echo "check-gen: .ci/node/package.json pins @bufbuild/buf ${npm_buf:-(none)}, go.mod pins github.com/bufbuild/buf $gomod_buf: set the same version in both (npm install --prefix .ci/node --save-exact @bufbuild/buf@${gomod_buf#v})" >&2
  exit 1
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  if [ -n "$(git status --porcelain -- "${targets[@]}")" ]; then
    echo "check-gen: gen/ or openapi/openapi.json has uncommitted changes before regenerating; commit or discard them first:" >&2
    git status --porcelain -- "${targets[@]}" >&2
    exit 1
  fi
  scripts/gen.sh
  changes="$(git status --porcelain -- "${targets[@]}")"
  if [ -n "$changes" ]; then
    echo "check-gen: FAIL: generated files are stale. Run scripts/gen.sh and commit the result:" >&2
    echo "$changes" >&2
    git --no-pager diff --stat -- "${targets[@]}" >&2
    exit 1
  fi
else
  # No git metadata (e.g. a source tarball): compare against a snapshot.
  snap="$(mktemp -d)"
  trap 'rm -rf "$snap"' EXIT
  cp -r gen "$snap/gen"
  cp openapi/openapi.json "$snap/openapi.json"
  scripts/gen.sh
  if ! diff -r "$snap/gen" gen >&2 || ! diff "$snap/openapi.json" openapi/openapi.json >&2; then
    echo "check-gen: FAIL: generated files are stale. Run scripts/gen.sh and commit the result." >&2
    exit 1
  fi
fi
echo "check-gen: ok (generated files are up to date)"
