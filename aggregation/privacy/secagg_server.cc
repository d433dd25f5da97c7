// Secure aggregation, the server's side of R4 (docs/ALGORITHMS.md 8.1 and 8.2): rebuild the seeds
// behind the masks that do not cancel, then remove their keystream from any range of the sum.
#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/error.h"
#include "secagg_crypto.h"
#include "secagg_graph.h"

namespace cohort::aggregation::secagg {
namespace {

using detail::wipe;
using Members = std::map<ClientId, const Advertisement*>;

// The shares revealed in R4, by the client they belong to. Only the first response of each
// survivor counts, and only shares at the responder's own evaluation point from a client that
// holds them: b_v's shares from v and its neighbours (v survived), a mask key's from the
// neighbours of its owner (the owner shared keys and dropped).
struct Collected {
  std::map<ClientId, std::vector<Share>> self_mask;
  std::map<ClientId, std::vector<Share>> mask_key;
};

Collected collect(const detail::Graph& graph, const Members& members, const std::set<ClientId>& u3,
                  std::span<const UnmaskingShares> responses) {
  Collected out;
  std::set<ClientId> responded;
  for (const auto& r : responses) {
    if (!u3.contains(r.from) || !responded.insert(r.from).second) continue;
    const std::uint64_t x = detail::share_point(r.from);
    for (const auto& [v, s] : r.self_mask) {
      if (s.x == x && u3.contains(v) && (v == r.from || graph.adjacent(v, r.from))) {
        out.self_mask[v].push_back(s);
      }
    }
    for (const auto& [v, s] : r.mask_key) {
      if (s.x == x && members.contains(v) && !u3.contains(v) && graph.adjacent(v, r.from)) {
        out.mask_key[v].push_back(s);
      }
    }
  }
  return out;
}

// The 32-byte secret of `owner` from the first `threshold` of its shares.
Key combine_key(const std::vector<Share>& shares, std::size_t threshold, ClientId owner,
                const char* what) {
  if (shares.size() < threshold) {
    throw ProtocolError("secure aggregation: " + std::to_string(shares.size()) + " shares of the " +
                        what + " of client " + std::to_string(owner) +
                        " from surviving neighbours, fewer than the threshold " +
                        std::to_string(threshold));
  }
  auto secret = shamir_combine(std::span<const Share>(shares).first(threshold), 32);
  Key key{};
  std::memcpy(key.data(), secret.data(), 32);
  wipe(secret.data(), secret.size());
  return key;
}

}  // namespace

Reconstructed::~Reconstructed() {
  for (auto& [u, b] : self_seeds) wipe(b.data(), b.size());
  for (auto& p : pair_seeds) wipe(p.seed.data(), p.seed.size());
}

Reconstructed reconstruct(const Params& params, std::span<const ClientId> u1,
                          std::span<const Advertisement> u2, std::span<const ClientId> survivors,
                          std::span<const UnmaskingShares> responses) {
  const detail::Graph graph(u1, params.degree, params.graph_seed);
  Members members;
  for (const auto& a : u2) {
    if (!members.emplace(a.client, &a).second) {
      throw ProtocolError("secure aggregation: repeated U2 member");
    }
    if (!graph.contains(a.client)) {
      throw ProtocolError("secure aggregation: U2 member " + std::to_string(a.client) +
                          " not in U1");
    }
  }
  const std::set<ClientId> u3(survivors.begin(), survivors.end());
  for (ClientId u : u3) {
    if (!members.contains(u)) {
      throw ProtocolError("secure aggregation: input from client " + std::to_string(u) +
                          ", outside U2");
    }
  }
  if (u3.size() < params.threshold) {
    throw ProtocolError("secure aggregation: fewer survivors than the threshold");
  }
  const Collected shares = collect(graph, members, u3, responses);
  static const std::vector<Share> kNone;
  auto shares_of = [](const std::map<ClientId, std::vector<Share>>& m, ClientId v) -> const auto& {
    auto it = m.find(v);
    return it == m.end() ? kNone : it->second;
  };

  Reconstructed out;
  out.vector_size = params.vector_size;
  out.survivors.assign(u3.begin(), u3.end());
  for (ClientId u : u3) {
    out.self_seeds.emplace_back(
        u, combine_key(shares_of(shares.self_mask, u), params.threshold, u, "self-mask seed"));
  }
  // Dropped after sharing: rebuild the mask key of each one a survivor masked against (a
  // neighbour), check it against its advertisement, and derive the pairwise seeds.
  const auto ctx = detail::round_context("mask", params.round);
  for (const auto& [v, adv] : members) {
    if (u3.contains(v)) continue;
    std::vector<ClientId> masked_with;
    for (ClientId u : graph.neighbours(v)) {
      if (u3.contains(u)) masked_with.push_back(u);
    }
    if (masked_with.empty()) continue;  // no mask of v's is in the sum: nothing to reveal
    Key sk = combine_key(shares_of(shares.mask_key, v), params.threshold, v, "mask key");
    if (public_key_of(sk) != adv->mask_public) {
      wipe(sk.data(), sk.size());
      throw ProtocolError("secure aggregation: shares of client " + std::to_string(v) +
                          " rebuild a key that does not match its advertisement");
    }
    for (ClientId u : masked_with) {
      out.pair_seeds.push_back({u, v, u < v ? 1 : -1, agree(sk, members.at(u)->mask_public, ctx)});
    }
    wipe(sk.data(), sk.size());
  }
  return out;
}

void remove_masks(const Reconstructed& r, std::size_t first_word,
                  std::span<std::uint32_t> sum_of_range) {
  COHORT_CHECK(first_word <= r.vector_size && sum_of_range.size() <= r.vector_size - first_word)
      << "range [" << first_word << ", +" << sum_of_range.size() << ") outside the round's "
      << r.vector_size << " words";
  for (const auto& [u, b] : r.self_seeds) add_mask(b, -1, first_word, sum_of_range);
  for (const auto& p : r.pair_seeds) add_mask(p.seed, -p.sign, first_word, sum_of_range);
}

std::vector<std::uint32_t> unmask_sum(const Params& params, std::span<const ClientId> u1,
                                      std::span<const Advertisement> u2,
                                      const std::map<ClientId, std::vector<std::uint32_t>>& masked,
                                      std::span<const UnmaskingShares> responses) {
  std::vector<ClientId> u3;
  for (const auto& [u, y] : masked) {
    if (y.size() != params.vector_size) throw ProtocolError("secure aggregation: input size");
    u3.push_back(u);
  }
  const Reconstructed r = reconstruct(params, u1, u2, u3, responses);
  std::vector<std::uint32_t> z(params.vector_size, 0);
  for (const auto& [u, y] : masked) {
    for (std::size_t i = 0; i < z.size(); ++i) z[i] += y[i];
  }
  remove_masks(r, 0, z);
  return z;
}

std::vector<std::uint32_t> unmask_sum(const Params& params, std::span<const Advertisement> u2,
                                      const std::map<ClientId, std::vector<std::uint32_t>>& masked,
                                      std::span<const UnmaskingShares> responses) {
  if (params.degree != 0) {
    throw ConfigError("secagg: a SecAgg+ round (degree " + std::to_string(params.degree) +
                      ") unmasks with U1: call unmask_sum(params, u1, ...)");
  }
  std::vector<ClientId> u1;
  for (const auto& a : u2) u1.push_back(a.client);
  return unmask_sum(params, u1, u2, masked, responses);
}

}  // namespace cohort::aggregation::secagg
