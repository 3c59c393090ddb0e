#!/usr/bin/env bash
# Print the folder holding the pinned Gateway API standard CRDs (sigs.k8s.io/gateway-api from the Go
# module proxy, cached in the Go module cache, never committed). Apply them with:
#   kubectl apply --server-side -f "$(hack/fetch-gateway-api.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-.venv/bin/python}" -m chatfleet_platform.addons.gatewayapi
