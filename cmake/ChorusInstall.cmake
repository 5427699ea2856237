# What `cmake --install` puts under its prefix, in three components (one
# Debian package each, cmake/ChorusPackaging.cmake):
#   daemons  bin/chorus-coordinator, bin/chorus-worker, bin/chorusctl; the
#            systemd units in lib/systemd/system, whose ExecStart names the
#            binaries where this install put them; share/chorus/
#            chorus.env.example, the flags file the units read
#   library  lib/libchorus.so.0, the client library (client/CMakeLists.txt)
#   dev      include/chorus/*.h, lib/libchorus.so, lib/cmake/Chorus (the
#            CMake package: find_package(Chorus) gives Chorus::client) and
#            lib/pkgconfig/chorus.pc (pkg-config chorus)
# The CMake package and the pkg-config file find the prefix from where they
# lie, so an installed tree may move. Installed programs and the library
# lose their debug sections (the symbol tables stay, for glog's stack
# traces) unless CHORUS_INSTALL_DEBUG_INFO is on.
option(CHORUS_INSTALL_DEBUG_INFO
       "Keep the debug sections of installed programs and libraries" OFF)

# Strips the debug sections of the file `path` (relative to the install
# prefix) once component `component` installed it.
function(chorus_install_strip_debug component path)
  if(CHORUS_INSTALL_DEBUG_INFO OR NOT CMAKE_OBJCOPY)
    return()
  endif()
  install(CODE "execute_process(COMMAND \"${CMAKE_OBJCOPY}\" --strip-debug
      \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${path}\"
    COMMAND_ERROR_IS_FATAL ANY)" COMPONENT ${component})
endfunction()

# The daemons, chorusctl and the systemd units.
install(TARGETS chorus-coordinator chorus-worker chorusctl
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemons)
foreach(program chorus-coordinator chorus-worker chorusctl)
  chorus_install_strip_debug(daemons "${CMAKE_INSTALL_BINDIR}/${program}")
endforeach()
foreach(unit chorus-coordinator chorus-worker)
  # Made at install time: the prefix is known only then (cmake --install
  # --prefix, CPack's /usr).
  install(CODE "
    set(CHORUS_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
    set(_unit \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/${unit}.service\")
    message(STATUS \"Installing: \${_unit}\")
    configure_file(\"${PROJECT_SOURCE_DIR}/deploy/${unit}.service.in\"
      \"\${_unit}\" @ONLY)
    list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_unit}\")"
    COMPONENT daemons)
endforeach()
install(FILES deploy/chorus.env.example
  DESTINATION ${CMAKE_INSTALL_DATADIR}/chorus COMPONENT daemons)

if(NOT TARGET chorus_client_shared)
  return()  # a sanitizer build: no shared library
endif()

# The client library, its headers, and how builds find them.
install(TARGETS chorus_client_shared EXPORT ChorusTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT library NAMELINK_COMPONENT dev)
chorus_install_strip_debug(library
  "${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:chorus_client_shared>")
install(DIRECTORY include/chorus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT dev FILES_MATCHING PATTERN "*.h")

set(_chorus_cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/Chorus")
install(EXPORT ChorusTargets NAMESPACE Chorus::
  DESTINATION ${_chorus_cmake_dir} COMPONENT dev)
include(CMakePackageConfigHelpers)
configure_package_config_file(cmake/ChorusConfig.cmake.in
  "${PROJECT_BINARY_DIR}/ChorusConfig.cmake"
  INSTALL_DESTINATION ${_chorus_cmake_dir})
# Before 1.0 a minor version may change the API.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ChorusConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/ChorusConfig.cmake"
  "${PROJECT_BINARY_DIR}/ChorusConfigVersion.cmake"
  DESTINATION ${_chorus_cmake_dir} COMPONENT dev)

# chorus.pc names its prefix relative to its own folder (${pcfiledir}).
file(RELATIVE_PATH CHORUS_PC_TO_PREFIX
  "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file(cmake/chorus.pc.in "${PROJECT_BINARY_DIR}/chorus.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/chorus.pc"
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
