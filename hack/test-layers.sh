#!/usr/bin/env bash
# Run the test layers, one pytest session each, and stop at the first layer that fails.
#
#   hack/test-layers.sh PYTEST STAGE...
#
# A STAGE is a quoted list of lanes separated by "|"; a lane is layers run one after another. The stages
# run in order; the lanes of a stage run side by side (each layer's output goes to its own log, printed
# whole when the layer ends, so lanes never interleave). When a layer fails, the layers after it do not
# start and the other lanes are interrupted (SIGINT: their fixtures still tear down).
#   e.g. hack/test-layers.sh .venv/bin/pytest "tests/unit tests/admission" "tests/e2e | tests/realnode"
#
# Each layer prints its duration; the last lines are a table of the layers and the whole run's
# "N passed, N failed". Layers whose tests wait on clusters and pods more than they compute run their test
# files on several pytest-xdist workers (each worker starts its own cluster); see xdist_args.
set -uo pipefail
pytest="$1"; shift
results=".work/test-results"
mkdir -p "$results"
rm -f "$results"/*.xml "$results"/*.row "$results"/*.log "$results/interrupted"
started=$(date +%s)
say() { echo "[layers] $*"; }

# Workers per layer, chosen on 2 cores: the unit tests compute (one worker per core); the platform layers
# mostly wait on their clusters (measured: integration 20 % of the machine busy on one worker), so three
# clusters side by side. A test file stays on one worker (--dist loadfile): its module fixtures (a gateway,
# KEDA) are set up once. The real-pod layer runs on one worker: only one cluster per host may run real
# nodes.
xdist_args() {
  case "$1" in
    tests/unit) echo "-n 2 --dist load" ;;
    tests/chart) echo "-n 2 --dist loadfile" ;;
    tests/integration | tests/e2e) echo "-n 3 --dist loadfile" ;;
    *) echo "" ;;
  esac
}

# passed/failed of a layer from its JUnit XML (failures + errors + skips count as failed)
counts() {
  python3 - "$1" <<'EOF'
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
}

# A job started with SIGINT ignored (a background job of a shell without job control, some CI runners)
# passes that on, and a Python started so never turns SIGINT into KeyboardInterrupt: interrupting a lane
# did nothing and it ran to its end. The layer's pytest starts with SIGINT's default disposition.
with_sigint() {
  python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}

# The last lane of a stage is its longest (the real-pod layer: it waits on real pods starting and
# draining, each start a burst of CPU), so the other lanes run at a lower CPU priority (nice LANE_NICE,
# inherited by their clusters): they take what it leaves instead of slowing its pods' starts (the examples
# test: 64 s alone, 146 s beside the other lane at the same priority). Alone this changed nothing
# measurable; the real node's cgroup weight (realnode.NODE_CPU_SHARES) gave the pods their CPU, and with
# both the real-pod layer took 1,205 s instead of 1,793 s (docs/test-times.md). CHATFLEET_LANE_NICE=0 runs
# every lane at the same priority.
lane_nice="${CHATFLEET_LANE_NICE:-10}"

# run one layer: its log printed whole at the end, its row written for the table
run_layer() {
  local layer="$1" name="${1#tests/}" niceness="${3:-0}" t0 rc secs passed failed
  say "${name}: starting${2:+ ($2)}$([ "$niceness" -gt 0 ] && echo ", at nice ${niceness}")"
  t0=$(date +%s)
  # shellcheck disable=SC2046
  with_sigint nice -n "$niceness" "$pytest" --durations=15 --junitxml="$results/${name}.xml" $(xdist_args "$layer") "$layer" \
    >"$results/${name}.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  read -r passed failed < <(counts "$results/${name}.xml")
  echo "----- ${name}: pytest's output -----"
  cat "$results/${name}.log"
  local how=""
  [ "$rc" -ne 0 ] && [ -e "$results/interrupted" ] && how=" (interrupted)"
  printf '%-12s %6d passed %4d failed %6d s%s\n' "$name" "$passed" "$failed" "$secs" "$how" \
    >"$results/${name}.row"
  say "${name}: ${passed} passed, ${failed} failed in ${secs} s${how}"
  if [ "$rc" -ne 0 ] && [ -z "$how" ]; then
    say "${name} failed (pytest exit ${rc}): the layers after it do not run"
  fi
  return "$rc"
}

run_lane() {
  local beside="$1" niceness="$2"; shift 2
  for layer in "$@"; do
    run_layer "$layer" "$beside" "$niceness" || return 1
  done
}

# every minute, where each running layer is (the last line of its log); its sleep holds no output open
ticker() {
  local nap
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep 60 >/dev/null 2>&1 & nap=$!
    wait "$nap"
    for log in "$results"/*.log; do
      [ -e "$log" ] || continue
      name=$(basename "$log" .log)
      [ -e "$results/${name}.row" ] && continue
      line=$(tail -c 2000 "$log" | tr '\r' '\n' | grep -v '^\s*$' | tail -1 | cut -c1-110)
      say "${name}: ${line}"
    done
  done
}

# Ctrl-C or a TERM (CI cancelling): the lanes run in their own process groups, so pass it on and wait
# for their teardown
declare -a pids=()
stop() {
  touch "$results/interrupted"
  say "stopping the lanes (their fixtures tear down)"
  for p in "${pids[@]}"; do kill -INT -- "-$p" 2>/dev/null; done
  wait
  exit 130
}
trap stop INT TERM

rc=0
declare -a order=()
for stage in "$@"; do
  IFS='|' read -r -a lanes <<<"$stage"
  pids=()
  for i in "${!lanes[@]}"; do
    read -r -a layers <<<"${lanes[$i]}"
    order+=("${layers[@]}")
    others="" niceness=0
    [ "${#lanes[@]}" -gt 1 ] && others="beside the other lanes of this stage"
    [ "$i" -lt $(( ${#lanes[@]} - 1 )) ] && niceness="$lane_nice"
    set -m  # each lane in its own process group, so a failure elsewhere can interrupt it whole
    run_lane "$others" "$niceness" "${layers[@]}" &
    pids+=($!)
    set +m
  done
  ticker & tick=$!
  remaining=("${pids[@]}")
  while [ "${#remaining[@]}" -gt 0 ]; do
    wait -n -p done_pid "${remaining[@]}"; lane_rc=$?
    remaining=("${remaining[@]/$done_pid}"); remaining=(${remaining[@]})
    if [ "$lane_rc" -ne 0 ] && [ "$rc" -eq 0 ]; then
      rc=$lane_rc
      touch "$results/interrupted"
      for p in "${remaining[@]}"; do kill -INT -- "-$p" 2>/dev/null; done
      [ "${#remaining[@]}" -gt 0 ] && say "interrupting the other lanes (their fixtures tear down)"
    fi
  done
  kill "$tick" 2>/dev/null; wait "$tick" 2>/dev/null
  [ "$rc" -ne 0 ] && break
done

total_passed=0; total_failed=0
say "the run, $(( $(date +%s) - started )) s:"
for layer in "${order[@]}"; do
  name="${layer#tests/}"
  if [ -e "$results/${name}.row" ]; then
    say "  $(cat "$results/${name}.row")"
    read -r _ passed _ failed _ <"$results/${name}.row"  # "<name> N passed M failed S s"
    total_passed=$((total_passed + passed)); total_failed=$((total_failed + failed))
  else
    say "  $(printf '%-12s did not run' "$name")"
  fi
done
echo "${total_passed} passed, ${total_failed} failed"
exit "$rc"
