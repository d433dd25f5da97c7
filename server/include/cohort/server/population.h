// A simulated population: the N virtual clients of cohort-sim's in-process fleet, which register
// in bulk. The fleet knocks once, as one of them; the coordinator then counts every member that
// is present as registered, keeps no state for the ones it has not selected or heard from, and
// samples its cohorts from counters (population_pool.h), so a round costs what its cohort costs,
// not what the population does. Members are named "c" followed by their index, zero-padded to
// `width` digits (c00000, c00001, ...), the names the fleet sends as: name order is index order.
//
// Only cohort-sim builds one (InProcessOverrides::population), never a configuration. Immutable
// once handed over: the shard thread reads it while the fleet's thread runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::server {

struct VirtualPopulation {
  std::uint32_t count = 0;  // members c0 .. c{count-1}
  std::uint32_t width = 5;  // digits of a member's zero-padded index
  // Members that never register (their memory cannot train the model); empty: none.
  std::vector<bool> absent;
  // Each member's dataset size (Register.dataset_size); empty: every member has `size_all`.
  std::vector<std::uint32_t> sizes;
  std::uint64_t size_all = 0;

  // The digits a population of `count` members pads to: at least 5.
  static std::uint32_t width_for(std::uint64_t count);
  [[nodiscard]] std::string name(std::uint32_t index) const;
  // The member `name` names, or nullopt (not a member's name, or an index >= count).
  [[nodiscard]] std::optional<std::uint32_t> index_of(std::string_view name) const;
  [[nodiscard]] bool present(std::uint32_t index) const {
    return index < count && (absent.empty() || !absent[index]);
  }
  [[nodiscard]] std::uint64_t dataset_size(std::uint32_t index) const {
    return sizes.empty() ? size_all : sizes[index];
  }
};

}  // namespace cohort::server
