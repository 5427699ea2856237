#!/usr/bin/env bash
# Builds the installed Abseil (the source and patches of Debian's libabsl-dev)
# with clang's ThreadSanitizer, as shared libraries with Debian's sonames, and
# prints the folder that holds them.
#
# Debian's libabsl is not built with TSan, so TSan cannot see absl::Mutex,
# which Chorus and gRPC (grpc_core::Mutex) synchronize with, and reports
# every handoff through one as a race. With this folder first on
# LD_LIBRARY_PATH, our binaries and the system's gRPC and protobuf libraries
# all load these libraries instead, whose mutexes, condition variables and
# atomics TSan sees. Their plain memory accesses are left uninstrumented, as
# in gRPC and protobuf themselves: gRPC keeps absl::Status and other Abseil
# values in memory it hands between threads through its own uninstrumented
# code, and TSan would report each of those handoffs.
#
# The source comes from deb.debian.org and is checked against the release's
# signed InRelease file. The result is kept in
# ${CHORUS_TSAN_ABSEIL_CACHE:-$HOME/.cache/chorus/abseil-tsan}/KEY, where KEY
# names the Debian version, the clang version and this script's recipe, so
# later runs only print the folder. CHORUS_JOBS limits the parallel jobs.
set -euo pipefail
recipe=$(sha256sum "$0" | cut -c1-12)

mirror="${CHORUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache="${CHORUS_TSAN_ABSEIL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chorus/abseil-tsan}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

source_pkg=$(dpkg-query -W -f='${source:Package}' libabsl-dev)
version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
clang_major=$(clang++ -dumpversion | cut -d. -f1)
prefix="$cache/$version-clang$clang_major-$recipe"
if [ -f "$prefix/.complete" ]; then
  echo "$prefix/lib"
  exit 0
fi

log() { echo "tsan_abseil: $*" >&2; }
fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }
# sha256_of NAME: the SHA256 of NAME in the checksum list on stdin.
sha256_of() { awk -v n="$1" '$3 == n { print $1; exit }'; }
check_sha256() {
  if [ -z "$2" ] || ! echo "$2  $1" | sha256sum --quiet -c - >/dev/null; then
    log "checksum mismatch for $1"
    exit 1
  fi
}

# shellcheck source=/dev/null
. /etc/os-release
suite="${CHORUS_DEBIAN_SUITE:-$VERSION_CODENAME}"
mkdir -p "$cache"
work=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

log "fetching $source_pkg $version from $mirror ($suite)"
fetch "$mirror/dists/$suite/InRelease" InRelease
if ! gpgv --keyring "$keyring" --output Release InRelease 2>gpgv.log; then
  cat gpgv.log >&2
  log "InRelease does not carry a valid Debian archive signature"
  exit 1
fi
fetch "$mirror/dists/$suite/main/source/Sources.xz" Sources.xz
check_sha256 Sources.xz \
  "$(sed -n '/^SHA256:/,/^[^ ]/p' Release | sha256_of main/source/Sources.xz)"
xz -dc Sources.xz >Sources
# The paragraph of this source package at this version.
awk -v p="$source_pkg" -v v="$version" '
  /^$/ { if (pkg == p && ver == v) { printf "%s", para; found = 1; exit }
         para = ""; pkg = ""; ver = ""; next }
  { para = para $0 "\n" }
  /^Package: / { pkg = $2 }
  /^Version: / { ver = $2 }
  END { if (!found && pkg == p && ver == v) printf "%s", para }' \
  Sources >paragraph
if [ ! -s paragraph ]; then
  log "$source_pkg $version is not in $suite's Sources; set CHORUS_DEBIAN_SUITE"
  exit 1
fi
directory=$(awk '/^Directory: / { print $2 }' paragraph)
sums=$(sed -n '/^Checksums-Sha256:/,/^[^ ]/p' paragraph)
upstream=${version%-*}
orig="${source_pkg}_${upstream}.orig.tar.gz"
debian="${source_pkg}_${version}.debian.tar.xz"
for f in "$orig" "$debian"; do
  fetch "$mirror/$directory/$f" "$f"
  check_sha256 "$f" "$(echo "$sums" | sha256_of "$f")"
done

mkdir src
tar -C src --strip-components=1 -xzf "$orig"
tar -C src -xJf "$debian"
while read -r patch opts; do
  case "$patch" in '' | '#'*) continue ;; esac
  # shellcheck disable=SC2086  # quilt options, if any, are separate words
  patch -d src -s -p1 ${opts:-} <"src/debian/patches/$patch"
done <src/debian/patches/series

# debian/rules' options for the shared libraries (C++17, shared, no tests),
# with clang and TSan instead of the distribution's hardening flags. TSan
# still instruments atomics and function entries (for stacks), and Abseil's
# own annotations (ABSL_TSAN_MUTEX_*) tell it about every lock and unlock.
log "building with clang $clang_major and -fsanitize=thread (synchronization only)"
flags="-O2 -gline-tables-only -fsanitize=thread"
flags+=" -mllvm -tsan-instrument-memory-accesses=0"
flags+=" -mllvm -tsan-instrument-memintrinsics=0"
if ! {
  cmake -S src -B build -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread -Wl,-z,now" \
    -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
    -DCMAKE_INSTALL_PREFIX="$work/install" -DCMAKE_INSTALL_LIBDIR=lib &&
    cmake --build build ${CHORUS_JOBS:+-j "$CHORUS_JOBS"} &&
    cmake --install build
} >build.log 2>&1; then
  tail -n 50 build.log >&2
  log "the build failed"
  exit 1
fi

# Every library the system has, and no other, with the same soname.
system_libs=$(dpkg -L "libabsl${upstream%%.*}" |
  sed -n 's|.*/\(libabsl_[a-z0-9_]*\.so\.[0-9]*\)$|\1|p' | sort)
built_libs=$(for lib in install/lib/libabsl_*.so.*; do
  case "$lib" in *.so.*.*) ;; *) echo "${lib##*/}" ;; esac
done | sort)
if [ "$system_libs" != "$built_libs" ]; then
  log "the built libraries differ from the system's:"
  diff <(echo "$system_libs") <(echo "$built_libs") >&2 || true
  exit 1
fi

rm -rf "$prefix"
mkdir -p "$prefix"
mv install/lib "$prefix/lib"
echo "$source_pkg $version, clang $clang_major: $flags" >"$prefix/.complete"
echo "$prefix/lib"
