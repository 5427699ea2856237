#!/usr/bin/env bash
# Builds Chorus and makes its Debian packages (cmake/ChorusPackaging.cmake)
# in ${CHORUS_BUILD_DIR:-build}/packages:
#   chorus_VERSION-1_ARCH.deb         the daemons, chorusctl, systemd units
#   libchorus0_VERSION-1_ARCH.deb     the client library
#   libchorus-dev_VERSION-1_ARCH.deb  its headers, CMake package, pkg-config
# Arguments name the components to pack (daemons, library, dev); default
# all three. Only what they hold is built. Prints the packages' paths.
set -euo pipefail
cd "$(dirname "$0")/.."

components=("$@")
if [ ${#components[@]} -eq 0 ]; then
  components=(daemons library dev)
fi
targets=()
for component in "${components[@]}"; do
  case "$component" in
    daemons) targets+=(chorus-coordinator chorus-worker chorusctl) ;;
    library | dev) targets+=(chorus_client_shared) ;;
    *)
      echo "scripts/package.sh: unknown component '$component'" \
        "(daemons, library, dev)" >&2
      exit 2
      ;;
  esac
done
scripts/build.sh --target "${targets[@]}"

build_dir="${CHORUS_BUILD_DIR:-build}"
out="$build_dir/packages"
rm -rf "$out"
list=$(IFS=';'; echo "${components[*]}")
# CPack works in the build's folder; its staging tree stays under $out.
(cd "$build_dir" && cpack -G DEB -B "$PWD/packages" \
  -D CPACK_COMPONENTS_ALL="$list" >/dev/null)
ls "$out"/*.deb
