// Test cases that drive the shared doctest main (tests/support/doctest_main.cc) through each of
// its verdicts; issue_21_check.cmake runs this binary with one filter per verdict (issue 21,
// finding 7: CUDA tests that returned early with zero assertions counted as passed).
#include <doctest/doctest.h>

#include "skip.h"

TEST_CASE("asserts once") { CHECK(1 + 1 == 2); }

// What the CUDA tests did before issue 21: return early, having asserted nothing.
TEST_CASE("returns early asserting nothing") {
  const bool have_device = false;
  if (!have_device) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  CHECK(have_device);
}

TEST_CASE("skips at run time") {
  const bool have_device = false;
  if (!have_device) {
    cohort::test::skip_test_case("no device here");
    return;
  }
  CHECK(have_device);
}

TEST_CASE("disabled by its decorator" * doctest::skip()) { CHECK(false); }

TEST_CASE("fails an assertion") { CHECK(1 + 1 == 3); }
