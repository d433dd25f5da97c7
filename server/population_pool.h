// The coordinator's view of a virtual population (cohort/server/population.h): which members are
// registered ("present": the evaluation cursor walks them) and which are live (present and
// reachable: the pool cohorts are drawn from), and under server.selection = weighted each live
// member's weight, kept in Fenwick trees. Built in one linear pass of a few ns per member; then
// flipping a member, counting and finding the k-th live one cost O(log N), so a round's
// selection costs O(cohort x log N) however many members are registered. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cohort/server/population.h"

namespace cohort::server {

// Prefix sums over [0, n) with point updates and an order-statistic search.
template <typename T>
class Fenwick {
 public:
  Fenwick() = default;
  // Takes the values and builds the tree in place in O(n).
  explicit Fenwick(std::vector<T> values);

  [[nodiscard]] std::size_t size() const { return tree_.size(); }
  [[nodiscard]] T total() const { return total_; }
  void add(std::size_t i, T delta, bool negative = false);
  // Sum of [0, i).
  [[nodiscard]] T prefix(std::size_t i) const;
  // The smallest i with prefix(i + 1) > k. REQUIRES: k < total().
  [[nodiscard]] std::size_t find(T k) const;

 private:
  std::vector<T> tree_;  // 0-based storage of the 1-based tree
  T total_ = 0;
};

class PopulationPool {
 public:
  PopulationPool() = default;
  // Every present member of `population` registered and live; weights from its dataset sizes
  // (at least 1) when `weighted`.
  PopulationPool(const VirtualPopulation& population, bool weighted);

  [[nodiscard]] std::size_t live() const { return live_.total(); }
  [[nodiscard]] std::size_t present() const { return present_.total(); }
  [[nodiscard]] bool is_live(std::uint32_t i) const { return (state_[i] & kLive) != 0; }
  [[nodiscard]] bool is_present(std::uint32_t i) const { return (state_[i] & kPresent) != 0; }
  // A present member's connection was found gone, or it was heard from again.
  void set_live(std::uint32_t i, bool live);
  // A member left (Bye, a fatal report, timed out: not present, not live) or registered again
  // (present and live).
  void set_present(std::uint32_t i, bool present);
  // The k-th present member in index order. REQUIRES: k < present().
  [[nodiscard]] std::uint32_t kth_present(std::uint64_t k) const {
    return static_cast<std::uint32_t>(present_.find(k));
  }
  // `want` (<= live()) live members without replacement, in draw order, by the coordinator's
  // rule: uniform: each pick uniform_int(0, remaining - 1) is the pick-th remaining live member
  // in index order (the same draws, and so the same cohort, as sampling from a list of the live
  // members); weighted: each pick proportional to the remaining members' weights.
  std::vector<std::uint32_t> sample(std::size_t want, bool weighted, std::mt19937_64& rng);
  // The live members, in index order: O(N), for server.selection = speed_aware.
  [[nodiscard]] std::vector<std::uint32_t> live_members() const;

 private:
  static constexpr std::uint8_t kPresent = 1, kLive = 2;
  std::vector<std::uint8_t> state_;
  std::vector<std::uint64_t> weight_;  // weighted only
  Fenwick<std::uint32_t> present_, live_;
  Fenwick<std::uint64_t> weights_;  // weighted only: live members' weights
};

}  // namespace cohort::server
