// Cases every registered aggregator must pass (docs/STYLE.md section 2), run over the registry so that
// a new built-in is covered by registering it.
#include <doctest/doctest.h>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cohort/aggregation/registries.h"

using namespace cohort::aggregation;

namespace {

std::vector<std::string> registered(const AggregatorRegistry& reg) {
  std::vector<std::string> out;
  std::stringstream ss(reg.names());
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name.front() == ' ') name.erase(0, 1);
    out.push_back(name);
  }
  return out;
}

// Options for rules that need some; every other rule runs with its defaults.
cohort::ConfigSection options_for(const std::string& name) {
  if (name == "norm_clip") return cohort::ConfigSection("aggregator", {{"bound", 100.0}});
  return cohort::ConfigSection("aggregator", {});
}

// Feeds one client's whole update: in two chunks for streaming rules, in one piece otherwise.
Verdict feed(Aggregator& agg, cohort::ClientId client, std::span<const float> u, double w = 1) {
  if (agg.is_streaming() && u.size() > 1) {
    const std::size_t half = u.size() / 2;
    if (agg.accept({client, 0, u.first(half), w}) == Verdict::kRejected) return Verdict::kRejected;
    return agg.accept({client, half, u.subspan(half), w});
  }
  return agg.accept({client, 0, u, w});
}

}  // namespace

TEST_CASE("conformance: every registered aggregator") {
  const auto reg = cohort::builtin_registries();
  const auto names = registered(reg.aggregators);
  REQUIRE(names.size() >= 7);
  const std::vector<float> u{0.5f, -1.25f, 2.0f, 1e-3f, -7.0f};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const auto& name : names) {
    CAPTURE(name);
    auto fresh = [&] { return reg.aggregators.create(name, options_for(name)); };
    const std::size_t need = fresh()->min_updates();
    REQUIRE(need >= 1);
    {
      INFO("one client (or min_updates() copies of it) gives the client's update");
      auto agg = fresh();
      agg->begin_round(1, u.size());
      for (std::size_t c = 0; c < need; ++c) {
        REQUIRE(feed(*agg, static_cast<cohort::ClientId>(10 + c), u) == Verdict::kAccepted);
        agg->end_update(static_cast<cohort::ClientId>(10 + c), true);
      }
      CHECK(agg->completed_updates() == need);
      std::vector<float> out(u.size());
      REQUIRE(agg->finish_round(out));
      for (std::size_t i = 0; i < u.size(); ++i)
        CHECK(out[i] == doctest::Approx(u[i]).epsilon(1e-6));
    }
    {
      INFO("wrong size gives kRejected");
      auto agg = fresh();
      agg->begin_round(1, u.size());
      const std::vector<float> longer{1, 2, 3, 4, 5, 6};
      CHECK(agg->accept({1, 0, longer, 1}) == Verdict::kRejected);
      CHECK(agg->accept({2, 3, std::span(u).first(3), 1}) == Verdict::kRejected);  // past the end
      if (!agg->is_streaming()) {
        CHECK(agg->accept({3, 0, std::span(u).first(4), 1}) == Verdict::kRejected);  // not whole
      }
    }
    {
      INFO("no updates gives false and leaves out untouched");
      auto agg = fresh();
      agg->begin_round(1, u.size());
      std::vector<float> out(u.size(), 42.0f);
      CHECK_FALSE(agg->finish_round(out));
      for (float v : out) CHECK(v == 42.0f);
    }
    if (need > 1) {
      INFO("fewer than min_updates() gives false");
      auto agg = fresh();
      agg->begin_round(1, u.size());
      for (std::size_t c = 0; c + 1 < need; ++c) {
        REQUIRE(feed(*agg, static_cast<cohort::ClientId>(c), u) == Verdict::kAccepted);
        agg->end_update(static_cast<cohort::ClientId>(c), true);
      }
      std::vector<float> out(u.size());
      CHECK_FALSE(agg->finish_round(out));
    }
    {
      INFO("non-finite values and bad weights give kRejected; the round goes on");
      auto agg = fresh();
      agg->begin_round(2, u.size());
      for (float bad : {nan, inf, -inf}) {
        std::vector<float> v = u;
        v[3] = bad;
        CHECK(agg->accept({7, 0, v, 1}) == Verdict::kRejected);
      }
      agg->end_update(7, false);
      CHECK(agg->accept({8, 0, u, 0.0}) == Verdict::kRejected);
      CHECK(agg->accept({9, 0, u, nan}) == Verdict::kRejected);
      for (std::size_t c = 0; c < need; ++c) {
        REQUIRE(feed(*agg, static_cast<cohort::ClientId>(20 + c), u) == Verdict::kAccepted);
        agg->end_update(static_cast<cohort::ClientId>(20 + c), true);
      }
      CHECK(agg->accept({20, 0, u, 1}) == Verdict::kRejected);  // ended already
      std::vector<float> out(u.size());
      REQUIRE(agg->finish_round(out));
      CHECK(out[0] == doctest::Approx(u[0]).epsilon(1e-6));
    }
  }
}
