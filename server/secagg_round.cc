// The coordinator's side of secure aggregation (secagg_round.h).
#include "secagg_round.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;
using transport::SecAggData;
using transport::SecAggStage;
namespace secagg = aggregation::secagg;

const char* stage_name(SecAggStage s) {
  switch (s) {
    case SecAggStage::kAdvertise: return "advertise";
    case SecAggStage::kKeys: return "keys";
    case SecAggStage::kShares: return "shares";
    case SecAggStage::kForwarded: return "forwarded";
    case SecAggStage::kUnmask: return "unmask";
    case SecAggStage::kUnmaskShares: return "unmaskShares";
    case SecAggStage::kSeeds: return "seeds";
    case SecAggStage::kHeld: return "held";
  }
  return "?";
}

secagg::Share share_of(const transport::SecAggShare& s) { return {.x = s.x, .y = s.y}; }

}  // namespace

SecAggRound::SecAggRound(const SecAggOptions& options, Outbox& out, const Clock& clock,
                         Shards shards)
    : options_(options), out_(out), clock_(clock), shards_(std::move(shards)) {}

void SecAggRound::reset() {
  stage_ = Stage::kIdle;
  failure_.clear();
  cohort_.clear();
  by_id_.clear();
  adverts_.clear();
  u1_.clear();
  shares_.clear();
  held_.clear();
  u3_.clear();
  responses_.clear();
}

void SecAggRound::begin(std::uint64_t round, std::vector<Member> cohort,
                        std::uint64_t vector_size) {
  reset();
  round_ = round;
  vector_size_ = vector_size;
  for (auto& m : cohort) {
    by_id_[m.id] = m.node;
    cohort_[m.node] = std::move(m);
  }
  stage_ = Stage::kAdvertise;
  deadline_ = clock_.now() + options_.stage;
}

std::size_t SecAggRound::dropped() const {
  if (stage_ == Stage::kIdle) return 0;
  std::size_t alive = cohort_.size();
  if (stage_ >= Stage::kShares) alive = u1_.size();
  if (stage_ >= Stage::kMasking) alive = std::min(alive, shares_.size());
  if (stage_ >= Stage::kUnmask) alive = std::min(alive, u3_.size());
  return cohort_.size() - alive;
}

const SecAggRound::Member* SecAggRound::member(const NodeId& node) const {
  const auto it = cohort_.find(node);
  return it == cohort_.end() ? nullptr : &it->second;
}

secagg::Params SecAggRound::params() const {
  return {.round = round_,
          .threshold = threshold_,
          .vector_size = static_cast<std::size_t>(vector_size_),
          .degree = degree_,
          .graph_seed = graph_seed_};
}

void SecAggRound::fail(std::string why) {
  stage_ = Stage::kFailed;
  failure_ = "secure aggregation: " + std::move(why);
  COHORT_LOG(Warn) << "round " << round_ << ": " << failure_;
}

void SecAggRound::refuse(const Message& m, const std::string& why) {
  COHORT_LOG(Info) << "secure aggregation, round " << round_ << ": refused a message from "
                   << m.sender << ": " << why;
  Envelope e;
  e.round = m.envelope.round;
  e.body = transport::ErrorBody{.code = transport::ErrorCode::kMalformed,
                                .message = "secure aggregation: " + why,
                                .ref_seq = m.envelope.seq};
  try {
    out_.send(m.peer, std::move(e));
  } catch (const TransportError&) {
    // The refusal is a courtesy: the round goes on without it.
  }
}

bool SecAggRound::send_data(const transport::PeerHandle& peer, SecAggStage stage,
                            const SecAggData& data) {
  auto bytes = std::make_shared<std::vector<std::byte>>(transport::encode_secagg(data));
  Envelope e;
  e.round = round_;
  e.body = transport::SecAgg{.round = round_, .stage = stage};
  try {
    return out_.send(peer, std::move(e), transport::Payload{*bytes, bytes});
  } catch (const TransportError& ex) {
    COHORT_LOG(Info) << "secure aggregation: " << stage_name(stage) << " not sent: " << ex.what();
    return false;
  }
}

