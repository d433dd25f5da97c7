#include "population_pool.h"

#include <algorithm>
#include <bit>

#include "cohort/core/error.h"

namespace cohort::server {

template <typename T>
Fenwick<T>::Fenwick(std::vector<T> values) : tree_(std::move(values)) {
  const std::size_t n = tree_.size();
  for (const T v : tree_) total_ += v;
  for (std::size_t i = 1; i <= n; ++i) {
    const std::size_t parent = i + (i & (~i + 1));
    if (parent <= n) tree_[parent - 1] += tree_[i - 1];
  }
}

template <typename T>
void Fenwick<T>::add(std::size_t i, T delta, bool negative) {
  if (negative) {
    total_ -= delta;
    for (std::size_t k = i + 1; k <= tree_.size(); k += k & (~k + 1)) tree_[k - 1] -= delta;
  } else {
    total_ += delta;
    for (std::size_t k = i + 1; k <= tree_.size(); k += k & (~k + 1)) tree_[k - 1] += delta;
  }
}

template <typename T>
T Fenwick<T>::prefix(std::size_t i) const {
  T sum = 0;
  for (std::size_t k = i; k > 0; k -= k & (~k + 1)) sum += tree_[k - 1];
  return sum;
}

template <typename T>
std::size_t Fenwick<T>::find(T k) const {
  COHORT_CHECK(k < total_) << "Fenwick::find past the total";
  std::size_t pos = 0;
  for (std::size_t step = std::bit_floor(tree_.size()); step > 0; step >>= 1) {
    const std::size_t next = pos + step;
    if (next <= tree_.size() && tree_[next - 1] <= k) {
      pos = next;
      k -= tree_[next - 1];
    }
  }
  return pos;  // 0-based index of the element that takes the sum past k
}

template class Fenwick<std::uint32_t>;
template class Fenwick<std::uint64_t>;

PopulationPool::PopulationPool(const VirtualPopulation& population, bool weighted) {
  const std::uint32_t n = population.count;
  state_.resize(n);
  std::vector<std::uint32_t> ones(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const bool p = population.present(i);
    state_[i] = p ? (kPresent | kLive) : 0;
    ones[i] = p ? 1 : 0;
  }
  present_ = Fenwick<std::uint32_t>(ones);
  live_ = Fenwick<std::uint32_t>(std::move(ones));
  if (weighted) {
    weight_.resize(n);
    std::vector<std::uint64_t> w(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      weight_[i] = std::max<std::uint64_t>(population.dataset_size(i), 1);
      w[i] = (state_[i] & kLive) != 0 ? weight_[i] : 0;
    }
    weights_ = Fenwick<std::uint64_t>(std::move(w));
  }
}

void PopulationPool::set_live(std::uint32_t i, bool live) {
  if (!is_present(i) || is_live(i) == live) return;
  state_[i] = static_cast<std::uint8_t>(live ? (state_[i] | kLive) : (state_[i] & ~kLive));
  live_.add(i, 1, !live);
  if (!weight_.empty()) weights_.add(i, weight_[i], !live);
}

void PopulationPool::set_present(std::uint32_t i, bool present) {
  if (is_present(i) == present) {
    if (present) set_live(i, true);
    return;
  }
  if (!present) set_live(i, false);
  state_[i] = static_cast<std::uint8_t>(present ? (state_[i] | kPresent) : (state_[i] & ~kPresent));
  present_.add(i, 1, !present);
  if (present) set_live(i, true);
}

std::vector<std::uint32_t> PopulationPool::sample(std::size_t want, bool weighted,
                                                  std::mt19937_64& rng) {
  COHORT_CHECK(want <= live()) << "sampling more members than are live";
  COHORT_CHECK(!weighted || !weight_.empty()) << "the pool was built without weights";
  std::vector<std::uint32_t> out;
  out.reserve(want);
  for (std::size_t k = 0; k < want; ++k) {
    std::uint32_t i = 0;
    if (weighted) {
      const std::uint64_t total = weights_.total();
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      const auto target =
          std::min(total - 1, static_cast<std::uint64_t>(u * static_cast<double>(total)));
      i = static_cast<std::uint32_t>(weights_.find(target));
    } else {
      const auto pick = std::uniform_int_distribution<std::size_t>(0, live() - 1)(rng);
      i = static_cast<std::uint32_t>(live_.find(static_cast<std::uint32_t>(pick)));
    }
    set_live(i, false);  // without replacement; put back below
    out.push_back(i);
  }
  for (const std::uint32_t i : out) set_live(i, true);
  return out;
}

std::vector<std::uint32_t> PopulationPool::live_members() const {
  std::vector<std::uint32_t> out;
  out.reserve(live());
  for (std::uint32_t i = 0; i < state_.size(); ++i) {
    if (is_live(i)) out.push_back(i);
  }
  return out;
}

}  // namespace cohort::server
