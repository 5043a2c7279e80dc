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
  if(TPUSHIM_FUZZ)
    # Coverage feedback for the fuzz targets (fuzz/), which link these
    # libraries. Every executable linking one gets a runtime defining the
    # coverage callbacks: libFuzzer in a fuzz target (-fsanitize=fuzzer),
    # the sanitizer runtime elsewhere, so the tests keep GoogleTest's main.
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer-no-link)
    target_link_options(${name} INTERFACE -fsanitize=fuzzer-no-link)
  endif()
endfunction()

# tpushim_add_test(NAME SRCS ... DEPS ... [LABELS ...])
# A GoogleTest executable whose tests are registered one by one with CTest
# (label `concurrency` added when NAME is in TPUSHIM_CONCURRENCY_TESTS).
function(tpushim_add_test name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;LABELS" ${ARGN})
  # Every test process gets its own run directory (chip locks), unless its
  # runner gives one: see tests/testing/private_run_dir.cc.
  add_executable(${name} ${ARG_SRCS}
    ${PROJECT_SOURCE_DIR}/tests/testing/private_run_dir.cc)
  target_compile_options(${name} PRIVATE ${TPUSHIM_WARNING_FLAGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  set(properties TIMEOUT 300)
  set(labels ${ARG_LABELS})
  # The ThreadSanitizer job (scripts/test.sh tsan) builds and runs only the
  # suites listed in TPUSHIM_CONCURRENCY_TESTS (tests/CMakeLists.txt).
  if(name IN_LIST TPUSHIM_CONCURRENCY_TESTS)
    list(APPEND labels concurrency)
  endif()
  if(labels)
    list(APPEND properties LABELS "${labels}")
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

# tpushim_private_run_dirs()
# Gives every test added so far with add_test in the current directory
# TPUSHIM_RUN_DIR=<build>/run/<test>, so that no two tests share chip locks
# (gtest programs make their own: tests/testing/private_run_dir.cc). Call it
# at the end of a CMakeLists.txt that calls add_test.
function(tpushim_private_run_dirs)
  file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/run)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(test ${tests})
    set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT
      "TPUSHIM_RUN_DIR=${PROJECT_BINARY_DIR}/run/${test}")
  endforeach()
endfunction()
