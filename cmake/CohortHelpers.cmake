# cohort_add_tests(NAME LABELS l... LINK t... SOURCES s... [TIMEOUT sec] [DEFINES d...])
# Builds one doctest binary (main supplied here) and registers it with CTest. The main
# (tests/support/doctest_main.cc) fails a run in which a test case passed with zero assertions or
# no test case ran, and exits with 77 when every test case that ran called
# cohort::test::skip_test_case() ("skip.h"): CTest then reports the test as skipped, not passed.
function(cohort_add_tests name)
  if(NOT COHORT_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS;LINK;SOURCES;DEFINES" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # doctest's implementation and main are compiled once, not once per test binary: it is the
  # heaviest translation unit in the tree, and CI builds the suite three times.
  if(NOT TARGET cohort_doctest_main)
    add_library(cohort_doctest_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/doctest_main.cc)
    target_link_libraries(cohort_doctest_main PRIVATE doctest::doctest cohort::options)
  endif()
  add_executable(${name} $<TARGET_OBJECTS:cohort_doctest_main> ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LINK} doctest::doctest cohort::warnings cohort::options)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(${name} PRIVATE ${ARG_DEFINES})
  # Test files compile at -O1 in optimised builds, the libraries they test at the build's level:
  # a test's time goes into the code it tests, and its own files are half of a build.
  if(NOT CMAKE_BUILD_TYPE STREQUAL "Debug")
    target_compile_options(${name} PRIVATE -O1)
  endif()
  # A sanitizer build leaves out the test cases in doctest's test suite "long": whole runs kept
  # for their learning outcome (an accuracy after several rounds) or for a deadline they wait out,
  # whose code paths shorter cases run under the sanitizers too. The Release pass runs them.
  set(args)
  if(COHORT_SANITIZE)
    set(args --test-suite-exclude=long)
  endif()
  add_test(NAME ${name} COMMAND ${name} ${args})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE 77)
  # Collected into the target cohort_unprivileged_tests (top-level CMakeLists.txt).
  if(NOT "root" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY COHORT_UNPRIVILEGED_TESTS ${name})
  endif()
endfunction()
