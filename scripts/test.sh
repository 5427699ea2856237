#!/usr/bin/env bash
# Installs what is missing, builds once, and runs the whole test suite:
# unit tests, then integration tests against real daemons on 127.0.0.1.
# GPU tests run too; they skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
build_dir="${CHORUS_BUILD_DIR:-build}"
jobs=$(nproc)

echo "== unit tests"
ctest --test-dir "$build_dir" -L unit --output-on-failure -j "$jobs" --no-tests=error
echo "== integration tests"
ctest --test-dir "$build_dir" -L integration --output-on-failure -j "$jobs" --no-tests=error
echo "== gpu tests (skipped without a GPU)"
ctest --test-dir "$build_dir" -L gpu --output-on-failure --no-tests=ignore
