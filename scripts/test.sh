#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite:
#   1. unit and integration tests (real daemons on 127.0.0.1; among them
#      tests/install, which installs this build into a temporary prefix and
#      builds examples/cpp against it), the
#      multi-host tests (each daemon in a network namespace), the Python
#      client's tests (tests/python, against the daemons just built: once
#      with collectives on the daemons' call sockets, once as gRPC calls), GPU
#      tests (they skip themselves where no GPU is present);
#   2. the unit and integration tests again under ASan+UBSan, built with
#      clang, whose thread-safety analysis (-Werror=thread-safety) checks
#      every ABSL_GUARDED_BY at compile time;
#   3. the unit and integration tests under TSan (scripts/tsan.sh), with
#      Debian's Abseil rebuilt with TSan (scripts/tsan_abseil.sh, cached
#      under ~/.cache/chorus) so that TSan sees absl::Mutex;
#   4. each fuzzer for CHORUS_FUZZ_SECONDS (default 60) from its seed corpus.
# CHORUS_QUICK=1 runs stage 1 only.
set -euo pipefail
cd "$(dirname "$0")/.."

export CHORUS_EXTRA_PACKAGES="${CHORUS_EXTRA_PACKAGES:-} clang-14 libclang-rt-14-dev"
jobs=$(nproc)
passed=0
failed=0
failures=()

# run_stage NAME CMD...: runs a stage, counting it as passed or failed.
run_stage() {
  local name=$1; shift
  echo
  echo "== $name"
  local start=$SECONDS
  if "$@"; then
    passed=$((passed + 1))
    echo "== $name: ok ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "== $name: FAILED ($((SECONDS - start)) s)"
  fi
}

ctest_labels() {
  local dir=$1 labels=$2
  ctest --test-dir "$dir" -L "$labels" --output-on-failure -j "$jobs" --no-tests=error
}

main_build() {
  scripts/build.sh
}
run_stage "build" main_build
run_stage "unit and integration tests" ctest_labels build "unit|integration"
# Each daemon on a host of its own (a network namespace); the tests skip
# themselves where namespaces cannot be made (not root, no `ip`).
run_stage "multi-host tests" ctest_labels build multihost

# Installs the chorus package into a throwaway folder of the build and runs
# its tests against that build's daemons with Debian's interpreter (another
# python3 may come first on the PATH). pytest exits 5 when no test ran.
python_tests() {
  local build_dir="${CHORUS_BUILD_DIR:-build}"
  local target="$build_dir/python"
  case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
  local pip=(/usr/bin/python3 -m pip install --quiet --no-deps
    --no-build-isolation --no-index --target "$target")
  local pip_help flag
  pip_help=$(/usr/bin/python3 -m pip install --help) || return 1
  # Debian marks its Python as externally managed; --target leaves the
  # system's packages alone, so say so where this pip asks for it.
  for flag in --break-system-packages --root-user-action=ignore; do
    if [[ "$pip_help" == *"${flag%%=*}"* ]]; then pip+=("$flag"); fi
  done
  rm -rf "$target"
  # With the embedded worker this build made (chorus._embedded).
  CHORUS_BUILD_DIR="$(cd "$build_dir" && pwd)" "${pip[@]}" client/python \
    || return 1
  local rc=0
  env -u CHORUS_BIN_DIR PYTHONPATH="$target" CHORUS_BUILD_DIR="$build_dir" \
    /usr/bin/python3 -m pytest tests/python -q || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "no Python test ran"
    return 1
  fi
  [ "$rc" -eq 0 ] || return "$rc"
  # Again with collectives as gRPC calls (no call sockets), the path of
  # clients on another host or user.
  # The slow runs (the elastic soak) once, in the pass above.
  echo "python tests, collectives as gRPC calls:"
  env -u CHORUS_BIN_DIR PYTHONPATH="$target" CHORUS_BUILD_DIR="$build_dir" \
    CHORUS_TEST_CALL_SOCKETS=off /usr/bin/python3 -m pytest tests/python -q \
    -m "not slow" || rc=$?
  return "$rc"
}
run_stage "python tests" python_tests
run_stage "gpu tests (skipped without a GPU)" \
  ctest --test-dir build -L gpu --output-on-failure --no-tests=ignore

if [ "${CHORUS_QUICK:-0}" != "1" ]; then
  # Sanitizer builds use clang and leave out CUDA and the benchmarks.
  sanitizer_build() {
    local dir=$1 sanitize=$2; shift 2
    CHORUS_BUILD_DIR="$dir" CC=clang CXX=clang++ scripts/build.sh \
      -DCHORUS_CUDA=OFF -DCHORUS_SANITIZE="$sanitize" -DCHORUS_BENCH=OFF \
      --target "$@"
  }
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  run_stage "asan+ubsan build" sanitizer_build build-asan address,undefined all
  run_stage "unit and integration tests under asan+ubsan" \
    ctest_labels build-asan "unit|integration"
  run_stage "tsan build" scripts/tsan.sh build
  run_stage "unit and integration tests under tsan" scripts/tsan.sh test
  if [ -x scripts/fuzz.sh ]; then
    run_stage "fuzzers" scripts/fuzz.sh
  fi
fi

echo
echo "stages: $passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
  printf 'failed stage: %s\n' "${failures[@]}"
  exit 1
fi
