// Krum and Multi-Krum (docs/ALGORITHMS.md 2.1-2.3; Blanchard et al. 2017). O(m^2 d) distances, each
// summed in double.
#include <algorithm>
#include <numeric>

#include "builtins.h"
#include "cohort/aggregation/robust.h"
#include "cohort/core/error.h"

namespace cohort::aggregation {

std::vector<double> krum_scores(std::span<const std::span<const float>> updates, std::size_t f) {
  const std::size_t m = updates.size();
  std::vector<double> dist(m * m, 0.0);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = i + 1; j < m; ++j) {
      const float* a = updates[i].data();
      const float* b = updates[j].data();
      double sum = 0;
      for (std::size_t k = 0; k < updates[i].size(); ++k) {
        const double diff = static_cast<double>(a[k]) - static_cast<double>(b[k]);
        sum += diff * diff;
      }
      dist[i * m + j] = dist[j * m + i] = sum;
    }
  }
  const std::size_t neighbours = m >= f + 2 ? m - f - 2 : 0;
  std::vector<double> scores(m, 0.0), row;
  for (std::size_t i = 0; i < m; ++i) {
    row.clear();
    for (std::size_t j = 0; j < m; ++j) {
      if (j != i) row.push_back(dist[i * m + j]);
    }
    const std::size_t n = std::min(neighbours, row.size());
    std::partial_sort(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(n), row.end());
    scores[i] = std::accumulate(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(n), 0.0);
  }
  return scores;
}

bool Krum::combine(std::span<const std::span<const float>> updates,
                   std::span<const ClientId> clients, std::span<const double> /*weights*/,
                   std::span<float> out) {
  const std::size_t m = updates.size();
  if (m <= 2 * f_ + 2) return false;
  const auto scores = krum_scores(updates, f_);
  std::vector<std::size_t> order(m);
  std::iota(order.begin(), order.end(), 0);
  // Stable: equal scores keep client-id order.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  std::size_t keep = keep_ == 0 ? m - f_ : keep_;
  keep = std::min(keep, m);
  std::vector<double> sum(out.size(), 0.0);
  selected_.clear();
  for (std::size_t r = 0; r < keep; ++r) {
    const auto u = updates[order[r]];
    for (std::size_t k = 0; k < u.size(); ++k) sum[k] += u[k];
    selected_.push_back(clients[order[r]]);
  }
  const double inv = 1.0 / static_cast<double>(keep);
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = static_cast<float>(sum[k] * inv);
  return true;
}

void detail::add_krum_aggregators(AggregatorRegistry& registry) {
  registry.add("krum", [](const ConfigSection& options) {
    const std::string_view known[] = {"name", "f"};
    options.require_known(known);
    return std::make_unique<Krum>(detail::get_count(options, "f", 0), 1);
  });
  registry.add("multi_krum", [](const ConfigSection& options) {
    const std::string_view known[] = {"name", "f", "m"};
    options.require_known(known);
    return std::make_unique<Krum>(detail::get_count(options, "f", 0),
                                  detail::get_count(options, "m", 0));
  });
}

}  // namespace cohort::aggregation
