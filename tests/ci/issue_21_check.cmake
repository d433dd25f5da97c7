# Checks of the shared doctest main's verdicts (issue 21, finding 7), run by CTest:
#
# cmake -DBINARY=<path> -DARG=<one argument> -DEXPECT_EXIT=<n> [-DEXPECT_OUTPUT=<regex>] -P <this>
# Runs BINARY ARG and fails unless it exits with EXPECT_EXIT and its stdout + stderr match
# EXPECT_OUTPUT. CTest alone can only tell zero from non-zero (and SKIP_RETURN_CODE).
#
# cmake -DCUDA_TEST=<binary> -P <this>
# Runs a CUDA test binary: it must either skip (exit 77, naming the missing device) or pass
# having run assertions; before issue 21 they passed with none on a machine without a device.
cmake_minimum_required(VERSION 3.25)

function(run_and_capture out_rc out_text)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 120)
  set(${out_rc} "${rc}" PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

if(DEFINED CUDA_TEST)
  run_and_capture(rc text "${CUDA_TEST}")
  if(rc EQUAL 77 AND text MATCHES "skipped[^\n]*no CUDA device")
    message(STATUS "${CUDA_TEST}: skipped (exit 77), as it must be without a device")
  elseif(rc EQUAL 0 AND text MATCHES "assertions: *[1-9]")
    message(STATUS "${CUDA_TEST}: passed, having run assertions")
  else()
    message(FATAL_ERROR "${CUDA_TEST}: exit ${rc}; expected 77 (skipped, no device) or 0 with "
                        "assertions run. Output:\n${text}")
  endif()
  return()
endif()

run_and_capture(rc text "${BINARY}" "${ARG}")
if(NOT rc STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "exit ${rc}, expected ${EXPECT_EXIT}: ${BINARY} '${ARG}'\nOutput:\n${text}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT text MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECT_OUTPUT}': ${BINARY} '${ARG}'\n"
                      "Output:\n${text}")
endif()
message(STATUS "exit ${rc} as expected: ${BINARY} '${ARG}'")
