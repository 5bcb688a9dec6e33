#!/usr/bin/env bash
# Validates openapi/openapi.json with an independent validator
# (@apidevtools/swagger-cli, pinned in .ci/node/package-lock.json): JSON
# Schema of Swagger 2.0 plus semantic checks (refs resolve, unique
# operationIds, path parameters declared...).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .ci/node/node_modules/.bin/swagger-cli ]; then
  npm ci --prefix .ci/node --no-audit --no-fund
fi
.ci/node/node_modules/.bin/swagger-cli validate openapi/openapi.json
