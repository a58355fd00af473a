# install.cmake: every install rule of moat and its Debian packages
# (CPack), in one place, referring to the targets the folders define. It
# is included last by the top CMakeLists.txt, after every target exists.
# Three components, one .deb each:
#   node    moat-vmd, the guest agent, the image builder, moat-vmd.service
#   control moat-gateway, moat-sessiond, moat-snapd, their units, the
#           example config
#   client  the moat CLI, libmoat (shared, with SONAME), its headers,
#           moat.pc, the Python SDK sources
# Paths come from GNUInstallDirs and stay relative, so `cmake --install
# build --prefix DIR` and the packages (prefix /usr) both work; what needs
# an absolute path (the systemd units) is written at install time for the
# prefix in use. Not for: build rules (the folders' CMakeLists.txt) or
# the tests of all this (tests/integration/install).
include(GNUInstallDirs)

set(MOAT_LIBEXEC_SUBDIR ${CMAKE_INSTALL_LIBEXECDIR}/moat)
set(MOAT_SYSTEMD_DIR lib/systemd/system)
set(MOAT_SHARE_SUBDIR ${CMAKE_INSTALL_DATADIR}/moat)
set(MOAT_INCLUDE_SUBDIR ${CMAKE_INSTALL_INCLUDEDIR}/moat)

# ---- libmoat: the C client as a shared library ----
# Built from the objects of moat_client and moat_proto (every generated
# message, so a caller can free or pack any of them) plus what they need
# of moat_rpc, moat_tls, moat_config and moat_base; all compiled PIC for
# it. The version script (libmoat.map) exports only the client API:
# moat_client_*, moat/status.h (moat_strerror, moat_status_*) and the
# moat.v1 protobuf-c functions and descriptors; the rpc layer, TLS,
# config and logging stay private.
set_target_properties(moat_client moat_proto moat_rpc moat_tls moat_config
  moat_base PROPERTIES POSITION_INDEPENDENT_CODE ON)
add_library(libmoat SHARED $<TARGET_OBJECTS:moat_client>
  $<TARGET_OBJECTS:moat_proto>)
target_link_libraries(libmoat PRIVATE moat_rpc moat_config moat_base
  PkgConfig::PROTOBUF_C)
target_link_options(libmoat PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_LIST_DIR}/libmoat.map
  -Wl,--no-undefined)
set_target_properties(libmoat PROPERTIES
  OUTPUT_NAME moat
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib
  LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/libmoat.map)

# ---- node ----
install(TARGETS moat-vmd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT node)
# [vmd] ram-sharing = private: moat-vmd looks for it at <its bin>/../lib
# (services/vm/drivers/ramro/ramro.c), so lib/, not the multiarch libdir.
install(TARGETS moat-qemu-ramro LIBRARY DESTINATION lib COMPONENT node)
install(TARGETS moat-agent moat-image-spec
  RUNTIME DESTINATION ${MOAT_LIBEXEC_SUBDIR} COMPONENT node)
install(PROGRAMS ${CMAKE_SOURCE_DIR}/images/build.sh
  ${CMAKE_SOURCE_DIR}/images/boot-check.sh
  DESTINATION ${MOAT_LIBEXEC_SUBDIR}/images COMPONENT node)
install(FILES ${CMAKE_SOURCE_DIR}/images/README.md
  ${CMAKE_SOURCE_DIR}/images/from_tar.sh
  DESTINATION ${MOAT_LIBEXEC_SUBDIR}/images COMPONENT node)
# moat-image-build: images/build.sh with the installed agent and the image
# directory moat-vmd reads by default; it finds libexec relative to itself.
file(RELATIVE_PATH MOAT_BIN_TO_LIBEXEC
  ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBEXECDIR}/moat)
configure_file(${CMAKE_CURRENT_LIST_DIR}/moat-image-build.in
  ${CMAKE_BINARY_DIR}/install/moat-image-build @ONLY)
install(PROGRAMS ${CMAKE_BINARY_DIR}/install/moat-image-build
  DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT node)

# ---- control ----
install(TARGETS moat-gateway moat-sessiond moat-snapd
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT control)
install(FILES ${CMAKE_SOURCE_DIR}/deploy/moat.conf.example
  DESTINATION ${MOAT_SHARE_SUBDIR} COMPONENT control)

