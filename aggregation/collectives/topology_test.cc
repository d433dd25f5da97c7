#include "cohort/aggregation/topology.h"

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

std::unique_ptr<Topology> make(std::string_view name, ConfigSection options = {}) {
  TopologyRegistry registry;
  add_builtin_topologies(registry);
  return registry.create(name, options);
}

MixingMatrix multiply(const MixingMatrix& a, const MixingMatrix& b) {
  MixingMatrix c(a.size());
  for (Rank i = 0; i < a.size(); ++i) {
    for (Rank j = 0; j < a.size(); ++j) {
      double s = 0;
      for (Rank k = 0; k < a.size(); ++k) s += a(i, k) * b(k, j);
      c(i, j) = s;
    }
  }
  return c;
}

TEST_CASE("every built-in topology gives doubly stochastic, nonnegative, sparse-as-declared W") {
  TopologyRegistry registry;
  add_builtin_topologies(registry);
  CHECK(registry.names() ==
        "complete, exponential, one_peer_exponential, random_regular, ring, time_varying, torus");
  CHECK_THROWS_AS((void)registry.create("hypercube", {}), ConfigError);
  CHECK_THROWS_AS(registry.add("ring", nullptr), ConfigError);
  for (const char* name : {"complete", "ring", "torus", "exponential", "one_peer_exponential",
                           "random_regular", "time_varying"}) {
    auto topo = registry.create(name, {});
    for (Rank n : {6u, 8u, 9u, 16u}) {
      for (std::uint64_t t = 0; t < 5; ++t) {
        CAPTURE(name);
        CAPTURE(n);
        const MixingMatrix w = topo->mixing(n, t);
        CHECK(w.nonnegative());
        CHECK(w.row_stochastic(1e-12));
        CHECK(w.column_stochastic(1e-12));
        if (topo->symmetric()) CHECK(w.symmetric());
        // Time-varying matrices come from (seed, t) alone.
        const MixingMatrix again = topo->mixing(n, t);
        for (Rank i = 0; i < n; ++i) {
          for (Rank j = 0; j < n; ++j) CHECK(w(i, j) == again(i, j));
        }
      }
    }
  }
}

TEST_CASE("ring: eigenvalues (1 + 2cos(2 pi k/n))/3 and the spectral gaps of docs/ALGORITHMS.md") {
  auto ring = make("ring");
  const Rank n = 16;
  auto ev = symmetric_eigenvalues(ring->mixing(n, 0));
  std::vector<double> want;
  for (Rank k = 0; k < n; ++k) want.push_back((1 + 2 * std::cos(2 * std::numbers::pi * k / n)) / 3);
  std::sort(want.begin(), want.end(), std::greater<>());
  for (Rank k = 0; k < n; ++k) CHECK(ev[k] == doctest::Approx(want[k]).epsilon(1e-10));
  CHECK(spectral_gap(ring->mixing(8, 0)) == doctest::Approx(0.195262).epsilon(1e-5));
  CHECK(spectral_gap(ring->mixing(16, 0)) == doctest::Approx(0.050747).epsilon(1e-5));
  CHECK(spectral_gap(ring->mixing(32, 0)) == doctest::Approx(0.012810).epsilon(1e-4));
  CHECK(spectral_gap(ring->mixing(64, 0)) == doctest::Approx(0.003210).epsilon(1e-3));
  // Closed form: rho = 1 - (1 + 2 cos(2 pi / n)) / 3 for even n >= 4 (lambda_2 dominates).
  for (Rank m : {8u, 16u, 32u}) {
    CHECK(spectral_gap(ring->mixing(m, 0)) ==
          doctest::Approx(1 - (1 + 2 * std::cos(2 * std::numbers::pi / m)) / 3).epsilon(1e-9));
  }
  const MixingMatrix w = ring->mixing(8, 0);
  CHECK(w(0, 0) == doctest::Approx(1.0 / 3));
  CHECK(w(0, 1) == doctest::Approx(1.0 / 3));
  CHECK(w(0, 7) == doctest::Approx(1.0 / 3));
  CHECK(w(0, 2) == 0);
}

