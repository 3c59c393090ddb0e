#!/usr/bin/env bash
# Fetch the Prometheus Operator's CRDs (PodMonitor, PrometheusRule, ...) once, for the chart's server-side
# dry run of its monitoring objects (tests/chart/test_chart_cluster.py; the test itself stays offline and
# skips until this ran). They come with the prometheus-operator Go module, through the Go module proxy,
# into the Go module cache; prints the directory holding them.
set -euo pipefail
version="${PROMETHEUS_OPERATOR_VERSION:-v0.80.1}"
command -v go >/dev/null || { echo "error: go is missing (make platform-build installs what it needs)"; exit 1; }
dir="$(cd /tmp && go mod download -json "github.com/prometheus-operator/prometheus-operator@$version" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')" \
  || { echo "error: cannot download github.com/prometheus-operator/prometheus-operator@$version from the Go module proxy"; exit 1; }
echo "$dir/example/prometheus-operator-crd"
