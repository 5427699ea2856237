#!/usr/bin/env bash
# Installs the Debian 12 packages Chorus builds and tests with, when any is
# missing. Safe to run repeatedly: it changes nothing when everything is
# present. CHORUS_BUILD_ONLY=1 installs only what building needs (what the
# container image in deploy/Dockerfile runs), not the test and client
# packages.
set -euo pipefail

# What configuring and building every target needs, and packing them
# (scripts/package.sh: dpkg-shlibdeps, file).
packages=(
  cmake ninja-build pkg-config g++ ccache dpkg-dev file
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libgoogle-glog-dev
  libssl-dev libcpp-httplib-dev
)
if [ "${CHORUS_BUILD_ONLY:-0}" != "1" ]; then
  # The Python client and its tests, certificates, the tests' Prometheus
  # and browser, the Kubernetes manifests' check, and etcd for the
  # coordinator's failover tests.
  packages+=(
    python3-grpcio python3-protobuf python3-numpy python3-pytest
    python3-pip python3-setuptools python3-wheel python3-torch python3-yaml
    python3-dev gcc
    openssl prometheus chromium
    etcd-server etcd-client
  )
  # Debian's kubectl, unless one from elsewhere is already on the PATH
  # (both install /usr/bin/kubectl).
  if ! command -v kubectl >/dev/null; then
    packages+=(kubernetes-client)
  fi
fi
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
