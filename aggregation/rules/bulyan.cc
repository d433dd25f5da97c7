// Bulyan (docs/ALGORITHMS.md section 2; El Mhamdi et al. 2018).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "builtins.h"
#include "cohort/aggregation/robust.h"

namespace cohort::aggregation {

bool Bulyan::combine(std::span<const std::span<const float>> updates,
                     std::span<const ClientId> clients, std::span<const double> /*weights*/,
                     std::span<float> out) {
  const std::size_t m = updates.size();
  if (m < 4 * f_ + 3) return false;
  const std::size_t theta = m - 2 * f_;
  const std::size_t beta = theta - 2 * f_;
  // (1) theta rounds of Krum over the inputs not yet chosen, each winner removed.
  std::vector<std::size_t> remaining(m);
  std::iota(remaining.begin(), remaining.end(), 0);
  std::vector<std::size_t> chosen;
  std::vector<std::span<const float>> pool;
  while (chosen.size() < theta) {
    pool.clear();
    for (std::size_t i : remaining) pool.push_back(updates[i]);
    const auto scores = krum_scores(pool, f_);
    const auto best = static_cast<std::size_t>(std::min_element(scores.begin(), scores.end()) -
                                               scores.begin());  // first = lowest id
    chosen.push_back(remaining[best]);
    remaining.erase(remaining.begin() + static_cast<std::ptrdiff_t>(best));
  }
  selected_.clear();
  for (std::size_t i : chosen) selected_.push_back(clients[i]);
  // (2) per coordinate, the mean of the beta chosen values closest to their median.
  std::vector<double> values(theta), sorted(theta);
  std::vector<std::size_t> order(theta);
  for (std::size_t k = 0; k < out.size(); ++k) {
    for (std::size_t r = 0; r < theta; ++r) values[r] = updates[chosen[r]][k];
    sorted = values;
    std::sort(sorted.begin(), sorted.end());
    const double median =
        theta % 2 == 1 ? sorted[theta / 2] : 0.5 * (sorted[theta / 2 - 1] + sorted[theta / 2]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::fabs(values[a] - median) < std::fabs(values[b] - median);
    });
    double sum = 0;
    for (std::size_t r = 0; r < beta; ++r) sum += values[order[r]];
    out[k] = static_cast<float>(sum / static_cast<double>(beta));
  }
  return true;
}

void detail::add_bulyan_aggregator(AggregatorRegistry& registry) {
  registry.add("bulyan", [](const ConfigSection& options) {
    const std::string_view known[] = {"name", "f"};
    options.require_known(known);
    return std::make_unique<Bulyan>(detail::get_count(options, "f", 0));
  });
}

}  // namespace cohort::aggregation