void SecAggRound::on_message(const Message& m, const transport::SecAgg& s) {
  if (!m.complete || m.offset != 0) {
    if (m.complete) refuse(m, "stage data larger than one chunk");
    return;
  }
  if (s.round != round_ || m.envelope.round != round_ || stage_ == Stage::kIdle) {
    return refuse(m, std::string(stage_name(s.stage)) + " for round " + std::to_string(s.round) +
                         ", which is not the round in progress");
  }
  if (stage_ == Stage::kFailed || stage_ == Stage::kDone) return;  // late: the round moved on
  SecAggData d;
  try {
    d = transport::decode_secagg(m.payload.span());
  } catch (const ProtocolError& e) {
    return refuse(m, e.what());
  }
  switch (s.stage) {
    case SecAggStage::kAdvertise: {
      const Member* who = member(m.sender);
      if (stage_ != Stage::kAdvertise) return refuse(m, "keys advertised after the key stage");
      if (who == nullptr) return refuse(m, m.sender + " is not in round's cohort");
      if (d.members.size() != 1 || d.members[0].id != who->id)
        return refuse(m, "an advertisement names exactly its sender");
      if (adverts_.contains(who->id)) return refuse(m, "keys advertised twice");
      adverts_[who->id] = {.client = who->id,
                           .channel_public = d.members[0].channel_key,
                           .mask_public = d.members[0].mask_key};
      if (adverts_.size() == cohort_.size()) finish_advertise();
      return;
    }
    case SecAggStage::kShares: {
      const Member* who = member(m.sender);
      if (stage_ != Stage::kShares) return refuse(m, "shares sent outside the share stage");
      if (who == nullptr || !adverts_.contains(who->id))
        return refuse(m, m.sender + " did not advertise keys in this round");
      if (shares_.contains(who->id)) return refuse(m, "shares sent twice");
      std::set<std::uint32_t> to;
      for (const auto& sealed : d.sealed) {
        if (sealed.from != who->id) return refuse(m, "a share names another sender");
        if (sealed.to == who->id || !adverts_.contains(sealed.to) || !to.insert(sealed.to).second)
          return refuse(m, "a share is addressed outside the cohort, to its sender, or twice");
      }
      shares_[who->id] = std::move(d.sealed);
      if (shares_.size() == u1_.size()) finish_shares();
      return;
    }
    case SecAggStage::kUnmaskShares: {
      const Member* who = member(m.sender);
      if (stage_ != Stage::kUnmask) return refuse(m, "unmasking shares outside the unmask stage");
      if (who == nullptr || !std::binary_search(u3_.begin(), u3_.end(), who->id))
        return refuse(m, m.sender + " is not among the round's survivors");
      if (responses_.contains(who->id)) return refuse(m, "unmasking shares sent twice");
      secagg::UnmaskingShares r{.from = who->id, .self_mask = {}, .mask_key = {}};
      for (const auto& x : d.self_mask) r.self_mask.emplace_back(x.owner, share_of(x));
      for (const auto& x : d.mask_key) r.mask_key.emplace_back(x.owner, share_of(x));
      responses_[who->id] = std::move(r);
      if (responses_.size() == u3_.size()) finish_unmask();
      return;
    }
    case SecAggStage::kHeld: {
      if (stage_ != Stage::kHeld) return refuse(m, "a held list outside the held stage");
      for (std::size_t i = 1; i < held_.size(); ++i) {
        if (shards_.node(i) != m.sender) continue;
        if (held_[i].answered) return;
        held_[i].answered = true;
        for (const auto& x : d.members) held_[i].nodes.insert(x.node);
        if (std::all_of(held_.begin(), held_.end(), [](const Held& h) { return h.answered; }))
          finish_held();
        return;
      }
      return refuse(m, m.sender + " is not a shard");
    }
    default: return refuse(m, std::string("stage ") + stage_name(s.stage) + " is not sent here");
  }
}