# The units name the binaries by absolute path: made from
# deploy/systemd/*.service.in when installing, for the prefix of that
# install (/usr in the packages), not the one configured.
foreach(unit vmd gateway sessiond snapd)
  if(unit STREQUAL "vmd")
    set(comp node)
  else()
    set(comp control)
  endif()
  install(CODE "
    set(MOAT_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
    set(MOAT_DATADIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DATADIR}\")
    configure_file(\"${CMAKE_SOURCE_DIR}/deploy/systemd/moat-${unit}.service.in\"
      \"${CMAKE_BINARY_DIR}/install/units/moat-${unit}.service\" @ONLY)
    file(INSTALL \"${CMAKE_BINARY_DIR}/install/units/moat-${unit}.service\"
      DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${MOAT_SYSTEMD_DIR}\")
    " COMPONENT ${comp})
endforeach()

# ---- client ----
install(TARGETS moat RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  COMPONENT client)
install(TARGETS libmoat LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  COMPONENT client)
# moat_client.h includes the generated headers by bare name and
# "moat/status.h": the layout under include/moat mirrors the build's
# include directories, and moat.pc puts include/moat on the path.
install(FILES ${CMAKE_SOURCE_DIR}/clients/lib/moat_client.h
  DESTINATION ${MOAT_INCLUDE_SUBDIR} COMPONENT client)
foreach(p ${MOAT_PROTOS})
  install(FILES ${MOAT_GEN_DIR}/${p}.pb-c.h
    DESTINATION ${MOAT_INCLUDE_SUBDIR} COMPONENT client)
endforeach()
install(FILES ${CMAKE_SOURCE_DIR}/lib/include/moat/status.h
  DESTINATION ${MOAT_INCLUDE_SUBDIR}/moat COMPONENT client)
# moat.pc finds its prefix from where it lies (${pcfiledir}), so one file
# serves every prefix.
file(RELATIVE_PATH MOAT_PC_TO_PREFIX
  ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" MOAT_PC_TO_PREFIX "${MOAT_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/moat.pc.in
  ${CMAKE_BINARY_DIR}/install/moat.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/install/moat.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT client)
# The Python SDK as sources (`pip install <datadir>/moat/python`); its
# tests stay in the repository.
install(FILES ${CMAKE_SOURCE_DIR}/clients/python/pyproject.toml
  ${CMAKE_SOURCE_DIR}/clients/python/README.md
  DESTINATION ${MOAT_SHARE_SUBDIR}/python COMPONENT client)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/clients/python/moat
  DESTINATION ${MOAT_SHARE_SUBDIR}/python COMPONENT client
  FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)

# ---- packages: cpack -G DEB makes moat-node, moat-control, moat-client ----
set(CPACK_PACKAGE_NAME moat)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "moat")
set(CPACK_PACKAGE_CONTACT "moat maintainers <moat@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "microVM sandboxes for AI agents")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_COMPONENTS_ALL node control client)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# Packages carry stripped binaries, as Debian's own do.
set(CPACK_STRIP_FILES ON)
# Library dependencies from the ELF files themselves (dpkg-shlibdeps);
# what is run rather than linked is declared below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_NODE_PACKAGE_NAME moat-node)
set(CPACK_DEBIAN_NODE_DESCRIPTION "moat node: moat-vmd, the guest agent and the image builder
 moat-vmd runs QEMU microVMs on a KVM (or TCG) host and answers the
 gateway's survey. moat-image-build makes guest images with the agent.")
set(CPACK_DEBIAN_NODE_PACKAGE_DEPENDS "qemu-system-x86, qemu-utils")
set(CPACK_DEBIAN_NODE_PACKAGE_RECOMMENDS
  "mmdebstrap, e2fsprogs, cpio, kmod, busybox-static, zstd, xz-utils, xfsprogs")
set(CPACK_DEBIAN_CONTROL_PACKAGE_NAME moat-control)
set(CPACK_DEBIAN_CONTROL_DESCRIPTION "moat control plane: gateway, sessiond, snapd
 moat-gateway is the only door for clients; moat-sessiond keeps
 recordings and moat-snapd snapshots (LMDB).")
set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME moat-client)
set(CPACK_DEBIAN_CLIENT_DESCRIPTION "moat clients: the moat CLI, libmoat and the Python SDK
 libmoat is the C client of moat-gateway (pkg-config: moat); the Python
 SDK is installed as sources under /usr/share/moat/python.")
# The header includes protobuf-c's; pkg-config resolves it from there.
set(CPACK_DEBIAN_CLIENT_PACKAGE_RECOMMENDS
  "libprotobuf-c-dev, pkg-config, python3")
set(CPACK_DEBIAN_CLIENT_PACKAGE_GENERATE_SHLIBS ON)
include(CPack)
