#include "cohort/aggregation/client_selector.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"

using namespace cohort::aggregation;

namespace {

std::unique_ptr<ClientSelector> make(const char* name,
                                     std::map<std::string, cohort::Value, std::less<>> o = {}) {
  static const auto reg = cohort::builtin_registries();
  return reg.client_selectors.create(name, cohort::ConfigSection("selector", std::move(o)));
}

std::vector<ClientInfo> fleet(std::size_t n) {
  std::vector<ClientInfo> c;
  for (std::size_t i = 0; i < n; ++i) {
    c.push_back({static_cast<cohort::ClientId>(100 + i), 10 * (i + 1), true, 1.0});
  }
  return c;
}

// Hoeffding for a frequency over N independent trials: P(|f - p| >= t) <= 2 exp(-2 N t^2).
// With N = 20000 and t = 0.022 that is 8e-9 per client, < 1e-7 for the (<= 10) clients checked.
constexpr int kTrials = 20000;
constexpr double kSlack = 0.022;

}  // namespace

TEST_CASE("selectors: deterministic for a seed, distinct, sorted, online only, capped") {
  auto clients = fleet(20);
  clients[3].online = false;
  clients[7].online = false;
  for (const char* name : {"uniform", "weighted", "availability_aware"}) {
    INFO(name);
    auto s = make(name);
    const auto a = s->select(clients, 5, 42);
    auto shuffled = clients;
    std::reverse(shuffled.begin(), shuffled.end());
    CHECK(s->select(shuffled, 5, 42) == a);  // the caller's order does not matter
    CHECK(a.size() == 5);
    CHECK(std::is_sorted(a.begin(), a.end()));
    CHECK(std::adjacent_find(a.begin(), a.end()) == a.end());
    for (auto id : a) CHECK((id != 103 && id != 107));
    bool differs = false;
    for (std::uint64_t seed = 1; seed < 10 && !differs; ++seed)
      differs = s->select(clients, 5, seed) != a;
    CHECK(differs);
    CHECK(s->select(clients, 100, 1).size() == 18);  // all online clients
    CHECK(s->select(clients, 0, 1).empty());
  }
  auto dup = fleet(3);
  dup[2].id = dup[0].id;
  CHECK_THROWS_AS(make("uniform")->select(dup, 2, 1), cohort::InternalError);
}

TEST_CASE("uniform: every client is included with probability count/K") {
  auto s = make("uniform");
  const auto clients = fleet(10);
  std::vector<int> hits(10, 0);
  for (int t = 0; t < kTrials; ++t) {
    for (auto id : s->select(clients, 3, static_cast<std::uint64_t>(t))) ++hits[id - 100];
  }
  for (int h : hits) CHECK(std::fabs(h / double(kTrials) - 0.3) <= kSlack);
}

TEST_CASE("weighted: a single pick has probability n_k / sum n; zero samples never picked") {
  auto s = make("weighted");
  auto clients = fleet(5);  // samples 10, 20, 30, 40, 50
  clients[4].num_samples = 0;
  std::vector<int> hits(5, 0);
  for (int t = 0; t < kTrials; ++t) {
    const auto pick = s->select(clients, 1, static_cast<std::uint64_t>(t));
    REQUIRE(pick.size() == 1);
    ++hits[pick[0] - 100];
  }
  CHECK(hits[4] == 0);
  for (int i = 0; i < 4; ++i)
    CHECK(std::fabs(hits[i] / double(kTrials) - (i + 1) / 10.0) <= kSlack);
  CHECK(s->select(clients, 10, 1).size() == 4);
}

TEST_CASE("availability_aware: weight max(reliability, floor)") {
  auto s = make("availability_aware", {{"floor", 0.1}});
  auto clients = fleet(4);
  const double rel[] = {1.0, 0.5, 0.0, 0.25};  // weights 1, 0.5, 0.1, 0.25: sum 1.85
  for (int i = 0; i < 4; ++i) clients[i].reliability = rel[i];
  std::vector<int> hits(4, 0);
  for (int t = 0; t < kTrials; ++t)
    ++hits[s->select(clients, 1, static_cast<std::uint64_t>(t))[0] - 100];
  const double w[] = {1.0, 0.5, 0.1, 0.25};
  for (int i = 0; i < 4; ++i) CHECK(std::fabs(hits[i] / double(kTrials) - w[i] / 1.85) <= kSlack);
}

TEST_CASE("poisson: each client independently with probability q; options validated") {
  // 1000 clients, q = 0.3: Hoeffding P(|n/1000 - 0.3| >= 0.09) <= 2 exp(-16.2) = 1.8e-7.
  auto s = make("poisson", {{"q", 0.3}});
  const auto picked = s->select(fleet(1000), 0, 9);
  CHECK(std::fabs(picked.size() / 1000.0 - 0.3) <= 0.09);
  CHECK_THROWS_WITH_AS(make("poisson"), doctest::Contains("q"), cohort::ConfigError);
  CHECK_THROWS_AS(make("poisson", {{"q", 1.5}}), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make("uniform", {{"fraction", 0.1}}), doctest::Contains("fraction"),
                       cohort::ConfigError);
  CHECK_THROWS_AS(make("availability_aware", {{"floor", 0.0}}), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(make("random"), doctest::Contains("uniform"), cohort::ConfigError);
}
