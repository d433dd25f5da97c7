# cohort_add_tests(NAME LABELS l... LINK t... SOURCES s... [TIMEOUT sec] [DEFINES d...]
#                  [PROCESSORS n] [RESOURCE_LOCK r...] [RUN_SERIAL] [PER_SOURCE] [COST sec])
# Builds one doctest binary (main supplied here) and registers it with CTest. The main
# (tests/support/doctest_main.cc) fails a run in which a test case passed with zero assertions or
# no test case ran, and exits with 77 when every test case that ran called
# cohort::test::skip_test_case() ("skip.h"): CTest then reports the test as skipped, not passed.
# scripts/test.sh runs CTest with -j 2:
# - PROCESSORS: the cores a run keeps busy (default 1); at -j 2 a test with 2 runs alone.
# - RESOURCE_LOCK: tests that hold the same resource never run at the same time.
# - RUN_SERIAL: runs with no other test (one that compares CPU speeds). It is labelled `serial`
#   too: scripts/test.sh runs those after the build it keeps in the background beside the others.
# - PER_SOURCE: one CTest test per .cc source file, NAME.<file stem> (doctest's --source-file), so
#   that the parts of a long binary run side by side.
# - COST: about the seconds its longer run takes (Release or ASan). CTest starts the costly tests
#   first when it has no timings of its own yet (a cold CI checkout), so that no long test is left
#   to run alone at the end.
function(cohort_add_tests name)
  if(NOT COHORT_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "RUN_SERIAL;PER_SOURCE" "TIMEOUT;PROCESSORS;COST"
    "LABELS;LINK;SOURCES;DEFINES;RESOURCE_LOCK" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # doctest's implementation and main are compiled once, not once per test binary: it is the
  # heaviest translation unit in the tree, and CI builds the suite three times.
  if(NOT TARGET cohort_doctest_main)
    add_library(cohort_doctest_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/doctest_main.cc)
    target_link_libraries(cohort_doctest_main PRIVATE doctest::doctest cohort::options)
    target_compile_options(cohort_doctest_main PRIVATE -O0)
  endif()
  add_executable(${name} $<TARGET_OBJECTS:cohort_doctest_main> ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LINK} doctest::doctest cohort::warnings cohort::options)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support)
  target_compile_definitions(${name} PRIVATE ${ARG_DEFINES})
  # Test files compile at -O0, the libraries they test at the build's level: a test's time goes
  # into the code it tests, and its own files are half of a build (docs/PERFORMANCE.md 13).
  # Under ThreadSanitizer at -O1: its tests run last, alone, and every access a test file makes
  # at -O0 (byte loops over 64 MiB payloads) is a TSan check.
  if(COHORT_SANITIZE STREQUAL "thread")
    target_compile_options(${name} PRIVATE -O1)
  else()
    target_compile_options(${name} PRIVATE -O0)
  endif()
  # A sanitizer build leaves out the test cases in doctest's test suite "long": whole runs kept
  # for their learning outcome (an accuracy after several rounds) or for a deadline they wait out,
  # whose code paths shorter cases run under the sanitizers too. The Release pass runs them.
  set(args)
  if(COHORT_SANITIZE)
    set(args --test-suite-exclude=long)
  endif()
  set(tests)
  if(ARG_PER_SOURCE)
    foreach(source ${ARG_SOURCES})
      if(NOT source MATCHES "\\.cc$")
        continue()
      endif()
      get_filename_component(stem ${source} NAME_WE)
      add_test(NAME ${name}.${stem} COMMAND ${name} ${args} --source-file=*/${source})
      list(APPEND tests ${name}.${stem})
    endforeach()
  else()
    add_test(NAME ${name} COMMAND ${name} ${args})
    set(tests ${name})
  endif()
  if(NOT ARG_PROCESSORS)
    set(ARG_PROCESSORS 1)
  endif()
  set_tests_properties(${tests} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    SKIP_RETURN_CODE 77 PROCESSORS ${ARG_PROCESSORS})
  if(ARG_RESOURCE_LOCK)
    set_tests_properties(${tests} PROPERTIES RESOURCE_LOCK "${ARG_RESOURCE_LOCK}")
  endif()
  if(ARG_RUN_SERIAL)
    set_tests_properties(${tests} PROPERTIES RUN_SERIAL TRUE)
    set_property(TEST ${tests} APPEND PROPERTY LABELS serial)
  endif()
  if(ARG_COST)
    set_tests_properties(${tests} PROPERTIES COST ${ARG_COST})
  endif()
  # Collected into the target cohort_unprivileged_tests (top-level CMakeLists.txt).
  if(NOT "root" IN_LIST ARG_LABELS)
    set_property(GLOBAL APPEND PROPERTY COHORT_UNPRIVILEGED_TESTS ${name})
  endif()
endfunction()

# Under sanitizers, every executable's own files (the programs' mains, the test files, the
# benchmarks' drivers: glue whose run time goes into the libraries they call) compile at -O0,
# the libraries at the build's level: instrumented code is slow to optimise, and these files
# are most of CI's sanitizer builds (docs/PERFORMANCE.md 13). Called once from the top-level
# CMakeLists.txt after every subdirectory; walks them all. An executable that already chose its
# level (the test binaries, in cohort_add_tests) keeps it.
function(cohort_sanitizer_glue_at_O0 dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    get_target_property(options ${target} COMPILE_OPTIONS)
    if(type STREQUAL "EXECUTABLE" AND NOT "${options}" MATCHES "(^|;)-O[0-3gs](;|$)")
      target_compile_options(${target} PRIVATE -O0)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir ${subdirs})
    cohort_sanitizer_glue_at_O0(${subdir})
  endforeach()
endfunction()