void SecAggRound::finish_advertise() {
  for (const auto& [id, a] : adverts_) u1_.push_back(id);
  const std::size_t n = u1_.size();
  // The degree and the threshold follow from the cohort the round selected, not from who
  // advertised: dropping clients (or a server that drops them) cannot lower the threshold.
  const std::size_t selected = cohort_.size();
  std::size_t k = selected;
  if (options_.kind == SecAggKind::kSecAggPlus)
    k = std::min(selected, options_.degree != 0 ? std::size_t{options_.degree}
                                                : secagg::default_degree(selected));
  degree_ = k < n ? k : 0;  // 0: every member of U1 neighbours every other
  threshold_ = secagg::default_threshold(k, options_.threshold);
  if (n < 2 || n < threshold_) {
    return fail(std::to_string(n) + " of " + std::to_string(cohort_.size()) +
                " clients advertised keys within secagg.stage_ms; the threshold is " +
                std::to_string(threshold_));
  }
  for (std::size_t i = 0; i < graph_seed_.size(); i += 8) {
    const std::uint64_t r = aggregation::secure_random_seed();
    std::memcpy(graph_seed_.data() + i, &r, 8);
  }
  SecAggData keys;
  keys.threshold = static_cast<std::uint32_t>(threshold_);
  keys.degree = static_cast<std::uint32_t>(degree_);
  keys.graph_seed = graph_seed_;
  keys.vector_size = vector_size_;
  keys.clip = options_.clip;
  keys.levels = options_.levels;
  keys.survivors = u1_;  // U1's ids: the graph is drawn over them
  const auto member_of = [&](std::uint32_t id) {
    const Member& who = cohort_.at(by_id_.at(id));
    const auto& a = adverts_.at(id);
    return transport::SecAggMember{.id = id,
                                   .node = who.node,
                                   .channel_key = a.channel_public,
                                   .mask_key = a.mask_public,
                                   .weight = who.weight};
  };
  stage_ = Stage::kShares;
  deadline_ = clock_.now() + options_.stage;
  if (degree_ == 0) {
    for (const auto id : u1_) keys.members.push_back(member_of(id));
    for (const auto id : u1_) send_data(cohort_.at(by_id_.at(id)).peer, SecAggStage::kKeys, keys);
    return;
  }
  // SecAgg+: each member gets its own keys and its neighbours' only (O(k) keys, O(n) ids).
  const auto graph = secagg::neighbourhoods(u1_, degree_, graph_seed_);
  for (const auto id : u1_) {
    keys.members.clear();
    keys.members.push_back(member_of(id));
    for (const auto v : graph.at(id)) keys.members.push_back(member_of(v));
    send_data(cohort_.at(by_id_.at(id)).peer, SecAggStage::kKeys, keys);
  }
}

void SecAggRound::finish_shares() {
  if (shares_.size() < threshold_) {
    return fail(std::to_string(shares_.size()) + " of " + std::to_string(u1_.size()) +
                " clients sent their shares within secagg.stage_ms; the threshold is " +
                std::to_string(threshold_));
  }
  std::map<std::uint32_t, SecAggData> forward;
  for (const auto& [from, sealed] : shares_) {
    for (const auto& s : sealed) {
      if (shares_.contains(s.to)) forward[s.to].sealed.push_back(s);
    }
  }
  stage_ = Stage::kMasking;
  for (const auto& [id, sealed] : shares_) {
    send_data(cohort_.at(by_id_.at(id)).peer, SecAggStage::kForwarded, forward[id]);
  }
}

void SecAggRound::close() {
  COHORT_CHECK(stage_ == Stage::kMasking) << "secure aggregation closes a masking round";
  stage_ = Stage::kHeld;
  deadline_ = clock_.now() + options_.stage;
  held_.assign(shards_.count, {});
  const auto local = shards_.local_held(round_);
  held_[0] = {.answered = true, .nodes = {local.begin(), local.end()}};
  for (std::size_t i = 1; i < held_.size(); ++i) send_held(i);
  held_retry_ = clock_.now() + 2s;
  if (held_.size() == 1) finish_held();
}

void SecAggRound::send_held(std::size_t shard) {
  Envelope e;
  e.round = round_;
  e.body = transport::SecAgg{.round = round_, .stage = SecAggStage::kHeld};
  try {
    (void)shards_.send(shard, std::move(e), transport::Payload{});
  } catch (const TransportError& ex) {
    COHORT_LOG(Info) << "secure aggregation: held not sent to shard " << shard << ": " << ex.what();
  }
}

