// Secure aggregation rounds R0-R4 (docs/ALGORITHMS.md 8.1) and the fixed-point encoding (8.2).
#include "cohort/aggregation/secure_aggregation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/random.h"
#include "secagg_crypto.h"
#include "secagg_graph.h"

namespace cohort::aggregation::secagg {
namespace {

using detail::round_context;
using detail::wipe;
std::uint64_t point_of(ClientId id) { return detail::share_point(id); }

// Nonce and associated data of the sealed shares from -> to: the key is shared by both
// directions of a pair, the (from, to) nonce keeps them apart.
std::array<std::uint8_t, 12> nonce_of(ClientId from, ClientId to) {
  std::array<std::uint8_t, 12> n{};
  std::memcpy(n.data(), &from, 4);
  std::memcpy(n.data() + 4, &to, 4);
  return n;
}
std::array<std::uint8_t, 16> aad_of(std::uint64_t round, ClientId from, ClientId to) {
  std::array<std::uint8_t, 16> a{};
  std::memcpy(a.data(), &round, 8);
  std::memcpy(a.data() + 8, &from, 4);
  std::memcpy(a.data() + 12, &to, 4);
  return a;
}

constexpr std::size_t kLimbs = 8;  // a 32-byte secret

void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  const auto at = out.size();
  out.resize(at + 8);
  std::memcpy(out.data() + at, &v, 8);
}
std::uint64_t get_u64(std::span<const std::uint8_t> in, std::size_t& at) {
  if (in.size() - at < 8) throw ProtocolError("secure aggregation: shares truncated");
  std::uint64_t v;
  std::memcpy(&v, in.data() + at, 8);
  at += 8;
  return v;
}
void put_share(std::vector<std::uint8_t>& out, const Share& s) {
  put_u64(out, s.x);
  for (auto y : s.y) put_u64(out, y);
}
Share get_share(std::span<const std::uint8_t> in, std::size_t& at) {
  Share s;
  s.x = get_u64(in, at);
  s.y.resize(kLimbs);
  for (auto& y : s.y) {
    y = get_u64(in, at);
    if (y >= kShamirPrime) throw ProtocolError("secure aggregation: share out of the field");
  }
  return s;
}

}  // namespace

// ---- FixedPoint -------------------------------------------------------------------------------

FixedPoint::FixedPoint(double clip, std::uint32_t levels)
    : clip_(clip), levels_(static_cast<double>(levels)) {
  if (!(clip > 0) || !std::isfinite(clip)) throw ConfigError("secagg: clip must be > 0");
  if (levels == 0) throw ConfigError("secagg: quantization levels must be >= 1");
}

void FixedPoint::encode(std::span<const float> x, std::span<std::uint32_t> out) const {
  COHORT_CHECK(x.size() == out.size()) << "fixed point: " << x.size() << " vs " << out.size();
  const double scale = levels_ / (2 * clip_);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) throw KernelError("fixed point: non-finite input");
    const double t = (std::clamp(static_cast<double>(x[i]), -clip_, clip_) + clip_) * scale;
    out[i] = static_cast<std::uint32_t>(std::clamp(std::nearbyint(t), 0.0, levels_));
  }
}

void FixedPoint::encode_stochastic(std::span<const float> x, std::uint64_t seed,
                                   std::span<std::uint32_t> out) const {
  COHORT_CHECK(x.size() == out.size()) << "fixed point: " << x.size() << " vs " << out.size();
  const double scale = levels_ / (2 * clip_);
  SplitMixRng rng(seed);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) throw KernelError("fixed point: non-finite input");
    const double t = (std::clamp(static_cast<double>(x[i]), -clip_, clip_) + clip_) * scale;
    out[i] = static_cast<std::uint32_t>(std::clamp(std::floor(t + rng.uniform()), 0.0, levels_));
  }
}

std::size_t FixedPoint::max_summands() const {
  return static_cast<std::size_t>(std::floor(4294967295.0 / levels_));
}

void FixedPoint::decode_sum(std::span<const std::uint32_t> sum, std::size_t n,
                            std::span<float> out) const {
  COHORT_CHECK(sum.size() == out.size()) << "fixed point: " << sum.size() << " vs " << out.size();
  if (n > max_summands()) {
    throw ConfigError("secagg: " + std::to_string(n) +
                      " inputs overflow the 2^32 modulus (at most " +
                      std::to_string(max_summands()) + " with these levels)");
  }
  const double step = 2 * clip_ / levels_;
  for (std::size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<float>(step * sum[i] - static_cast<double>(n) * clip_);
  }
}

// ---- Client -----------------------------------------------------------------------------------

