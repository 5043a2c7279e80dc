# Helper functions shared by every tpushim target.

# Warnings are on, and fatal, for tpushim's own code only.
set(TPUSHIM_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wcast-align -Wunused -Woverloaded-virtual -Wnull-dereference -Werror)

# tpushim_add_library(NAME SRCS ... DEPS ...)
# A static internal module library, with a tpushim:: alias.
function(tpushim_add_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  add_library(tpushim::${name} ALIAS ${name})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
  target_compile_options(${name} PRIVATE ${TPUSHIM_WARNING_FLAGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# tpushim_add_test(NAME SRCS ... DEPS ... [LABELS ...])
# A GoogleTest executable whose tests are registered one by one with CTest.
function(tpushim_add_test name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_compile_options(${name} PRIVATE ${TPUSHIM_WARNING_FLAGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  set(properties TIMEOUT 300)
  if(ARG_LABELS)
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
    PROPERTIES ${properties})
endfunction()

# tpushim_add_bench(NAME SRCS ... DEPS ...)
function(tpushim_add_bench name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_compile_options(${name} PRIVATE ${TPUSHIM_WARNING_FLAGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} benchmark::benchmark)
endfunction()
