#include "batch_balancer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cohort/core/error.h"

namespace cohort::server {
namespace {

// The real shares clamp(lambda s_p, 1, cap) that sum to B. Without a bound in play that is
// B s_p / sum s; otherwise lambda is found by bisection (the sum is continuous and
// non-decreasing in lambda: n at 0, at least B at B / min s).
std::vector<double> real_shares(std::span<const double> speeds, double global, double cap) {
  double total = 0;
  for (double s : speeds) total += s;
  std::vector<double> r(speeds.size());
  bool inside = true;
  for (std::size_t p = 0; p < speeds.size(); ++p) {
    r[p] = global * speeds[p] / total;
    inside = inside && r[p] >= 1 && r[p] <= cap;
  }
  if (inside) return r;
  const auto sum_at = [&](double lambda) {
    double sum = 0;
    for (std::size_t p = 0; p < speeds.size(); ++p) {
      r[p] = std::clamp(lambda * speeds[p], 1.0, cap);
      sum += r[p];
    }
    return sum;
  };
  double lo = 0, hi = global / *std::min_element(speeds.begin(), speeds.end());
  for (int i = 0; i < 200 && lo < hi; ++i) {
    const double mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    (sum_at(mid) < global ? lo : hi) = mid;
  }
  (void)sum_at(hi);
  return r;
}

}  // namespace

std::vector<std::uint64_t> speed_batches(std::span<const double> speeds, std::uint64_t global_batch,
                                         std::uint64_t cap) {
  const std::size_t n = speeds.size();
  COHORT_CHECK(n >= 1 && n <= global_batch) << n << " workers, global batch " << global_batch;
  COHORT_CHECK(cap == 0 || n * cap >= global_batch) << "cap " << cap << " x " << n << " workers";
  for (double s : speeds) COHORT_CHECK(s > 0 && std::isfinite(s)) << "speed " << s;
  const double upper = cap == 0 ? std::numeric_limits<double>::infinity() : double(cap);
  const std::uint64_t ceiling = cap == 0 ? global_batch : cap;
  const auto r = real_shares(speeds, double(global_batch), upper);
  std::vector<std::uint64_t> b(n);
  std::uint64_t sum = 0;
  for (std::size_t p = 0; p < n; ++p) {
    b[p] = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(std::floor(r[p])), 1, ceiling);
    sum += b[p];
  }
  // The remainders settle the last samples: +1 to the largest below the cap (ties: faster, then
  // first), or, should rounding have overshot, -1 from the smallest above 1.
  const auto better = [&](std::size_t p, std::size_t q) {  // p before q for a +1
    const double dp = r[p] - double(b[p]), dq = r[q] - double(b[q]);
    if (dp != dq) return dp > dq;
    if (speeds[p] != speeds[q]) return speeds[p] > speeds[q];
    return p < q;
  };
  while (sum < global_batch) {
    std::size_t best = n;
    for (std::size_t p = 0; p < n; ++p) {
      if (b[p] < ceiling && (best == n || better(p, best))) best = p;
    }
    COHORT_CHECK(best < n);
    ++b[best];
    ++sum;
  }
  while (sum > global_batch) {
    std::size_t worst = n;
    for (std::size_t p = 0; p < n; ++p) {
      if (b[p] > 1 && (worst == n || better(worst, p))) worst = p;
    }
    COHORT_CHECK(worst < n);
    --b[worst];
    --sum;
  }
  return b;
}

BatchBalancer::BatchBalancer(std::size_t workers, std::uint64_t batch_size, std::uint64_t cap,
                             std::uint64_t rebalance_every)
    : workers_(workers), batch_size_(batch_size), cap_(cap), every_(rebalance_every) {
  COHORT_CHECK(workers >= 1 && batch_size >= 1 && rebalance_every >= 1);
  COHORT_CHECK(cap == 0 || cap >= batch_size) << "cap " << cap << " < batch " << batch_size;
}

std::uint64_t BatchBalancer::batch(const NodeId& w, std::uint64_t step) const {
  const auto& batches = step >= current_from_ ? current_ : previous_;
  const auto it = batches.find(w);
  return it == batches.end() ? batch_size_ : it->second;
}

void BatchBalancer::measured(const NodeId& w, std::uint64_t step, double seconds) {
  if (step == 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double sample = double(batch(w, step)) / seconds;
  auto [it, fresh] = speeds_.try_emplace(w, sample);
  if (!fresh) it->second += kSmoothing * (sample - it->second);
}

bool BatchBalancer::step_closed(std::uint64_t step) {
  if (speeds_.size() < workers_) return false;
  if (balanced_ && (step + 1) % every_ != 0) return false;
  // A worker set larger than the run's (a renamed worker) keeps the first `workers_` by name.
  std::vector<NodeId> names;
  std::vector<double> speeds;
  for (const auto& [w, s] : speeds_) {
    if (names.size() == workers_) break;
    names.push_back(w);
    speeds.push_back(s);
  }
  const auto b = speed_batches(speeds, batch_size_ * workers_, cap_);
  previous_ = std::move(current_);
  current_.clear();
  for (std::size_t p = 0; p < names.size(); ++p) current_[names[p]] = b[p];
  current_from_ = step + 1;
  balanced_ = true;
  return true;
}

}  // namespace cohort::server