namespace {
void check_params(const Params& params) {
  if (params.threshold < 2) throw ConfigError("secagg: threshold must be >= 2");
  if (params.degree != 0 && params.degree < params.threshold) {
    throw ConfigError("secagg: degree " + std::to_string(params.degree) + " below the threshold " +
                      std::to_string(params.threshold));
  }
}
}  // namespace

Client::Client(ClientId id, const Params& params) : id_(id), params_(params) {
  check_params(params);
  channel_ = generate_key_pair();
  mask_ = generate_key_pair();
  detail::random_bytes(self_seed_);
}

Client::~Client() {
  wipe(channel_.private_key.data(), 32);
  wipe(mask_.private_key.data(), 32);
  wipe(self_seed_.data(), 32);
  for (auto& [v, h] : held_) {
    wipe(h.mask_key.y.data(), h.mask_key.y.size() * 8);
    wipe(h.self_mask.y.data(), h.self_mask.y.size() * 8);
  }
  for (auto& p : pair_seeds_) wipe(p.seed.data(), p.seed.size());
}

void Client::configure(const Params& params) {
  COHORT_CHECK(u1_.empty()) << "a client is configured before share_keys()";
  check_params(params);
  params_ = params;
}

void Client::set_keys_for_testing(const KeyPair& channel, const KeyPair& mask) {
  COHORT_CHECK(u1_.empty()) << "keys are set before share_keys()";
  channel_ = channel;
  mask_ = mask;
}

Advertisement Client::advertise() const { return {id_, channel_.public_key, mask_.public_key}; }

std::vector<SealedShares> Client::share_keys(std::span<const Advertisement> u1) {
  COHORT_CHECK(u1_.empty()) << "share_keys() runs once per round";
  std::map<ClientId, Advertisement> members;
  for (const auto& a : u1) {
    if (!members.emplace(a.client, a).second) {
      throw ProtocolError("secure aggregation: client " + std::to_string(a.client) +
                          " advertised twice");
    }
  }
  auto own = members.find(id_);
  if (own == members.end() || own->second.channel_public != channel_.public_key ||
      own->second.mask_public != mask_.public_key) {
    throw ProtocolError("secure aggregation: own advertisement missing or altered");
  }
  std::vector<ClientId> ids;
  for (const auto& [v, a] : members) ids.push_back(v);
  const detail::Graph graph(ids, params_.degree, params_.graph_seed);
  auto neighbours = graph.neighbours(id_);
  // The share holders: this client and its neighbours, sorted.
  std::vector<ClientId> holders = neighbours;
  holders.insert(std::upper_bound(holders.begin(), holders.end(), id_), id_);
  std::vector<std::uint64_t> xs;
  for (ClientId v : holders) xs.push_back(point_of(v));
  if (xs.size() < params_.threshold) {
    throw ProtocolError("secure aggregation: " + std::to_string(xs.size()) +
                        " clients would hold shares, fewer than the threshold " +
                        std::to_string(params_.threshold));
  }
  auto key_shares = shamir_split(mask_.private_key, params_.threshold, xs);
  auto seed_shares = shamir_split(self_seed_, params_.threshold, xs);
  u1_ = std::move(members);
  neighbours_ = std::move(neighbours);
  std::vector<SealedShares> out;
  for (std::size_t i = 0; i < holders.size(); ++i) {
    const ClientId v = holders[i];
    if (v == id_) {
      held_[id_] = {std::move(key_shares[i]), std::move(seed_shares[i])};
      continue;
    }
    std::vector<std::uint8_t> plain;
    put_u64(plain, (static_cast<std::uint64_t>(id_) << 32) | v);
    put_u64(plain, params_.round);
    put_share(plain, key_shares[i]);
    put_share(plain, seed_shares[i]);
    const Key key = agree(channel_.private_key, u1_.at(v).channel_public,
                          round_context("shares", params_.round));
    const auto nonce = nonce_of(id_, v);
    const auto aad = aad_of(params_.round, id_, v);
    out.push_back({id_, v, detail::seal(key, nonce, aad, plain)});
    wipe(plain.data(), plain.size());
    wipe(key_shares[i].y.data(), key_shares[i].y.size() * 8);
    wipe(seed_shares[i].y.data(), seed_shares[i].y.size() * 8);
  }
  return out;
}

