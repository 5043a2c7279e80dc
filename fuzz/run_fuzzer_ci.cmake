# Runs a fuzz target for CTest (fuzz/CMakeLists.txt):
#
#   cmake -DFUZZER=<executable> -DSEEDS=<seed corpus> -DWORK_DIR=<dir>
#         -P run_fuzzer_ci.cmake -- <libFuzzer flags>
#
# libFuzzer adds the inputs it finds to the first corpus directory it is
# given, so a fresh WORK_DIR/corpus comes first and the seed corpus in the
# source tree is only read. Fails when libFuzzer does — a crash, a failed
# check, a leak, a timeout or too much memory — keeping the input that did
# it in WORK_DIR/artifacts/; on success WORK_DIR is removed.

foreach(variable FUZZER SEEDS WORK_DIR)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "run_fuzzer_ci.cmake: -D${variable}=... is missing")
  endif()
endforeach()

# The arguments after `--`.
set(flags)
set(in_flags FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(in_flags)
    list(APPEND flags "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(in_flags TRUE)
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/corpus" "${WORK_DIR}/artifacts")
execute_process(
  COMMAND "${FUZZER}" ${flags} "-artifact_prefix=${WORK_DIR}/artifacts/"
          "${WORK_DIR}/corpus" "${SEEDS}"
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${result}); the failing input is "
    "in ${WORK_DIR}/artifacts/ (reproduce: ${FUZZER} <that file>)")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
