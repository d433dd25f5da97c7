// Run-time skips for doctest test cases, judged by the shared test main (doctest_main.cc).
//
// A test case that cannot run here (no CUDA device, no root) calls skip_test_case() and returns
// without asserting. The main then decides the binary's exit status:
//   - a test case that passed with zero assertions and did not call skip_test_case() fails the
//     binary: a test that asserts nothing is a defect, not a pass;
//   - when every test case that ran skipped, the binary exits with kSkipExitCode, which CTest
//     reports as "Skipped" (cohort_add_tests sets SKIP_RETURN_CODE), not "Passed";
//   - when only some skipped, the binary passes and names them on stderr: CTest has no partial
//     skip, so keep such cases in a binary of their own (as the CUDA tests are).
#pragma once

#include <string_view>

namespace cohort::test {

// The exit status of a test binary none of whose test cases could run (automake's convention).
inline constexpr int kSkipExitCode = 77;

// Marks the running test case as skipped for `reason`; the caller returns right after. Call it
// from the test case's own thread, before any assertion.
void skip_test_case(std::string_view reason);

}  // namespace cohort::test
