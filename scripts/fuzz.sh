#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang into
# ${CHORUS_FUZZ_BUILD_DIR:-build-fuzz} and runs each for
# ${CHORUS_FUZZ_SECONDS:-60} seconds, starting from a scratch copy of its
# checked-in seed corpus (tests/fuzz/corpus/<target>; nothing is written
# back into the repository). CHORUS_FUZZ_SECONDS=0 only replays the seeds.
#
# Exits non-zero when any fuzzer finds a crash, a leak, a timeout or an
# invariant violation; the input that did it is kept under
# <build dir>/fuzz-artifacts/<target>/ (reproduce: <build dir>/tests/fuzz/
# <target> <file>). The last line reads "fuzz: N passed, M failed".
#
# Other settings: CHORUS_FUZZ_TARGETS (default "request_fuzzer
# chunk_fuzzer frame_fuzzer"), CHORUS_FUZZ_BUILD_JOBS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${CHORUS_FUZZ_BUILD_DIR:-build-fuzz}"
seconds="${CHORUS_FUZZ_SECONDS:-60}"
targets="${CHORUS_FUZZ_TARGETS:-request_fuzzer chunk_fuzzer frame_fuzzer call_frame_fuzzer}"
jobs="${CHORUS_FUZZ_BUILD_JOBS:-$(nproc)}"

# clang and its libFuzzer runtime (libclang_rt.fuzzer*.a).
CHORUS_EXTRA_PACKAGES="${CHORUS_EXTRA_PACKAGES:-} clang-14 libclang-rt-14-dev" \
  scripts/setup.sh
cxx="$(command -v clang++ || command -v clang++-14 || true)"
cc="$(command -v clang || command -v clang-14 || true)"
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz: clang is not installed" >&2
  echo "fuzz: 0 passed, 1 failed"
  exit 1
fi

echo "== building fuzzers in $build_dir with $cxx"
CC="$cc" CXX="$cxx" cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_CUDA=OFF -DCHORUS_BENCH=OFF \
  -DCHORUS_FUZZ=ON >/dev/null
# shellcheck disable=SC2086  # the target list is split on purpose
cmake --build "$build_dir" -j "$jobs" --target $targets

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
summary=()
for target in $targets; do
  binary="$build_dir/tests/fuzz/$target"
  seeds="tests/fuzz/corpus/$target"
  artifacts="$build_dir/fuzz-artifacts/$target"
  mkdir -p "$artifacts" "$work/$target"
  if [ -d "$seeds" ]; then cp -R "$seeds/." "$work/$target/"; fi
  log="$work/$target.log"
  count="$(find "$work/$target" -type f | wc -l)"
  echo
  if [ "$seconds" = "0" ]; then
    echo "== $target: replaying $count seeds"
    args=(-runs=0 "$work/$target")
  else
    echo "== $target: fuzzing for ${seconds}s from $count seeds"
    args=(-max_total_time="$seconds" "$work/$target")
  fi
  status=0
  "$binary" -print_final_stats=1 -timeout=25 -rss_limit_mb=2560 \
    -artifact_prefix="$artifacts/" "${args[@]}" >"$log" 2>&1 || status=$?
  # The progress lines, then the final stats, but not thousands of lines.
  grep -E '^#[0-9]+' "$log" | tail -n 3 || true
  grep -E '^stat::' "$log" || true
  last="$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)"
  cov="$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")"
  ft="$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")"
  corp="$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$last")"
  execs="$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log")"
  runs="$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log")"
  line="$target: ${runs:-?} runs, ${execs:-?} exec/s, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}"
  if [ "$status" -eq 0 ]; then
    passed=$((passed + 1))
    summary+=("ok      $line")
  else
    failed=$((failed + 1))
    summary+=("FAILED  $line (exit $status)")
    echo "-- $target failed (exit $status); the end of its log:"
    tail -n 60 "$log"
    echo "-- inputs kept in $artifacts/:"
    ls -1 "$artifacts" || true
  fi
done

echo
printf '%s\n' "${summary[@]}"
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
