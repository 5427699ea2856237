#!/usr/bin/env bash
# What metrics and the flight recorder cost, measured in one invocation:
# runs each benchmark with everything on (the defaults) and with counting
# and recording off (--collect_metrics=false on every daemon and rank,
# --trace_entries=0 on the coordinator), alternating A B A B ... so that the
# machine's drift hits both alike, and prints each pair's ratio (on / off)
# and their median.
#   1. chorus-bench: all_reduce f32 sum of 8 B at 4 ranks (inline plan),
#      mean us per call;
#   2. chorus-coordinator-scale: rendezvous + barriers of one group, ms.
# Usage: bench/metrics_cost.sh [--rounds=5] [--ranks=4] [--scale_ranks=1024]
# CHORUS_BUILD_DIR picks the build (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${CHORUS_BUILD_DIR:-build}"
rounds=5 ranks=4 scale_ranks=1024
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    --ranks=*) ranks=${arg#*=} ;;
    --scale_ranks=*) scale_ranks=${arg#*=} ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done
off_coordinator="--collect_metrics=false --trace_entries=0"

# Mean us per call of one chorus-bench run (8 B all-reduce).
bench_us() {
  "$build/bench/chorus-bench" --collective=all_reduce --ranks="$ranks" \
    --min_bytes=8 --max_bytes=8 --time_per_size=3s --max_iters=1000000 --warmup=200 \
    --format=csv "$@" 2>/dev/null | awk -F, '$1 == "8" { print $5 }'
}

# Rendezvous + barriers of one chorus-coordinator-scale run, in ms.
scale_ms() {
  "$build/bench/chorus-coordinator-scale" --ranks="$scale_ranks" \
    --barriers=50 "$@" 2>/dev/null |
    awk '/^rendezvous \+ barriers:/ { print $4 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# compare NAME FUNCTION ON_ARGS -- OFF_ARGS: runs the pairs, prints them.
compare() {
  local name=$1 fn=$2; shift 2
  local on_args=() off_args=()
  while [ "$1" != "--" ]; do on_args+=("$1"); shift; done
  shift
  off_args=("$@")
  local ratios=()
  printf '%s\n  %-6s %12s %12s %8s\n' "$name" round on off on/off
  for ((r = 1; r <= rounds; r++)); do
    local on off
    on=$($fn "${on_args[@]}")
    off=$($fn "${off_args[@]}")
    if [ -z "$on" ] || [ -z "$off" ]; then
      echo "  round $r: a run failed" >&2
      return 1
    fi
    local ratio
    ratio=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.3f", a / b }')
    ratios+=("$ratio")
    printf '  %-6s %12s %12s %8s\n' "$r" "$on" "$off" "$ratio"
  done
  printf '  median on/off: %s (above 1: slower with metrics and recorder)\n' \
    "$(printf '%s\n' "${ratios[@]}" | median)"
}

compare "all_reduce 8 B, $ranks ranks (us per call)" bench_us \
  -- --collect_metrics=false --coordinator_args="$off_coordinator"
compare "coordinator scale, $scale_ranks ranks (ms, rendezvous + 50 barriers)" \
  scale_ms -- --coordinator_args="$off_coordinator"
