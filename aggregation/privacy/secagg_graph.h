// The SecAgg+ neighbour graph (private header), shared by the client and the server so that both
// draw exactly the same one (docs/ALGORITHMS.md 8.2; the public functions in
// secure_aggregation.h describe the ring).
#pragma once

#include <cstddef>
#include <span>
#include <unordered_map>
#include <vector>

#include "cohort/aggregation/secure_aggregation.h"

namespace cohort::aggregation::secagg::detail {

// The graph over U1 for one round. Immutable after construction, so thread-safe to read.
class Graph {
 public:
  // `u1` in any order. degree 0 or >= |U1|: the complete graph (no shuffle is drawn). ConfigError
  // for an even degree below |U1|; ProtocolError if an id repeats.
  Graph(std::span<const ClientId> u1, std::size_t degree, const Key& seed);

  [[nodiscard]] bool is_complete() const { return complete_; }
  [[nodiscard]] bool contains(ClientId id) const;
  // Whether a and b (members, a != b) are neighbours.
  [[nodiscard]] bool adjacent(ClientId a, ClientId b) const;
  // The neighbours of a member, sorted, the member excluded.
  [[nodiscard]] std::vector<ClientId> neighbours(ClientId id) const;
  // The members, sorted.
  [[nodiscard]] const std::vector<ClientId>& members() const { return sorted_; }

 private:
  std::vector<ClientId> sorted_;
  bool complete_ = true;
  std::size_t half_ = 0;                                // (k - 1) / 2
  std::vector<ClientId> ring_;                          // empty when complete
  std::unordered_map<ClientId, std::size_t> position_;  // ring position; empty when complete
};

// U1's ids sorted; ProtocolError if one repeats.
[[nodiscard]] std::vector<ClientId> sorted_members(std::span<const ClientId> u1);
// The ids (sorted, distinct) shuffled into the ring by PRG(seed).
[[nodiscard]] std::vector<ClientId> shuffle_ring(std::vector<ClientId> sorted, const Key& seed);

}  // namespace cohort::aggregation::secagg::detail
