#include "speed_selection.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace cohort::server {

double expected_completion(const SelectionCandidate& c) {
  const double done = static_cast<double>(std::min(c.completed, c.selected));
  return (done + 1) / (static_cast<double>(c.selected) + 2);
}

double fairness_weight(const SelectionCandidate& c, std::size_t k, std::size_t n) {
  if (n == 0) return 1;
  return 1 +
         static_cast<double>(c.since_selected) * static_cast<double>(k) / static_cast<double>(n);
}

std::vector<std::size_t> speed_aware_selection(std::span<const SelectionCandidate> candidates,
                                               std::size_t k, std::size_t cap,
                                               std::mt19937_64& rng) {
  const std::size_t n = candidates.size();
  std::vector<std::pair<double, std::size_t>> keys;
  keys.reserve(n);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::size_t i = 0; i < n; ++i) {
    // log(u) / w orders like u^(1/w) without underflow for large weights.
    const double u = std::max(unit(rng), 1e-300);
    keys.emplace_back(std::log(u) / fairness_weight(candidates[i], k, n), i);
  }
  const std::size_t most = std::min(std::max(cap, k), n), least = std::min(k, n);
  // Only the first `most` keys can be taken: order those (the same order as a full sort, whose
  // comparison is a strict total order), O(n log most) for a large pool.
  std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(most), keys.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  keys.resize(most);
  std::vector<std::size_t> out;
  double expected = 0;
  for (const auto& [key, i] : keys) {
    if (out.size() >= most) break;
    if (out.size() >= least && expected >= static_cast<double>(k)) break;
    out.push_back(i);
    expected += expected_completion(candidates[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cohort::server
