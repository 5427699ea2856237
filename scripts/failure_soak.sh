#!/usr/bin/env bash
# Soaks the failure tests: runs every failure test program N times (default
# 20) with --gtest_repeat and prints, per test, how many runs passed and
# failed, then the totals as "P passed, F failed". A run that did not report
# OK (a failure, a crash, a hang killed by the timeout) counts as failed.
# Logs of programs with failures are kept and their path printed.
#
# Run by hand after building (scripts/build.sh, or any build directory):
#   scripts/failure_soak.sh [N]
# Environment: CHORUS_BUILD_DIR (default: build), CHORUS_SOAK_JOBS (test
# programs run at once; default 2, as the failure tests are sized for a
# two-core machine running two of them).
set -euo pipefail
cd "$(dirname "$0")/.."

n="${1:-20}"
if ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [N]  (N: repetitions, a positive integer)" >&2
  exit 2
fi
build_dir="${CHORUS_BUILD_DIR:-build}"
jobs="${CHORUS_SOAK_JOBS:-2}"

shopt -s nullglob
programs=("$build_dir"/tests/integration/failure_*_test)
shopt -u nullglob
if [[ ${#programs[@]} -eq 0 ]]; then
  echo "no failure test programs in $build_dir/tests/integration;" \
    "build them first (scripts/build.sh)" >&2
  exit 2
fi

log_dir="$(mktemp -d "${TMPDIR:-/tmp}/chorus-failure-soak-XXXXXX")"
echo "== ${#programs[@]} failure test programs x $n runs ($jobs at a time)"

# Each program gets a generous budget: its own tests take about a minute
# per repetition; a hang is cut off rather than stalling the soak.
run_program() {
  local program="$1" name
  name="$(basename "$program")"
  timeout --kill-after=30 "$((n * 300))" \
    "$program" --gtest_repeat="$n" --gtest_color=no \
    >"$log_dir/$name.log" 2>&1 || true
  echo "   finished $name"
}

running=0
for program in "${programs[@]}"; do
  run_program "$program" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

total_passed=0
total_failed=0
kept=0
echo "== results"
for program in "${programs[@]}"; do
  name="$(basename "$program")"
  log="$log_dir/$name.log"
  program_failed=0
  # Test names as gtest lists them: "Suite." lines, then indented names.
  while read -r test; do
    passed="$(grep -cF "[       OK ] $test (" "$log" || true)"
    failed=$((n - passed))
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    program_failed=$((program_failed + failed))
    printf '%-78s %3d passed, %3d failed\n' "$test" "$passed" "$failed"
  done < <("$program" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }')
  if [[ $program_failed -gt 0 ]]; then
    echo "   log of $name: $log"
    kept=1
  fi
done
if [[ $kept -eq 0 ]]; then
  rm -rf "$log_dir"
fi
echo "$total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]]