void SecAggRound::finish_held() {
  // U3: whose masked input every shard holds. One that some shards hold and others not broke off
  // between its pushes; its input cannot be taken out of the sums that hold it.
  std::set<NodeId> all = held_[0].nodes, every = held_[0].nodes;
  for (std::size_t i = 1; i < held_.size(); ++i) {
    all.insert(held_[i].nodes.begin(), held_[i].nodes.end());
    std::set<NodeId> both;
    std::set_intersection(every.begin(), every.end(), held_[i].nodes.begin(), held_[i].nodes.end(),
                          std::inserter(both, both.end()));
    every = std::move(both);
  }
  for (const auto& node : all) {
    const Member* who = member(node);
    if (!every.contains(node)) {
      return fail(node + "'s masked input reached only some of the shards");
    }
    if (who == nullptr || !shares_.contains(who->id)) {
      return fail("a shard holds a masked input from " + node + ", which did not share its keys");
    }
    u3_.push_back(who->id);
  }
  std::sort(u3_.begin(), u3_.end());
  if (u3_.size() < threshold_) {
    return fail(std::to_string(u3_.size()) + " masked inputs arrived (of " +
                std::to_string(shares_.size()) + " clients that shared keys); the threshold is " +
                std::to_string(threshold_));
  }
  SecAggData ask;
  ask.survivors = u3_;
  stage_ = Stage::kUnmask;
  deadline_ = clock_.now() + options_.stage;
  for (const auto id : u3_) send_data(cohort_.at(by_id_.at(id)).peer, SecAggStage::kUnmask, ask);
}

void SecAggRound::finish_unmask() {
  std::vector<secagg::Advertisement> u2;
  for (const auto& [id, sealed] : shares_) u2.push_back(adverts_.at(id));
  std::vector<secagg::UnmaskingShares> responses;
  for (auto& [id, r] : responses_) responses.push_back(std::move(r));
  responses_.clear();
  SecAggData seeds;
  try {
    const secagg::Reconstructed r = secagg::reconstruct(params(), u1_, u2, u3_, responses);
    for (const auto& [u, b] : r.self_seeds)
      seeds.seeds.push_back({.survivor = u, .dropped = u, .sign = 1, .seed = b});
    for (const auto& p : r.pair_seeds) {
      seeds.seeds.push_back({.survivor = p.survivor,
                             .dropped = p.dropped,
                             .sign = static_cast<std::int8_t>(p.sign),
                             .seed = p.seed});
    }
  } catch (const ProtocolError& e) {
    return fail(std::string("unmasking: ") + e.what());
  }
  seeds.survivors = u3_;
  seeds.vector_size = vector_size_;
  seeds.clip = options_.clip;
  seeds.levels = options_.levels;
  for (const auto id : u3_) seeds.total_weight += cohort_.at(by_id_.at(id)).weight;
  stage_ = Stage::kDone;
  shards_.local_seeds(round_, seeds);
  auto bytes = std::make_shared<std::vector<std::byte>>(transport::encode_secagg(seeds));
  for (std::size_t i = 1; i < shards_.count; ++i) {
    Envelope e;
    e.round = round_;
    e.body = transport::SecAgg{.round = round_, .stage = SecAggStage::kSeeds};
    try {
      if (!shards_.send(i, std::move(e), transport::Payload{*bytes, bytes})) {
        return fail("shard " + std::to_string(i) + " is down: its seeds could not be sent");
      }
    } catch (const TransportError& ex) {
      return fail("shard " + std::to_string(i) + ": seeds not sent: " + ex.what());
    }
  }
  for (auto& b : seeds.seeds) std::fill(b.seed.begin(), b.seed.end(), 0);
}

void SecAggRound::tick() {
  const TimePoint now = clock_.now();
  switch (stage_) {
    case Stage::kAdvertise:
      if (now >= deadline_) finish_advertise();
      break;
    case Stage::kShares:
      if (now >= deadline_) finish_shares();
      break;
    case Stage::kHeld:
      if (now >= deadline_) {
        for (std::size_t i = 1; i < held_.size(); ++i) {
          if (!held_[i].answered) {
            return fail("shard " + std::to_string(i) +
                        " did not say whose masked inputs it holds within secagg.stage_ms");
          }
        }
      } else if (now >= held_retry_) {
        for (std::size_t i = 1; i < held_.size(); ++i)
          if (!held_[i].answered) send_held(i);
        held_retry_ = now + 2s;
      }
      break;
    case Stage::kUnmask:
      if (now >= deadline_) finish_unmask();
      break;
    default: break;
  }
}

}  // namespace cohort::server
