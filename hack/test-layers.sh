#!/usr/bin/env bash
# Run the test layers one pytest session each, cheapest first, and stop at the first layer that fails:
# a unit failure is reported in minutes, not after the real-pod layer. Each layer prints its duration; the
# last lines are a table of the layers and the whole run's "N passed, N failed".
#   hack/test-layers.sh PYTEST LAYER...      e.g. hack/test-layers.sh .venv/bin/pytest tests/unit tests/e2e
set -uo pipefail
pytest="$1"; shift
results=".work/test-results"
mkdir -p "$results"
rm -f "$results"/*.xml
declare -a rows=()
total_passed=0; total_failed=0; rc=0
started=$(date +%s)
for layer in "$@"; do
  name="${layer#tests/}"
  echo "[layers] ${name}: starting"
  t0=$(date +%s)
  "$pytest" --durations=15 --junitxml="$results/${name}.xml" "$layer"
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  # passed/failed from the layer's JUnit XML (failures + errors count as failed)
  read -r passed failed < <(python3 - "$results/${name}.xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 1); raise SystemExit
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(tests - bad - skipped, bad + skipped)
EOF
)
  total_passed=$((total_passed + passed)); total_failed=$((total_failed + failed))
  rows+=("$(printf '%-12s %6d passed %4d failed %6d s' "$name" "$passed" "$failed" "$secs")")
  echo "[layers] ${name}: ${passed} passed, ${failed} failed in ${secs} s"
  if [ "$rc" -ne 0 ]; then
    echo "[layers] ${name} failed (pytest exit ${rc}): the layers after it did not run"
    break
  fi
done
echo "[layers] the run, $(( $(date +%s) - started )) s:"
printf '[layers]   %s\n' "${rows[@]}"
echo "${total_passed} passed, ${total_failed} failed"
exit "$rc"
