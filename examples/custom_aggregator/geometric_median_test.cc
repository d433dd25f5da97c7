// Checks of the rule through the registry, as the shard drives it. A plain program (CTest counts a
// non-zero exit as a failure), so the example needs nothing beyond the Cohort package.
#include "geometric_median.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "cohort/core/error.h"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

// Runs one round over `updates` (equal weights) and returns the aggregate.
std::vector<float> aggregate(cohort::aggregation::Aggregator& agg,
                             const std::vector<std::vector<float>>& updates) {
  const std::size_t d = updates.front().size();
  agg.begin_round(1, d);
  cohort::ClientId id = 1;
  for (const auto& u : updates) {
    if (agg.accept({.client = id, .offset = 0, .values = u}) !=
        cohort::aggregation::Verdict::kAccepted) {
      check(false, "an update of the right size is accepted");
    }
    agg.end_update(id++, true);
  }
  std::vector<float> out(d);
  check(agg.finish_round(out), "finish_round succeeds");
  return out;
}

}  // namespace

int main() {
  cohort::aggregation::AggregatorRegistry registry;
  custom::add_geometric_median(registry);
  const cohort::ConfigSection defaults;
  auto agg = registry.create("geometric_median", defaults);

  auto one = aggregate(*agg, {{1.5f, -2.0f, 3.0f}});
  check(one == std::vector<float>{1.5f, -2.0f, 3.0f}, "one update: the aggregate is that update");

  // In one dimension the geometric median is the median.
  auto line = aggregate(*agg, {{0.0f}, {1.0f}, {10.0f}});
  check(std::abs(line[0] - 1.0f) < 1e-3f, "points on a line: the median, 1");

  // The Fermat point of an equilateral triangle is its centroid.
  const float h = std::sqrt(3.0f) / 2;
  auto tri = aggregate(*agg, {{0, 0}, {1, 0}, {0.5f, h}});
  check(std::abs(tri[0] - 0.5f) < 1e-4f && std::abs(tri[1] - h / 3) < 1e-4f,
        "equilateral triangle: the centroid");

  // One update of five at 1e6 barely moves the result; the mean would move by 2e5.
  auto robust =
      aggregate(*agg, {{1.0f, 1.0f}, {1.1f, 0.9f}, {0.9f, 1.1f}, {1.0f, 1.05f}, {1e6f, -1e6f}});
  check(std::abs(robust[0] - 1.0f) < 0.2f && std::abs(robust[1] - 1.0f) < 0.2f,
        "one outlier at 1e6: the aggregate stays with the other four");

  std::vector<float> out(2);
  agg->begin_round(2, 2);
  check(!agg->finish_round(out), "no updates: finish_round refuses the round");

  const std::vector<float> wrong{1, 2, 3};
  agg->begin_round(3, 2);
  check(agg->accept({.client = 1, .offset = 0, .values = wrong}) ==
            cohort::aggregation::Verdict::kRejected,
        "an update of the wrong size is rejected, not thrown");

  bool threw = false;
  try {
    const cohort::ConfigSection typo("aggregator", {{"epsilon", 0.1}});
    (void)registry.create("geometric_median", typo);
  } catch (const cohort::ConfigError&) {
    threw = true;
  }
  check(threw, "an unknown option is a ConfigError");

  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
