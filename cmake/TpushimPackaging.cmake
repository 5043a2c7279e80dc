# libtpushim.so, libtpushim.a and their installation.
#
#   tpushim_shared  libtpushim.so.<version>, SONAME libtpushim.so.<major>:
#                   every internal library linked whole-archive; only
#                   TPUSHIM_EXPORT declarations are visible (the tree builds
#                   with -fvisibility=hidden, and tpushim.map hides whatever
#                   the compiler still exports, e.g. std:: instantiations).
#   tpushim_static  libtpushim.a: the internal libraries' objects.
#   tpushim_headers the include directory alone, for C backends that dlopen
#                   libtpushim.so and need nothing but c_api.h.
#
# Installed as tpushim::tpushim, tpushim::tpushim_static and
# tpushim::headers (find_package(tpushim CONFIG)) and as tpushim.pc; the
# tests, tools and benchmarks keep linking the internal static libraries.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Every internal library, dependants before their dependencies: the
# whole-archive group is linked in this order, and each library must come
# before the ones it uses or it would be listed twice.
set(TPUSHIM_INTERNAL_LIBRARIES
  tpushim_system tpushim_transfer tpushim_device tpushim_allocator
  tpushim_logging tpushim_chips tpushim_host_facts tpushim_options
  tpushim_os tpushim_common)
if(TARGET tpushim_capi)
  list(PREPEND TPUSHIM_INTERNAL_LIBRARIES tpushim_capi)
endif()

# What the public headers include: absl/status, statusor, time, types/span,
# functional/any_invocable, strings/string_view. Targets and pkg-config
# modules, in the same order.
set(TPUSHIM_PUBLIC_ABSL status statusor strings time span any_invocable)
list(TRANSFORM TPUSHIM_PUBLIC_ABSL PREPEND "absl::"
     OUTPUT_VARIABLE TPUSHIM_PUBLIC_ABSL_TARGETS)
list(TRANSFORM TPUSHIM_PUBLIC_ABSL PREPEND "absl_"
     OUTPUT_VARIABLE TPUSHIM_PUBLIC_ABSL_MODULES)

# version.h: the release and the SONAME a dlopen()ing backend asks for.
set(TPUSHIM_SONAME
    "${CMAKE_SHARED_LIBRARY_PREFIX}tpushim${CMAKE_SHARED_LIBRARY_SUFFIX}.${PROJECT_VERSION_MAJOR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in
               ${PROJECT_BINARY_DIR}/include/tpushim/version.h @ONLY)

add_library(tpushim_headers INTERFACE)
add_library(tpushim::headers ALIAS tpushim_headers)
set_target_properties(tpushim_headers PROPERTIES EXPORT_NAME headers)
target_include_directories(tpushim_headers INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# --- libtpushim.so -----------------------------------------------------------
# A shared library needs one source of its own; all code is in the archives.
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/tpushim_shared.cc CONTENT
  "// libtpushim.so: its code is the internal libraries, linked whole-archive.\n")