TEST_CASE("torus, exponential and complete: the spectral facts of docs/ALGORITHMS.md") {
  CHECK(spectral_gap(make("torus")->mixing(16, 0)) == doctest::Approx(0.4).epsilon(1e-9));
  CHECK(spectral_gap(make("torus")->mixing(64, 0)) == doctest::Approx(0.117157).epsilon(1e-5));
  CHECK(make("torus")->mixing(16, 0)(0, 1) == doctest::Approx(0.2));
  auto expo = make("exponential");
  CHECK_FALSE(expo->symmetric());
  CHECK(1 - spectral_gap(expo->mixing(8, 0)) == doctest::Approx(0.5).epsilon(1e-9));
  CHECK(1 - spectral_gap(expo->mixing(16, 0)) == doctest::Approx(0.6).epsilon(1e-9));
  CHECK(1 - spectral_gap(expo->mixing(32, 0)) == doctest::Approx(2.0 / 3).epsilon(1e-9));
  CHECK(spectral_gap(make("complete")->mixing(7, 0)) == doctest::Approx(1.0));
  CHECK_THROWS_AS(
      (void)make("torus", ConfigSection("t", {{"rows", std::int64_t{3}}}))->mixing(16, 0),
      ConfigError);
}

TEST_CASE("one-peer exponential: the product of tau consecutive matrices is exactly 11^T/n") {
  auto topo = make("one_peer_exponential");
  for (Rank n : {8u, 16u, 32u}) {
    const Rank tau = static_cast<Rank>(std::log2(n));
    for (std::uint64_t start : {0u, 1u, 5u}) {
      MixingMatrix p = topo->mixing(n, start);
      for (Rank k = 1; k < tau; ++k) p = multiply(topo->mixing(n, start + k), p);
      for (Rank i = 0; i < n; ++i) {
        for (Rank j = 0; j < n; ++j) CHECK(p(i, j) == 1.0 / n);  // exact: powers of two
      }
    }
  }
}

TEST_CASE("random d-regular: connected, every node has d neighbours, weights 1/(d+1)") {
  auto topo = make("random_regular",
                   ConfigSection("t", {{"degree", std::int64_t{3}}, {"seed", std::int64_t{7}}}));
  const MixingMatrix w = topo->mixing(16, 0);
  for (Rank i = 0; i < 16; ++i) {
    int deg = 0;
    for (Rank j = 0; j < 16; ++j) {
      if (j != i && w(i, j) > 0) {
        ++deg;
        CHECK(w(i, j) == doctest::Approx(0.25));
      }
    }
    CHECK(deg == 3);
  }
  CHECK(spectral_gap(w) > 0);
  CHECK_THROWS_AS((void)topo->mixing(5, 0), ConfigError);  // 5 * 3 is odd
}

TEST_CASE("Metropolis-Hastings on a star with 3 leaves; push-sum weights are column-stochastic") {
  const MixingMatrix w = metropolis_hastings({{1, 2, 3}, {0}, {0}, {0}});
  for (Rank j = 0; j < 4; ++j) CHECK(w(0, j) == doctest::Approx(0.25));
  CHECK(w(1, 1) == doctest::Approx(0.75));
  CHECK(w(1, 0) == doctest::Approx(0.25));
  CHECK(w.symmetric());
  CHECK(w.row_stochastic());
  CHECK_THROWS_AS((void)metropolis_hastings({{1}, {}}), ConfigError);
  // Directed ring 0->1->2->3->4->0 plus 0->2.
  const MixingMatrix p = uniform_push_weights({{1, 2}, {2}, {3}, {4}, {0}});
  CHECK(p.column_stochastic());
  CHECK_FALSE(p.row_stochastic());
  CHECK(p(2, 0) == doctest::Approx(1.0 / 3));
}

TEST_CASE("neighbourhood: a gone neighbour's weight moves to self, and it is not sent to") {
  const MixingMatrix w = make("ring")->mixing(5, 0);
  const Neighbourhood all = neighbourhood(w, 0);
  CHECK(all.in.size() == 2);
  CHECK(all.out.size() == 2);
  CHECK(all.self_weight == doctest::Approx(1.0 / 3));
  const Neighbourhood some = neighbourhood(w, 0, {4});
  REQUIRE(some.in.size() == 1);
  CHECK(some.in[0].first == 1);
  CHECK(some.out.size() == 1);
  CHECK(some.self_weight == doctest::Approx(2.0 / 3));
}

}  // namespace
}  // namespace cohort::aggregation
