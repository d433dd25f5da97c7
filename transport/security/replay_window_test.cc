#include "cohort/transport/security/replay_window.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

using cohort::transport::security::ReplayWindow;

TEST_CASE("in-order counters are accepted once, duplicates refused") {
  ReplayWindow w;
  for (std::uint64_t c = 0; c < 5000; ++c) REQUIRE(w.accept(c));
  CHECK(w.highest() == 4999);
  CHECK_FALSE(w.accept(4999));
  CHECK_FALSE(w.accept(4000));
  CHECK_FALSE(w.accept(0));
}

TEST_CASE("out-of-order counters within the window are accepted exactly once") {
  ReplayWindow w;
  REQUIRE(w.accept(100));
  REQUIRE(w.accept(1099));  // window now covers 76 .. 1099
  CHECK(w.accept(99));
  CHECK(w.accept(500));
  CHECK(w.accept(76));
  CHECK_FALSE(w.accept(500));
  CHECK_FALSE(w.accept(100));
  CHECK_FALSE(w.accept(76));
  CHECK_FALSE(w.accept(75));  // just older than the window
  CHECK(w.accept(1098));
  CHECK_FALSE(w.accept(1098));
}

TEST_CASE("counters older than the window are refused, the window's edge accepted") {
  ReplayWindow w;
  REQUIRE(w.accept(10'000));
  CHECK(w.accept(10'000 - ReplayWindow::kWindowSize + 1));
  CHECK_FALSE(w.accept(10'000 - ReplayWindow::kWindowSize));
  CHECK_FALSE(w.accept(0));
}

TEST_CASE("large jumps clear the window, and old slots do not alias new counters") {
  ReplayWindow w;
  for (std::uint64_t c = 0; c < 1024; ++c) REQUIRE(w.accept(c));
  // Every slot is now set; a jump past the window reuses them all (2048 lands in slot 0).
  REQUIRE(w.accept(2048));
  for (std::uint64_t c = 1025; c < 2048; ++c) CHECK(w.accept(c));  // none seen before
  CHECK_FALSE(w.accept(1024));                                     // too old now
  REQUIRE(w.accept(1'000'000'000'000));
  CHECK_FALSE(w.accept(2048));
  CHECK(w.accept(1'000'000'000'000 - 1));
  CHECK_FALSE(w.accept(1'000'000'000'000));
  const std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
  REQUIRE(w.accept(top));
  CHECK_FALSE(w.accept(top));
  CHECK(w.accept(top - 1023));
  CHECK_FALSE(w.accept(top - 1024));
}

TEST_CASE("a small slide keeps the still-covered history") {
  ReplayWindow w;
  for (std::uint64_t c = 0; c < 1024; c += 2) REQUIRE(w.accept(c));  // evens 0..1022
  REQUIRE(w.accept(1100));                                           // window now 77 .. 1100
  for (std::uint64_t c = 77; c < 1023; ++c) {
    CAPTURE(c);
    CHECK(w.accept(c) == (c % 2 == 1));  // evens were seen, odds are new
  }
  for (std::uint64_t c = 1023; c < 1100; ++c) CHECK(w.accept(c));
  CHECK_FALSE(w.accept(76));
}

TEST_CASE("the first counter may be anything") {
  ReplayWindow a, b;
  CHECK(a.accept(0));
  CHECK_FALSE(a.accept(0));
  CHECK(b.accept(123456789));
  CHECK(b.accept(123456789 - 5));
}
