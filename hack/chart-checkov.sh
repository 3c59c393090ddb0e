#!/usr/bin/env bash
# Policy scan of the rendered Helm chart with checkov (offline: --skip-download, framework kubernetes).
#
# checkov pins many packages of its own, so it lives in its own virtual environment in the binary cache
# ($CHATFLEET_CACHE/tools/checkov-<CHECKOV_VERSION>, shared by every clone, as the Go builds are), made on
# first use by hack/build-test-servers.sh. Renders the chart with several value sets, then scans them with charts/.checkov.yaml
# (skips justified in docs/chart.md). Exit status: checkov's (non-zero on any failed check).
# --install-only: create the checkov venv and stop (used by `make setup`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.env
. "$root/hack/versions.env"
venv="${CHATFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chatfleet}/tools/checkov-$CHECKOV_VERSION"
bash "$root/hack/build-test-servers.sh" checkov  # says "cached" when the venv is made and in place
[[ "${1:-}" == "--install-only" ]] && exit 0
helm="$("$root/.venv/bin/python" -c 'from chatfleet_platform.common.config import binaries; print(binaries().helm)')"
[[ -x "$helm" ]] || { echo "error: helm is missing at $helm: run make platform-build"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
chart="$root/charts/chatfleet-operator"
"$helm" template cf "$chart" -n chatfleet-system --include-crds > "$out/default.yaml"
"$helm" template cf "$chart" -n chatfleet-system --set replicaCount=2 > "$out/ha.yaml"
"$helm" template cf "$chart" -n chatfleet-system --set watch.scope=namespaces,replicaCount=2 > "$out/namespaces.yaml"
"$helm" template cf "$chart" -n chatfleet-system --set monitoring.fleetPodMonitor.enabled=true,monitoring.operatorPodMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.kubeStateMetrics.enabled=true,monitoring.dashboard.enabled=true > "$out/monitoring.yaml"
exec "$venv/bin/checkov" --config-file "$root/charts/.checkov.yaml" -d "$out" "$@"
