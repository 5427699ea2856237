#!/usr/bin/env bash
# Installs what is missing and builds Chorus into ${CHORUS_BUILD_DIR:-build}.
# Arguments before an optional "--target T..." go to CMake's configure step
# (e.g. -DCHORUS_CUDA=OFF); targets after it are built instead of all.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# Let ccache share results between checkouts in different folders.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
build_dir="${CHORUS_BUILD_DIR:-build}"
configure=()
targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--target" ]; then
    shift
    targets=("$@")
    break
  fi
  configure+=("$1")
  shift
done
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${configure[@]}" >/dev/null
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$build_dir" --target "${targets[@]}"
else
  cmake --build "$build_dir"
fi
