// Helpers shared by the aggregation tests (private to the test binary).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cohort/aggregation/aggregator.h"
#include "cohort/core/random.h"

namespace cohort::aggregation::testing {

// Runs one round of whole-update accepts (clients 0..n-1, weight 1 unless given) and returns
// whether finish_round() succeeded; out receives the result.
inline bool run_round(Aggregator& agg, const std::vector<std::vector<float>>& updates,
                      std::vector<float>& out, const std::vector<double>& weights = {}) {
  const std::size_t d = updates.empty() ? out.size() : updates[0].size();
  agg.begin_round(1, d);
  for (std::size_t c = 0; c < updates.size(); ++c) {
    const double w = weights.empty() ? 1.0 : weights[c];
    if (agg.accept({static_cast<ClientId>(c), 0, updates[c], w}) != Verdict::kAccepted)
      return false;
    agg.end_update(static_cast<ClientId>(c), true);
  }
  out.assign(d, 0.0f);
  return agg.finish_round(out);
}

// A small deterministic generator for test data: SplitMix64 from the raw seed (no seed mixing,
// unlike SplitMixRng, so the recorded test data stays what it was).
class TestRng {
 public:
  explicit TestRng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() { return splitmix64(s_); }
  double uniform() { return unit_double(next()); }  // [0, 1)
  float between(double lo, double hi) { return static_cast<float>(lo + (hi - lo) * uniform()); }
  double normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1) * 0x1.0p-53;
    return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * uniform());
  }

 private:
  std::uint64_t s_;
};

}  // namespace cohort::aggregation::testing
