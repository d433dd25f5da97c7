#include <doctest/doctest.h>

#include <algorithm>

#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/error.h"

using namespace cohort::aggregation::secagg;

namespace {
Key test_seed(std::uint8_t v) {
  Key k{};
  k.fill(v);
  return k;
}
}  // namespace

TEST_CASE("lagrange at zero by hand: f(x) = 5 + 3x + 2x^2 through x = 1, 2, 3") {
  const std::vector<std::uint64_t> xs{1, 2, 3}, ys{10, 19, 32};
  CHECK(lagrange_at_zero(xs, ys) == 5);
  const std::vector<std::uint64_t> x2{2, 2}, y2{1, 1};
  CHECK_THROWS_AS((void)lagrange_at_zero(x2, y2), cohort::ProtocolError);
}

TEST_CASE("shamir: every t-subset of n shares reconstructs the secret") {
  std::vector<std::uint8_t> secret(32);
  for (std::size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<std::uint8_t>(7 * i + 1);
  const std::vector<std::uint64_t> xs{11, 12, 13, 14, 15};
  const Key seed = test_seed(3);
  const auto shares = shamir_split(secret, 3, xs, &seed);
  CHECK(shares == shamir_split(secret, 3, xs, &seed));  // deterministic for a seed
  std::vector<int> pick{0, 0, 1, 1, 1};                 // all 10 subsets of size 3
  do {
    std::vector<Share> subset;
    for (std::size_t i = 0; i < 5; ++i) {
      if (pick[i]) subset.push_back(shares[i]);
    }
    CHECK(shamir_combine(subset, 32) == secret);
  } while (std::next_permutation(pick.begin(), pick.end()));
  // More than t consistent shares give the same answer.
  CHECK(shamir_combine(shares, 32) == secret);
  // With CSPRNG coefficients too.
  const auto fresh = shamir_split(secret, 3, xs);
  CHECK(shamir_combine(std::span(fresh).first(3), 32) == secret);
}

TEST_CASE("shamir: t - 1 shares do not give the secret (except with probability 1/p)") {
  const std::vector<std::uint8_t> secret{0x78, 0x56, 0x34, 0x12};  // one limb, 0x12345678
  const std::vector<std::uint64_t> xs{1, 2, 3, 4};
  for (std::uint8_t s = 1; s <= 20; ++s) {
    const Key seed = test_seed(s);
    const auto shares = shamir_split(secret, 4, xs, &seed);
    std::vector<std::uint64_t> px, py;
    for (int i = 0; i < 3; ++i) {
      px.push_back(shares[i].x);
      py.push_back(shares[i].y[0]);
    }
    CHECK(lagrange_at_zero(px, py) != 0x12345678u);
    px.push_back(shares[3].x);
    py.push_back(shares[3].y[0]);
    CHECK(lagrange_at_zero(px, py) == 0x12345678u);
  }
}

TEST_CASE("shamir: bad arguments") {
  const std::vector<std::uint8_t> secret(8, 1);
  const std::vector<std::uint64_t> xs{1, 2, 3};
  CHECK_THROWS_AS((void)shamir_split(secret, 4, xs), cohort::ConfigError);
  CHECK_THROWS_AS((void)shamir_split(secret, 0, xs), cohort::ConfigError);
  CHECK_THROWS_AS((void)shamir_split(std::vector<std::uint8_t>(5), 2, xs), cohort::ConfigError);
  CHECK_THROWS_AS((void)shamir_split(secret, 2, std::vector<std::uint64_t>{1, 1}),
                  cohort::ConfigError);
  CHECK_THROWS_AS((void)shamir_split(secret, 2, std::vector<std::uint64_t>{0, 1}),
                  cohort::ConfigError);
  auto shares = shamir_split(secret, 2, xs);
  shares[1].y.pop_back();
  CHECK_THROWS_AS((void)shamir_combine(shares, 8), cohort::ProtocolError);
}