add_library(tpushim_shared SHARED ${PROJECT_BINARY_DIR}/tpushim_shared.cc)
add_library(tpushim::tpushim ALIAS tpushim_shared)
set_target_properties(tpushim_shared PROPERTIES
  OUTPUT_NAME tpushim
  EXPORT_NAME tpushim
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/tpushim.map)
target_link_libraries(tpushim_shared
  PUBLIC tpushim_headers ${TPUSHIM_PUBLIC_ABSL_TARGETS}
  PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,${TPUSHIM_INTERNAL_LIBRARIES}>")
foreach(lib IN LISTS TPUSHIM_INTERNAL_LIBRARIES)
  # They are also reached without the feature, through each other.
  set_property(TARGET tpushim_shared PROPERTY
    LINK_LIBRARY_OVERRIDE_${lib} WHOLE_ARCHIVE)
endforeach()
target_link_options(tpushim_shared PRIVATE
  "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/tpushim.map"
  # Never unmapped by dlclose(): logging is process-wide and outlives every
  # System, with a writer thread and an atexit() flush running its code.
  "LINKER:-z,nodelete")
# Every symbol resolved at link time — except in sanitizer and fuzzing
# builds, where clang leaves the runtime's symbols (coverage callbacks
# included) to the executable.
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize" AND NOT TPUSHIM_FUZZ)
  target_link_options(tpushim_shared PRIVATE "LINKER:--no-undefined")
endif()

# --- libtpushim.a ------------------------------------------------------------
set(objects)
set(link_only)
foreach(lib IN LISTS TPUSHIM_INTERNAL_LIBRARIES)
  list(APPEND objects $<TARGET_OBJECTS:${lib}>)
  # The libraries the objects need at link time, named so that an installed
  # tpushimConfig.cmake can provide them.
  get_target_property(deps ${lib} LINK_LIBRARIES)
  foreach(dep IN LISTS deps)
    if(dep IN_LIST TPUSHIM_INTERNAL_LIBRARIES OR dep MATCHES
       "^(nlohmann_json::|CLI11::)")  # header-only
      continue()
    elseif(dep STREQUAL "PkgConfig::NUMA")
      list(APPEND link_only numa)
    elseif(dep MATCHES "^(absl::|spdlog::spdlog$|fmt::fmt$|Threads::Threads$)")
      list(APPEND link_only ${dep})
    else()
      message(FATAL_ERROR "libtpushim.a: ${lib} links ${dep}; teach "
        "cmake/TpushimPackaging.cmake and tpushimConfig.cmake.in about it")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES link_only)
list(REMOVE_ITEM link_only ${TPUSHIM_PUBLIC_ABSL_TARGETS})
set(TPUSHIM_STATIC_LINK_ONLY ${link_only})
list(TRANSFORM link_only PREPEND "$<LINK_ONLY:")
list(TRANSFORM link_only APPEND ">")

add_library(tpushim_static STATIC ${objects})
add_library(tpushim::tpushim_static ALIAS tpushim_static)
set_target_properties(tpushim_static PROPERTIES
  OUTPUT_NAME tpushim
  EXPORT_NAME tpushim_static)
target_link_libraries(tpushim_static
  PUBLIC tpushim_headers ${TPUSHIM_PUBLIC_ABSL_TARGETS}
  INTERFACE ${link_only})

# --- cmake --install ---------------------------------------------------------
set(TPUSHIM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tpushim)

install(TARGETS tpushim_shared tpushim_static tpushim_headers
  EXPORT tpushimTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS tpushim RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tpushim
                  ${PROJECT_BINARY_DIR}/include/tpushim
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

install(EXPORT tpushimTargets
  NAMESPACE tpushim::
  DESTINATION ${TPUSHIM_CMAKE_DIR})
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/tpushimConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tpushimConfig.cmake
  INSTALL_DESTINATION ${TPUSHIM_CMAKE_DIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/tpushimConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tpushimConfig.cmake
              ${PROJECT_BINARY_DIR}/tpushimConfigVersion.cmake
  DESTINATION ${TPUSHIM_CMAKE_DIR})

# tpushim.pc finds its prefix from its own place (${pcfiledir}), so it is
# right for any `cmake --install --prefix`.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  message(FATAL_ERROR "tpushim.pc: CMAKE_INSTALL_LIBDIR must be relative")
endif()
file(RELATIVE_PATH TPUSHIM_PC_TO_PREFIX
     /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" TPUSHIM_PC_TO_PREFIX "${TPUSHIM_PC_TO_PREFIX}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(TPUSHIM_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(TPUSHIM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
list(JOIN TPUSHIM_PUBLIC_ABSL_MODULES " " TPUSHIM_PC_REQUIRES)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tpushim.pc.in
               ${PROJECT_BINARY_DIR}/tpushim.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tpushim.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
