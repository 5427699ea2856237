#!/usr/bin/env bash
# Builds Chorus with clang's ThreadSanitizer and runs the unit and integration
# tests under it:
#   scripts/tsan.sh build   builds Abseil with TSan (scripts/tsan_abseil.sh,
#                           cached) and Chorus into ${CHORUS_TSAN_BUILD_DIR:-build-tsan}
#   scripts/tsan.sh test    runs the unit and integration tests; every process
#                           (tests, and the daemons they start) loads that
#                           Abseil, and any TSan report from any of them fails
#                           the run and is printed
# Without an argument it does both.
#
# Every unit and integration test runs. CHORUS_TSAN_ONLY=REGEX runs only the
# matching tests, CHORUS_TSAN_EXCLUDE=REGEX leaves matching ones out (for
# looking into one report).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${CHORUS_TSAN_BUILD_DIR:-build-tsan}"
excluded="${CHORUS_TSAN_EXCLUDE:-}"
extra="clang-14 libclang-rt-14-dev curl xz-utils patch gpgv debian-archive-keyring"
export CHORUS_EXTRA_PACKAGES="${CHORUS_EXTRA_PACKAGES:-} $extra"

tsan_build() {
  scripts/setup.sh
  scripts/tsan_abseil.sh >/dev/null
  CHORUS_BUILD_DIR="$build_dir" CC=clang CXX=clang++ scripts/build.sh \
    -DCHORUS_CUDA=OFF -DCHORUS_SANITIZE=thread -DCHORUS_BENCH=OFF
}

tsan_test() {
  local absl_lib
  absl_lib=$(scripts/tsan_abseil.sh)
  local root=$PWD
  local reports="$root/$build_dir/tsan-reports"
  local suppressions="$root/$build_dir/tsan-suppressions.txt"
  rm -rf "$reports"
  mkdir -p "$reports"
  {
    cat tests/tsan_suppressions.txt
    echo "# The TSan-built Abseil (memory accesses are not instrumented there)."
    local lib
    for lib in "$absl_lib"/libabsl_*.so.*; do
      case "$lib" in *.so.*.*) continue ;; esac
      echo "called_from_lib:/${lib##*/}"
    done
  } >"$suppressions"

  export LD_LIBRARY_PATH="$absl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  TSAN_OPTIONS+=":suppressions=$suppressions:log_path=$reports/tsan"
  local status=0
  ctest --test-dir "$build_dir" -L "unit|integration" -E "${excluded:-^$}" ${CHORUS_TSAN_ONLY:+-R "$CHORUS_TSAN_ONLY"} \
    --output-on-failure -j "$(nproc)" --no-tests=error || status=$?
  local found=("$reports"/tsan.*)
  if [ -e "${found[0]}" ]; then
    echo "ThreadSanitizer reports (${#found[@]} processes):"
    cat "${found[@]}"
    status=1
  fi
  return "$status"
}

case "${1:-all}" in
  build) tsan_build ;;
  test) tsan_test ;;
  all) tsan_build && tsan_test ;;
  *)
    echo "usage: $0 [build|test]" >&2
    exit 2
    ;;
esac
