// SecAgg+ neighbourhoods (docs/ALGORITHMS.md 8.2; Bell, Bonawitz, Gascon, Lepoint, Raykova 2020):
// the ring Flower draws, the default degree and threshold.
#include "secagg_graph.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "cohort/core/error.h"

namespace cohort::aggregation::secagg {
namespace detail {
namespace {

// 64-bit words of PRG(seed), the mask generator, read 64 words at a time from the ranged keystream.
class KeystreamWords {
 public:
  explicit KeystreamWords(const Key& seed) : seed_(seed) {}
  std::uint64_t next() {
    if (at_ == buffer_.size()) {
      expand_mask(seed_, consumed_words_, buffer_);
      consumed_words_ += buffer_.size();
      at_ = 0;
    }
    const std::uint64_t lo = buffer_[at_], hi = buffer_[at_ + 1];
    at_ += 2;
    return lo | (hi << 32);
  }
  // Uniform in [0, n), n > 0: Lemire's multiply-and-reject, so no modulo bias.
  std::uint64_t below(std::uint64_t n) {
    __extension__ using Uint128 = unsigned __int128;
    Uint128 m = static_cast<Uint128>(next()) * n;
    if (static_cast<std::uint64_t>(m) < n) {
      const std::uint64_t floor = (0 - n) % n;
      while (static_cast<std::uint64_t>(m) < floor) m = static_cast<Uint128>(next()) * n;
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

 private:
  Key seed_;
  std::array<std::uint32_t, 128> buffer_{};
  std::size_t at_ = buffer_.size();
  std::size_t consumed_words_ = 0;
};

}  // namespace

std::vector<ClientId> sorted_members(std::span<const ClientId> u1) {
  std::vector<ClientId> ids(u1.begin(), u1.end());
  std::sort(ids.begin(), ids.end());
  if (auto it = std::adjacent_find(ids.begin(), ids.end()); it != ids.end()) {
    throw ProtocolError("secure aggregation: client " + std::to_string(*it) +
                        " appears twice in U1");
  }
  return ids;
}

std::vector<ClientId> shuffle_ring(std::vector<ClientId> ids, const Key& seed) {
  KeystreamWords words(seed);
  for (std::size_t i = ids.size(); i > 1; --i) {
    std::swap(ids[i - 1], ids[static_cast<std::size_t>(words.below(i))]);
  }
  return ids;
}

Graph::Graph(std::span<const ClientId> u1, std::size_t degree, const Key& seed)
    : sorted_(sorted_members(u1)) {
  complete_ = degree == 0 || degree >= sorted_.size();
  if (complete_) return;
  if (degree % 2 == 0) {
    throw ConfigError("secagg: the SecAgg+ degree must be odd below the cohort size, got " +
                      std::to_string(degree) + " for " + std::to_string(sorted_.size()) +
                      " clients");
  }
  half_ = (degree - 1) / 2;
  ring_ = shuffle_ring(sorted_, seed);
  position_.reserve(ring_.size());
  for (std::size_t p = 0; p < ring_.size(); ++p) position_.emplace(ring_[p], p);
}

bool Graph::contains(ClientId id) const {
  return std::binary_search(sorted_.begin(), sorted_.end(), id);
}

bool Graph::adjacent(ClientId a, ClientId b) const {
  if (complete_) return a != b;
  const std::size_t pa = position_.at(a), pb = position_.at(b);
  const std::size_t gap = pa > pb ? pa - pb : pb - pa;
  const std::size_t ring_distance = std::min(gap, ring_.size() - gap);
  return ring_distance != 0 && ring_distance <= half_;
}

std::vector<ClientId> Graph::neighbours(ClientId id) const {
  std::vector<ClientId> out;
  if (complete_) {
    out.reserve(sorted_.size() - 1);
    for (ClientId v : sorted_) {
      if (v != id) out.push_back(v);
    }
    return out;
  }
  // k < n, so the 2 half_ positions around p are distinct and exclude p.
  const std::size_t n = ring_.size(), p = position_.at(id);
  for (std::size_t j = 1; j <= half_; ++j) {
    out.push_back(ring_[(p + j) % n]);
    out.push_back(ring_[(p + n - j) % n]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace detail

std::size_t default_degree(std::size_t n) {
  if (n == 0) throw ConfigError("secagg: no clients to draw a neighbour graph over");
  std::size_t ceil_log2 = 0;
  while ((std::size_t{1} << ceil_log2) < n) ++ceil_log2;
  const std::size_t k = 2 * ceil_log2 + 1;
  return k >= n ? n : k;
}

std::size_t default_threshold(std::size_t degree, double fraction) {
  if (!(fraction >= 0.5 && fraction < 1)) {
    throw ConfigError("secagg: the threshold fraction must be in [0.5, 1), got " +
                      std::to_string(fraction));
  }
  if (degree < 2) throw ConfigError("secagg: a threshold needs a degree of at least 2");
  const auto t = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(degree))) + 1;
  return std::clamp<std::size_t>(t, 2, degree);
}

std::vector<ClientId> neighbour_ring(std::span<const ClientId> u1, const Key& seed) {
  return detail::shuffle_ring(detail::sorted_members(u1), seed);
}

std::map<ClientId, std::vector<ClientId>> neighbourhoods(std::span<const ClientId> u1,
                                                         std::size_t degree, const Key& seed) {
  if (degree == 0) throw ConfigError("secagg: the SecAgg+ degree must be >= 1");
  const detail::Graph graph(u1, degree, seed);
  std::map<ClientId, std::vector<ClientId>> out;
  for (ClientId id : graph.members()) out.emplace(id, graph.neighbours(id));
  return out;
}

}  // namespace cohort::aggregation::secagg
