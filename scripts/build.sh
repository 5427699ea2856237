#!/usr/bin/env bash
# Installs what is missing and builds Chorus into ${CHORUS_BUILD_DIR:-build}.
# Extra CMake arguments are passed through, e.g. -DCHORUS_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
build_dir="${CHORUS_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build_dir"
