// One client's side of secure aggregation (secagg_session.h).
#include "cohort/client/secagg_session.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

namespace secagg = aggregation::secagg;

transport::SecAggShare wire_share(std::uint32_t owner, const secagg::Share& s) {
  return {.owner = owner, .x = s.x, .y = s.y};
}

}  // namespace

SecAggSession::SecAggSession(std::uint32_t id, std::uint64_t round, std::uint64_t vector_size)
    : id_(id),
      round_(round),
      vector_size_(vector_size),
      client_(std::make_unique<secagg::Client>(
          id, secagg::Params{.round = round,
                             .threshold = 2,
                             .vector_size = static_cast<std::size_t>(vector_size)})) {}

transport::SecAggData SecAggSession::advertise() const {
  const auto a = client_->advertise();
  transport::SecAggData d;
  d.members.push_back(
      {.id = id_, .channel_key = a.channel_public, .mask_key = a.mask_public, .weight = 0});
  return d;
}

transport::SecAggData SecAggSession::on_keys(const transport::SecAggData& keys) {
  if (keyed_) throw ProtocolError("secure aggregation: keys for this round came twice");
  if (keys.vector_size != vector_size_) {
    throw ProtocolError("secure aggregation: the keys are for a model of " +
                        std::to_string(keys.vector_size) + " coordinates; this client holds " +
                        std::to_string(vector_size_));
  }
  if (!(keys.clip > 0 && std::isfinite(keys.clip)) || keys.levels < 2)
    throw ProtocolError("secure aggregation: the keys carry no fixed-point range");
  const auto me = std::find_if(keys.members.begin(), keys.members.end(),
                               [&](const auto& m) { return m.id == id_; });
  if (me == keys.members.end())
    throw ProtocolError("secure aggregation: this client is not among the round's keys");
  if (!(me->weight > 0 && me->weight <= 1))
    throw ProtocolError("secure aggregation: this client's weight is not in (0, 1]");
  client_->configure({.round = round_,
                      .threshold = keys.threshold,
                      .vector_size = static_cast<std::size_t>(vector_size_),
                      .degree = keys.degree,
                      .graph_seed = keys.graph_seed});
  // U1: every id (keys.survivors), with the keys the coordinator sent (SecAgg+: this client's
  // neighbours' only; the others' are never used).
  std::map<std::uint32_t, secagg::Advertisement> by_id;
  for (const auto id : keys.survivors) by_id[id] = {.client = id};
  for (const auto& m : keys.members)
    by_id[m.id] = {.client = m.id, .channel_public = m.channel_key, .mask_public = m.mask_key};
  std::vector<secagg::Advertisement> u1;
  u1.reserve(by_id.size());
  for (const auto& [id, a] : by_id) u1.push_back(a);
  auto sealed = client_->share_keys(u1);
  weight_ = me->weight;
  clip_ = keys.clip;
  levels_ = keys.levels;
  keyed_ = true;
  transport::SecAggData out;
  out.sealed.reserve(sealed.size());
  for (auto& s : sealed)
    out.sealed.push_back({.from = s.from, .to = s.to, .ciphertext = std::move(s.ciphertext)});
  return out;
}

void SecAggSession::on_forwarded(const transport::SecAggData& forwarded) {
  if (!keyed_) throw ProtocolError("secure aggregation: shares forwarded before the keys");
  if (opened_) throw ProtocolError("secure aggregation: shares forwarded twice");
  std::vector<secagg::SealedShares> received;
  received.reserve(forwarded.sealed.size());
  for (const auto& s : forwarded.sealed)
    received.push_back({.from = s.from, .to = s.to, .ciphertext = s.ciphertext});
  client_->open_shares(received);
  opened_ = true;
}

std::vector<std::uint32_t> SecAggSession::masked_input(std::span<const float> update,
                                                       std::uint64_t seed) const {
  COHORT_CHECK(opened_ && update.size() == vector_size_) << "masked_input after on_forwarded()";
  std::vector<float> scaled(update.size());
  const double w = weight_;
  for (std::size_t i = 0; i < update.size(); ++i)
    scaled[i] = static_cast<float>(static_cast<double>(update[i]) * w);
  std::vector<std::uint32_t> y(update.size());
  secagg::FixedPoint(clip_, levels_).encode_stochastic(scaled, seed, y);
  client_->mask_range(0, y);
  return y;
}

transport::SecAggData SecAggSession::on_unmask(const transport::SecAggData& ask) {
  if (!opened_) throw ProtocolError("secure aggregation: unmasking asked before masking");
  if (unmasked_) throw ProtocolError("secure aggregation: unmasking asked twice in one round");
  const auto shares = client_->unmask(ask.survivors);
  unmasked_ = true;
  transport::SecAggData out;
  for (const auto& [owner, s] : shares.self_mask) out.self_mask.push_back(wire_share(owner, s));
  for (const auto& [owner, s] : shares.mask_key) out.mask_key.push_back(wire_share(owner, s));
  return out;
}

}  // namespace cohort::client
