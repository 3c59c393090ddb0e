#!/usr/bin/env bash
# Copy the CRDs of crds/ (their single source of truth) into the Helm chart's crds/ directory.
#
# A copy, not a symlink: Flux's source-controller drops symlinks from Git artifacts, and Helm warns about
# them; tests/chart/test_chart.py fails when the copy and the source differ. Run after editing crds/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/charts/chatfleet-operator/crds"
for src in "$root"/crds/*.yaml; do
  cp "$src" "$dest/$(basename "$src")"
  echo "synced crds/$(basename "$src") -> charts/chatfleet-operator/crds/"
done