void Client::open_shares(std::span<const SealedShares> received) {
  COHORT_CHECK(!u1_.empty() && u2_.empty()) << "open_shares() runs once, after share_keys()";
  for (const auto& s : received) {
    if (s.to != id_) throw ProtocolError("secure aggregation: shares addressed to another client");
    auto it = u1_.find(s.from);
    if (it == u1_.end() || s.from == id_) {
      throw ProtocolError("secure aggregation: shares from outside U1");
    }
    if (!std::binary_search(neighbours_.begin(), neighbours_.end(), s.from)) {
      throw ProtocolError("secure aggregation: shares from client " + std::to_string(s.from) +
                          ", not a neighbour of client " + std::to_string(id_));
    }
    if (held_.contains(s.from)) throw ProtocolError("secure aggregation: repeated shares");
    const Key key = agree(channel_.private_key, it->second.channel_public,
                          round_context("shares", params_.round));
    const auto nonce = nonce_of(s.from, id_);
    const auto aad = aad_of(params_.round, s.from, id_);
    auto plain = detail::open(key, nonce, aad, s.ciphertext);
    std::size_t at = 0;
    const std::uint64_t pair = get_u64(plain, at);
    const std::uint64_t round = get_u64(plain, at);
    if (pair != ((static_cast<std::uint64_t>(s.from) << 32) | id_) || round != params_.round) {
      throw ProtocolError("secure aggregation: shares for another pair or round");
    }
    Held h{get_share(plain, at), get_share(plain, at)};
    wipe(plain.data(), plain.size());
    if (at != plain.size() || h.mask_key.x != point_of(id_) || h.self_mask.x != point_of(id_)) {
      throw ProtocolError("secure aggregation: malformed shares");
    }
    held_[s.from] = std::move(h);
  }
  std::vector<ClientId> u2;
  for (const auto& [v, h] : held_) u2.push_back(v);  // map order: sorted, own id included
  if (u2.size() < params_.threshold) {
    throw ProtocolError("secure aggregation: only " + std::to_string(u2.size()) +
                        " clients shared keys, fewer than the threshold");
  }
  u2_ = std::move(u2);
  const auto ctx = round_context("mask", params_.round);
  for (ClientId v : u2_) {
    if (v == id_) continue;
    pair_seeds_.push_back({agree(mask_.private_key, u1_.at(v).mask_public, ctx), id_ < v ? 1 : -1});
  }
}

void Client::mask_range(std::size_t first_word, std::span<std::uint32_t> x_range) const {
  COHORT_CHECK(!u2_.empty()) << "mask_range() runs after open_shares()";
  COHORT_CHECK(first_word <= params_.vector_size &&
               x_range.size() <= params_.vector_size - first_word)
      << "range [" << first_word << ", +" << x_range.size() << ") outside the round's "
      << params_.vector_size << " words";
  add_mask(self_seed_, +1, first_word, x_range);
  for (const auto& p : pair_seeds_) add_mask(p.seed, p.sign, first_word, x_range);
}

std::vector<std::uint32_t> Client::masked_input(std::span<const std::uint32_t> x,
                                                std::span<const SealedShares> received) {
  COHORT_CHECK(!u1_.empty() && u2_.empty()) << "masked_input() runs once, after share_keys()";
  COHORT_CHECK(x.size() == params_.vector_size)
      << "input of " << x.size() << ", round of " << params_.vector_size;
  open_shares(received);
  std::vector<std::uint32_t> y(x.begin(), x.end());
  mask_range(0, y);
  return y;
}

UnmaskingShares Client::unmask(std::span<const ClientId> survivors) const {
  COHORT_CHECK(!u2_.empty()) << "unmask() runs after masked_input()";
  const std::set<ClientId> u3(survivors.begin(), survivors.end());
  std::size_t holders_alive = 0;  // this client and its neighbours in U3
  for (ClientId v : u3) {
    if (!u1_.contains(v)) {
      throw ProtocolError("secure aggregation: survivor " + std::to_string(v) + " not in U1");
    }
    const bool holder = v == id_ || std::binary_search(neighbours_.begin(), neighbours_.end(), v);
    if (!holder) continue;  // outside this client's neighbourhood: nothing to check or reveal
    if (!std::binary_search(u2_.begin(), u2_.end(), v)) {
      throw ProtocolError("secure aggregation: survivor " + std::to_string(v) + " not in U2");
    }
    ++holders_alive;
  }
  if (holders_alive < params_.threshold) {
    throw ProtocolError("secure aggregation: " + std::to_string(holders_alive) +
                        " survivors among client " + std::to_string(id_) +
                        " and its neighbours, fewer than the threshold");
  }
  if (!u3.contains(id_)) {
    throw ProtocolError("secure aggregation: this client was declared dropped; it reveals nothing");
  }
  UnmaskingShares out;
  out.from = id_;
  // Never both shares for one client: b_v for survivors, the mask key for the dropped.
  for (ClientId v : u2_) {
    const Held& h = held_.at(v);
    if (u3.contains(v)) {
      out.self_mask.emplace_back(v, h.self_mask);
    } else {
      out.mask_key.emplace_back(v, h.mask_key);
    }
  }
  return out;
}

}  // namespace cohort::aggregation::secagg
