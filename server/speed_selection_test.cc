// server.selection = speed_aware (speed_selection.h): expected completions, fairness weights, and
// the draw that over-selects only for clients not yet trusted.
#include "speed_selection.h"

#include <doctest/doctest.h>

#include <algorithm>

namespace cohort::server {
namespace {

TEST_CASE("speed_aware: Laplace's rule for completions, weights that grow with the wait") {
  CHECK(expected_completion({}) == doctest::Approx(0.5));
  CHECK(expected_completion({.selected = 8, .completed = 8}) == doctest::Approx(0.9));
  CHECK(expected_completion({.selected = 8, .completed = 0}) == doctest::Approx(0.1));
  CHECK(expected_completion({.selected = 2, .completed = 5}) == doctest::Approx(0.75));  // capped
  CHECK(fairness_weight({.since_selected = 0}, 10, 30) == doctest::Approx(1));
  CHECK(fairness_weight({.since_selected = 3}, 10, 30) == doctest::Approx(2));
  CHECK(fairness_weight({.since_selected = 30}, 10, 30) == doctest::Approx(11));
  CHECK(fairness_weight({.since_selected = 5}, 10, 0) == doctest::Approx(1));
}

TEST_CASE("speed_aware: reliable clients are not over-selected, new ones up to the cap") {
  std::mt19937_64 rng(7);
  std::vector<SelectionCandidate> reliable(30,
                                           {.selected = 18, .completed = 18, .since_selected = 1});
  std::vector<SelectionCandidate> fresh(30, SelectionCandidate{});
  for (int trial = 0; trial < 20; ++trial) {
    // expected 19/20 each: 10 picks reach 9.5, 11 reach 10.45.
    CHECK(speed_aware_selection(reliable, 10, 15, rng).size() == 11);
    CHECK(speed_aware_selection(fresh, 10, 15, rng).size() == 15);    // 1/2 each: the cap binds
    CHECK(speed_aware_selection(fresh, 10, 10, rng).size() == 10);    // overselect = 1
    CHECK(speed_aware_selection(fresh, 10, 40, rng).size() == 20);    // 20 halves make 10
    CHECK(speed_aware_selection(reliable, 10, 5, rng).size() == 10);  // never fewer than k
  }
  const auto some = speed_aware_selection(std::span(fresh).first(4), 10, 15, rng);
  CHECK(some == std::vector<std::size_t>{0, 1, 2, 3});  // fewer candidates than k: all of them
  const auto picked = speed_aware_selection(fresh, 10, 10, rng);
  CHECK(std::is_sorted(picked.begin(), picked.end()));
  CHECK(std::adjacent_find(picked.begin(), picked.end()) == picked.end());
}

TEST_CASE("speed_aware: over 20 rounds of 10 from 30, every client is selected, none starves") {
  // The same loop the coordinator runs, with a third of the clients never completing (too slow
  // for the deadline): they keep being selected, at least as often as uniform sampling would
  // make likely, and nobody waits longer than a few multiples of n / k = 3 rounds.
  for (std::uint64_t seed = 1; seed <= 50; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    std::vector<SelectionCandidate> c(30);
    std::vector<std::uint64_t> last(30, 0), longest_wait(30, 0);
    for (std::uint64_t round = 1; round <= 20; ++round) {
      for (std::size_t i = 0; i < c.size(); ++i) c[i].since_selected = round - last[i];
      for (std::size_t i : speed_aware_selection(c, 10, 13, rng)) {
        longest_wait[i] = std::max(longest_wait[i], round - last[i]);
        last[i] = round;
        ++c[i].selected;
        if (i % 3 != 0) ++c[i].completed;
      }
    }
    for (std::size_t i = 0; i < c.size(); ++i) {
      CAPTURE(i);
      CHECK(c[i].selected >= 3);
      CHECK(longest_wait[i] <= 12);
    }
  }
}

TEST_CASE("speed_aware: the same seed draws the same cohort") {
  std::vector<SelectionCandidate> c(50);
  for (std::size_t i = 0; i < c.size(); ++i)
    c[i] = {.selected = i % 7, .completed = i % 5, .since_selected = i % 4};
  std::mt19937_64 a(42), b(42);
  CHECK(speed_aware_selection(c, 10, 14, a) == speed_aware_selection(c, 10, 14, b));
}

}  // namespace
}  // namespace cohort::server
