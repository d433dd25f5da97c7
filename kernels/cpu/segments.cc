#include "segments.h"

#include <algorithm>

#include "cohort/core/error.h"

namespace cohort::kernels::cpu {

std::vector<std::size_t> plan_segment_ends(std::span<const std::size_t> out_sizes,
                                           std::span<const std::size_t> extra_sizes,
                                           const std::vector<bool>& may_end) {
  const std::size_t n = out_sizes.size();
  if (n == 0 || extra_sizes.size() != n || may_end.size() != n + 1 || !may_end[n]) {
    throw KernelError("plan_segment_ends: inconsistent sizes");
  }
  std::vector<std::size_t> outs(n + 1, 0), extras(n + 1, 0);  // prefix sums
  for (std::size_t i = 0; i < n; ++i) {
    outs[i + 1] = outs[i] + out_sizes[i];
    extras[i + 1] = extras[i] + extra_sizes[i];
  }
  const auto arena = [&](std::size_t a, std::size_t b) {  // ops [a, b), b > a
    return outs[b - 1] - outs[a] + extras[b] - extras[a];
  };
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::size_t best = kNone, best_arena = 0;
  std::vector<std::size_t> best_from;
  std::vector<std::size_t> cost(n + 1), from(n + 1);
  for (std::size_t ta = 0; ta < n; ++ta) {
    for (std::size_t tb = ta + 1; tb <= n; ++tb) {
      if (!may_end[tb]) continue;
      const std::size_t t = arena(ta, tb);
      std::fill(cost.begin(), cost.end(), kNone);
      cost[0] = 0;
      for (std::size_t b = 1; b <= n; ++b) {
        if (!may_end[b]) continue;
        for (std::size_t a = 0; a < b; ++a) {
          if (cost[a] == kNone || arena(a, b) > t) continue;
          const std::size_t c = cost[a] + out_sizes[b - 1];
          if (c < cost[b]) {
            cost[b] = c;
            from[b] = a;
          }
        }
      }
      if (cost[n] == kNone) continue;
      const std::size_t total = cost[n] + t;
      if (best == kNone || total < best || (total == best && t > best_arena)) {
        best = total;
        best_arena = t;
        best_from = from;
      }
    }
  }
  std::vector<std::size_t> ends;
  for (std::size_t b = n; b > 0; b = best_from[b]) ends.push_back(b);
  std::reverse(ends.begin(), ends.end());
  return ends;
}

}  // namespace cohort::kernels::cpu
