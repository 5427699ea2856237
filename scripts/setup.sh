#!/usr/bin/env bash
# Installs the Debian 12 packages Chorus builds with, when any is missing.
# Safe to run repeatedly: it changes nothing when everything is present.
set -euo pipefail

packages=(
  cmake ninja-build pkg-config g++ ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libgoogle-glog-dev
  python3-grpcio python3-protobuf python3-numpy python3-pytest
  python3-pip python3-setuptools python3-wheel python3-torch openssl
  libcpp-httplib-dev prometheus chromium
)
# Extra packages a caller needs, e.g. CHORUS_EXTRA_PACKAGES="clang-14".
read -r -a extra <<<"${CHORUS_EXTRA_PACKAGES:-}"
packages+=("${extra[@]}")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "Installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
