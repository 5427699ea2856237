# Debian packages of what cmake/ChorusInstall.cmake installs, one per
# component, under /usr:
#   chorus         (daemons) the daemons, chorusctl, the systemd units; its
#                  postinst makes the system user chorus the units run as
#   libchorus0     (library) the client library
#   libchorus-dev  (dev) its headers, CMake package and pkg-config file
# The shared libraries each needs become its dependencies
# (dpkg-shlibdeps, from dpkg-dev). scripts/package.sh builds and packs;
# deploy/Dockerfile installs the chorus package.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME chorus)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
# The install runs with DESTDIR, so CMAKE_INSTALL_PREFIX is /usr in it (the
# systemd units' ExecStart is made from it).
set(CPACK_SET_DESTDIR ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CHORUS_PACKAGE_MAINTAINER "Chorus <chorus@localhost>" CACHE STRING
    "Maintainer field of the Debian packages")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CHORUS_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Each description's first line is the package's summary.

set(CPACK_DEBIAN_DAEMONS_PACKAGE_NAME chorus)
set(CPACK_DEBIAN_DAEMONS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMONS_PACKAGE_DEPENDS passwd)
set(CPACK_DEBIAN_DAEMONS_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/deploy/debian/postinst")
set(CPACK_DEBIAN_DAEMONS_DESCRIPTION
    "Chorus coordinator and worker daemons, chorusctl, and systemd units
chorus-coordinator keeps the registry of workers and the groups and matches
every collective across the ranks; chorus-worker registers a host's devices
and runs the collectives of the applications on it. Set their flags in
/etc/chorus/chorus.env (see /usr/share/chorus/chorus.env.example), then
enable chorus-coordinator or chorus-worker.")

set(CPACK_DEBIAN_LIBRARY_PACKAGE_NAME libchorus${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIBRARY_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_LIBRARY_DESCRIPTION
    "Chorus client library
Joins Chorus groups through a worker daemon and runs collectives on them,
blocking or asynchronously, with typed statuses.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libchorus-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libchorus${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}-1), libabsl-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "Chorus client library: headers, CMake package and pkg-config file
find_package(Chorus) gives the target Chorus::client; pkg-config chorus
gives the flags.")

include(CPack)
