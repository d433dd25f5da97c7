// Federated rounds (docs/ALGORITHMS.md section 1): the coordinator opens a round with its
// selection, the selected clients push deltas that stream into the aggregation rule, and the round
// closes in two phases (the rule's aggregate, DP noise, FedNova's rescale, the server optimizer's
// step).

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include "cohort/aggregation/privacy.h"
#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/primitives.h"

#include "modes.h"

namespace cohort::server {
namespace {

using transport::Message;

// Multiplies x by `factor`, in double, rounding once per element (factor 1 leaves x as it is).
void scale_in_double(std::span<float> x, double factor) {
  for (float& v : x) v = static_cast<float>(static_cast<double>(v) * factor);
}

class FederatedMode final : public ShardMode {
 public:
  FederatedMode(ShardCore& core, const DpOptions& dp, Normalization normalization, bool secure)
      : core_(core), fednova_(normalization == Normalization::kFedNova), secure_(secure) {
    dp_clip_ = dp.clip;
    dp_noise_ = dp.noise_multiplier;
    dp_seed_ = dp.seed;
    // Each shard draws its own noise: a seed shared by the shards would correlate their ranges.
    if (dp_seed_ == 0)
      dp_seed_ = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }

  void on_pull(Message& m, const transport::Pull& p) override { core_.serve_pull(m, p); }
  void on_push(Message& m, const transport::Push& p) override;

  void open_round(std::uint64_t round, const std::vector<NodeId>& clients) override {
    if (round < selection_round_) return;
    if (round > selection_round_) {
      selection_round_ = round;
      selection_.clear();
    }
    selection_.insert(clients.begin(), clients.end());
  }

  void prepare(std::uint64_t round) override {
    if (secure_) return prepare_secure(round);
    const std::size_t n = open_round_ == round ? core_.aggregator->completed_updates() : 0;
    if (n > 0) {
      delta_ = FloatBuffer(core_.size());
      core_.prepared.ok = core_.aggregator->finish_round(delta_.span());
      scale_ = fednova_scale();
    }
    if (!core_.prepared.ok) {
      delta_ = FloatBuffer();
      scale_ = 1.0;
      core_.prepared.reason = core_.rule_refusal(n);
    }
  }

  void close(std::uint64_t round, bool commit) override {
    const bool apply = commit && core_.prepared.ok;
    if (apply && open_round_ == round) {
      if (dp_noise_ > 0) {
        // DP-FedAvg (8.4) with uniform weights: the mean of m updates clipped to S has
        // sensitivity S/m, so sigma = z S / m. compression_seed() only mixes the numbers.
        const double m =
            static_cast<double>(secure_ ? applied_.size() : core_.aggregator->completed_updates());
        aggregation::add_gaussian_noise(
            delta_.span(), aggregation::dp_fedavg_noise_stddev(dp_noise_, dp_clip_, 1.0, m),
            aggregation::compression_seed(dp_seed_, round, core_.index));
      }
      // FedNova's rescale comes after the noise. Under DP it is tau_eff = mean a_i, and the
      // step counts a_i are not the clients' data: the server assigned them (or they follow
      // from the round's settings), so it knows them and multiplying the released noised mean
      // by their mean is post-processing, which costs no privacy (a client whose a_i depended
      // on its data would leak through it). Without DP the rescale could as well happen in
      // prepare(): nothing reads delta_ in between.
      if (scale_ != 1.0) scale_in_double(delta_.span(), scale_);
      core_.optimizer->apply_delta(core_.writable_params(), delta_.span());
      ++core_.version;
    }
    // The delta buffer exists only while a round closes: during pushes a FedAvg shard holds
    // just its parameters and the running sum.
    delta_ = FloatBuffer();
    scale_ = 1.0;
    drop_open_round();
    core_.finish_close(round, commit);
  }

  std::vector<NodeId> secagg_held(std::uint64_t round) override;
  void secagg_seeds(std::uint64_t round, const transport::SecAggData& seeds) override;

  void on_coordinator_restart() override {
    if (open_round_ != 0 || !selection_.empty() || core_.prepared_round != 0) {
      COHORT_LOG(Info) << "shard " << core_.index << ": the coordinator restarted: dropped round "
                       << std::max(open_round_, selection_round_) << " (" << applied_.size()
                       << " update(s) applied), it will be reopened";
    }
    drop_open_round();
    selection_round_ = core_.last_closed;
    core_.prepared_round = 0;
    core_.prepared = {};
    delta_ = FloatBuffer();
    scale_ = 1.0;
  }

 private:
  // One client's update of the open round, fed by its transfer and by any resend that continues
  // it (place_chunk()): every transfer key of the push shares it.
  struct Transfer {
    bool rejected = false;
    bool done = false;           // complete and applied
    transport::Push push;        // the first chunk's header: a resend must match it
    std::uint64_t bytes = 0;     // the payload's length
    std::uint64_t received = 0;  // payload bytes taken, [0, received)
    ClientId client = 0;
    double weight = 1.0;
    double samples = 0, work = 0;                       // n_i and FedNova's a_i (Push.local_work)
    std::unique_ptr<aggregation::PushDecoder> decoder;  // compressed pushes only
    FloatBuffer whole;  // the reassembled update: non-streaming rule or DP clipping
  };

  // Why the first chunk of a push for a round cannot be taken, or empty.
  std::string refusal(const Message& m, const transport::Push& p) const;
  // Starts a transfer from the first chunk of a push: refused (with its ack), taken, or the
  // update of the same client still streaming in, which this transfer continues.
  std::shared_ptr<Transfer> start_transfer(const Message& m, const transport::Push& p);
  // Feeds one chunk of a taken transfer, less its first `skip` bytes (place_chunk()), to the rule
  // (or its reassembly buffer); false refuses.
  bool feed(Transfer& t, const Message& m, std::size_t skip, std::string& why);
  // What close() multiplies the rule's aggregate by: 1, or FedNova's rescale (see nova_).
  [[nodiscard]] double fednova_scale() const;
  // Secure aggregation: why a masked push cannot be taken (its shape), or empty.
  [[nodiscard]] std::string masked_refusal(const Message& m, const transport::Push& p) const;
  // Secure aggregation: a chunk of masked words into the transfer's buffer; on the last, the
  // input into the round's sum.
  bool feed_masked(Transfer& t, const Message& m, std::size_t skip, std::string& why);
  // Secure aggregation's phase one: the seeds' masks out of the sum, decoded, divided by the
  // survivors' weights: the weighted mean of their updates.
  void prepare_secure(std::uint64_t round);

  // Forgets the open round: its transfers, senders and the rule's state.
  void drop_open_round() {
    open_round_ = 0;
    for (auto& [key, t] : transfers_) release(*t);
    transfers_.clear();
    pushed_.clear();
    applied_.clear();
    streaming_.clear();
    selection_.clear();
    nova_ = {};
    masked_sum_.clear();
    masked_sum_.shrink_to_fit();
    frozen_round_ = 0;
    seeds_round_ = 0;
    seeds_.reset();
  }

  // Buffers of finished transfers go back to the pools, so pushes never allocate.
  void release(Transfer& t) {
    core_.give_back(std::move(t.decoder));
    if (!t.whole.empty() && t.whole.size() == core_.size())
      spare_updates_.push_back(std::move(t.whole));
    t.whole = FloatBuffer();
  }

  ClientId client_id(const NodeId& id) {
    auto [it, fresh] = client_ids_.try_emplace(id, static_cast<ClientId>(client_ids_.size()));
    return it->second;
  }

  ShardCore& core_;
  const bool fednova_;  // server.normalization = fednova
  const bool secure_;   // server.secure_aggregation: masked inputs only
  // Secure aggregation: the sum mod 2^32 of the open round's masked inputs over this range; the
  // round whose inputs stopped (the coordinator asked whose this shard holds); the seeds that
  // remove the masks, with the fixed point's range and levels and the survivors' weights.
  std::vector<std::uint32_t> masked_sum_;
  std::uint64_t frozen_round_ = 0, seeds_round_ = 0;
  std::optional<aggregation::secagg::Reconstructed> seeds_;
  double seeds_clip_ = 0, seeds_weight_ = 0;
  std::uint32_t seeds_levels_ = 0;
  FloatBuffer delta_;                  // the aggregate, between phase one and phase two
  double scale_ = 1.0;                 // what close() multiplies delta_ by (fednova_scale())
  std::uint64_t open_round_ = 0;       // the round whose pushes the rule is taking, or 0
  std::uint64_t selection_round_ = 0;  // the newest round the coordinator opened (RoundOpen)
  std::set<NodeId> selection_;         // who was selected for it
  std::unordered_map<std::string, std::shared_ptr<Transfer>> transfers_;  // by sender#seq
  std::vector<FloatBuffer> spare_updates_;
  double dp_clip_ = 0, dp_noise_ = 0;
  std::uint64_t dp_seed_ = 0;
  // FedNova (ALGORITHMS.md 1.7) over the open round's applied updates: sum n_i, sum n_i a_i,
  // sum n_i / a_i, and for DP (uniform weights) sum a_i and their count.
  struct NovaSums {
    double n = 0, n_a = 0, n_over_a = 0, a = 0;
    std::size_t count = 0;
  } nova_;
  std::set<NodeId> pushed_;
  std::set<NodeId> applied_;  // senders whose update of the open round is complete and accepted
  // Senders whose update of the open round is streaming in, and its transfer.
  std::unordered_map<NodeId, std::shared_ptr<Transfer>> streaming_;
  std::unordered_map<NodeId, ClientId> client_ids_;
};

std::string FederatedMode::masked_refusal(const Message& m, const transport::Push& p) const {
  if (!secure_) {
    return p.encoding == transport::Encoding::kMaskedU32
               ? "a masked input, but this server does not run secure aggregation"
               : "";
  }
  if (p.encoding != transport::Encoding::kMaskedU32)
    return "this server runs secure aggregation (server.secure_aggregation): push masked inputs";
  if (p.kind != transport::PushKind::kDelta) return "this server runs federated rounds";
  const auto range = core_.range();
  if (p.begin != range.begin || p.end != range.end || p.elements != range.size() ||
      m.envelope.payload_bytes != range.size() * 4)
    return "a masked input must cover this shard's range exactly, 4 bytes a coordinate";
  if (frozen_round_ == m.envelope.round)
    return "round " + std::to_string(m.envelope.round) + " takes no more masked inputs (unmasking)";
  return "";
}

std::string FederatedMode::refusal(const Message& m, const transport::Push& p) const {
  static constexpr PushRules kRules{.kind = transport::PushKind::kDelta,
                                    .wrong_kind = "this server runs federated rounds; send deltas",
                                    .name_compressed_size = true};
  std::string why = masked_refusal(m, p);
  if (!why.empty()) return why;
  if (!secure_) why = check_push_shape(p, m.envelope.payload_bytes, core_.range(), kRules);
  if (!why.empty()) return why;
  const std::uint64_t round = m.envelope.round;
  if (round <= core_.last_closed)
    return "round " + std::to_string(round) + " is closed (late push)";
  if (round > selection_round_)
    return "round " + std::to_string(round) + " has not opened on this shard";
  if (!selection_.contains(m.sender))
    return m.sender + " was not selected for round " + std::to_string(round);
  if (open_round_ != 0 && round != open_round_) return "push for another round";
  if (pushed_.contains(m.sender)) return "duplicate push for this round";
  if (p.num_samples == 0) return "zero samples";
  if (fednova_ && !(p.local_work > 0 && std::isfinite(p.local_work))) {
    std::ostringstream got;
    got << p.local_work << (p.local_work == 0 ? " (not given)" : "");
    return "server.normalization = fednova needs each push's local work a_i > 0 and finite, got " +
           got.str();
  }
  return {};
}

// FedNova's rescale (ALGORITHMS.md 1.20-1.23). Without DP the rule was fed weights w_i = n_i / a_i,
// so it gives R = sum w_i Delta_i / sum w_i; the step is
//   tau_eff * sum_i p_i Delta_i / a_i = R * (sum n_i / a_i) (sum n_i a_i) / (sum n_i)^2,
// p_i = n_i / sum_j n_j, tau_eff = sum_i p_i a_i. With all a_i equal to a the factor is
// (S/a)(a S)/S^2 = 1 up to rounding (exactly 1 when a is a power of two). A prefix of an abandoned
// update that FedAvg kept counts in its coordinates' mean but not in these sums. Under DP the rule
// averaged the clipped Delta_i / a_i with weight 1 (p_i = 1/m), so tau_eff is the mean a_i.
double FederatedMode::fednova_scale() const {
  if (!fednova_ || nova_.count == 0) return 1.0;
  if (dp_clip_ > 0) return nova_.a / static_cast<double>(nova_.count);
  return nova_.n_over_a * nova_.n_a / (nova_.n * nova_.n);
}

std::shared_ptr<FederatedMode::Transfer> FederatedMode::start_transfer(const Message& m,
                                                                       const transport::Push& p) {
  auto taken = std::make_shared<Transfer>();
  Transfer& t = *taken;
  t.client = client_id(m.sender);
  const std::uint64_t round = m.envelope.round;
  std::string why = refusal(m, p);
  if (secure_ && !why.empty() && applied_.contains(m.sender) && round == open_round_) {
    // Secure aggregation cannot tell a resend from a second, different input without reading
    // it, and a second input would corrupt the sum: refused, the first stands.
    why = "a second masked input for round " + std::to_string(round) + " (the first stands)";
  } else if (!why.empty() && applied_.contains(m.sender) && round == open_round_) {
    // A resend of an update already folded in (its ack was lost, e.g. on a cut link):
    // acknowledge it again and ignore its bytes, so it counts once and is applied once.
    t.rejected = true;
    core_.reply_ack(m, true, "");
    COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender
                     << " resent its update for round " << round
                     << ", already applied: acknowledged again";
    return taken;
  }
  if (const auto live = streaming_.find(m.sender);
      !why.empty() && live != streaming_.end() && round == open_round_) {
    // A resend while the update still streams in: its first transfer broke off (the link
    // dropped, and the chunks queued with it were lost: nothing else would ever finish it), or
    // the client's resend wait ran out on a loaded shard (the first transfer is still coming).
    // Either way the resend continues the same update, taking what the first did not, and
    // whichever reaches the end answers. A refusal would leave an update that broke off
    // neither applied nor refused, and its client waiting for the round's end.
    if (live->second->push == p && live->second->bytes == m.envelope.payload_bytes) {
      COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender
                       << " resent its update for round " << round << " while "
                       << live->second->received << " of " << live->second->bytes
                       << " bytes are in: the resend continues it";
      return live->second;
    }
    why = "a different update for round " + std::to_string(round) +
          " while the first still streams in";
  }
  if (!why.empty()) {
    t.rejected = true;
    core_.reply_ack(m, false, why);
    COHORT_LOG(Info) << "shard " << core_.index << ": refused push from " << m.sender << ": "
                     << why;
    return taken;
  }
  if (open_round_ == 0) {
    open_round_ = round;
    core_.aggregator->begin_round(round, core_.size());
  }
  pushed_.insert(m.sender);
  streaming_[m.sender] = taken;
  t.push = p;
  t.bytes = m.envelope.payload_bytes;
  t.samples = static_cast<double>(p.num_samples);
  t.work = fednova_ ? static_cast<double>(p.local_work) : 1.0;
  // DP-FedAvg weighs clients equally: the noise is calibrated to the unweighted mean. FedNova
  // without DP weighs update i by n_i / a_i (fednova_scale() restores the scale).
  t.weight = dp_clip_ > 0 ? 1.0 : t.samples / t.work;
  if (p.encoding != transport::Encoding::kDenseF32)
    t.decoder = core_.take_decoder(*wire_format(p.encoding));
  if (secure_ || !core_.aggregator->is_streaming() || dp_clip_ > 0) {
    if (spare_updates_.empty()) spare_updates_.emplace_back(core_.size());
    t.whole = std::move(spare_updates_.back());
    spare_updates_.pop_back();
  }
  return taken;
}

bool FederatedMode::feed_masked(Transfer& t, const Message& m, std::size_t skip, std::string& why) {
  if (frozen_round_ == m.envelope.round) {
    why = "round " + std::to_string(m.envelope.round) + " takes no more masked inputs (unmasking)";
    return false;
  }
  const auto bytes = m.payload.span().subspan(skip);
  const std::uint64_t at = m.offset + skip;
  auto whole = std::as_writable_bytes(t.whole.span());
  if (at + bytes.size() > whole.size()) {
    why = "masked input longer than the range";
    return false;
  }
  std::memcpy(whole.data() + at, bytes.data(), bytes.size());
  if (!m.complete) return true;
  if (at + bytes.size() != whole.size()) {
    why = "masked input shorter than the range";
    return false;
  }
  if (masked_sum_.size() != core_.size()) masked_sum_.assign(core_.size(), 0);
  const auto* words = reinterpret_cast<const std::byte*>(whole.data());
  for (std::size_t i = 0; i < masked_sum_.size(); ++i) {
    std::uint32_t w;
    std::memcpy(&w, words + 4 * i, 4);
    masked_sum_[i] += w;  // mod 2^32
  }
  return true;
}

std::vector<NodeId> FederatedMode::secagg_held(std::uint64_t round) {
  frozen_round_ = std::max(frozen_round_, round);
  if (!secure_ || open_round_ != round) return {};
  return {applied_.begin(), applied_.end()};
}

void FederatedMode::secagg_seeds(std::uint64_t round, const transport::SecAggData& d) {
  if (!secure_) return;
  seeds_.emplace();
  seeds_->vector_size = d.vector_size;
  seeds_->survivors = d.survivors;
  for (const auto& s : d.seeds) {
    if (s.survivor == s.dropped) {
      seeds_->self_seeds.emplace_back(s.survivor, s.seed);
    } else {
      seeds_->pair_seeds.push_back(
          {.survivor = s.survivor, .dropped = s.dropped, .sign = s.sign, .seed = s.seed});
    }
  }
  seeds_round_ = round;
  seeds_clip_ = d.clip;
  seeds_levels_ = d.levels;
  seeds_weight_ = d.total_weight;
}

void FederatedMode::prepare_secure(std::uint64_t round) {
  const std::size_t n = open_round_ == round ? applied_.size() : 0;
  core_.prepared.ok = false;
  if (n == 0) {
    core_.prepared.reason = "no masked input arrived";
  } else if (seeds_round_ != round || !seeds_) {
    core_.prepared.reason = "no unmasking seeds for round " + std::to_string(round);
  } else if (seeds_->survivors.size() != n || seeds_->vector_size < core_.end ||
             !(seeds_weight_ > 0)) {
    core_.prepared.reason = "the unmasking seeds name " + std::to_string(seeds_->survivors.size()) +
                            " survivors; this shard holds " + std::to_string(n) + " inputs";
  } else {
    try {
      aggregation::secagg::remove_masks(*seeds_, core_.begin, masked_sum_);
      delta_ = FloatBuffer(core_.size());
      aggregation::secagg::FixedPoint(seeds_clip_, seeds_levels_)
          .decode_sum(masked_sum_, n, delta_.span());
      scale_in_double(delta_.span(), 1.0 / seeds_weight_);
      core_.prepared.ok = kernels::all_finite(delta_.span());
      if (!core_.prepared.ok) core_.prepared.reason = "the unmasked mean is not finite";
    } catch (const Error& e) {
      core_.prepared.reason = std::string("unmasking: ") + e.what();
    }
  }
  scale_ = 1.0;
  if (!core_.prepared.ok) delta_ = FloatBuffer();
}

bool FederatedMode::feed(Transfer& t, const Message& m, std::size_t skip, std::string& why) {
  if (secure_) return feed_masked(t, m, skip, why);
  const std::size_t size = core_.size();
  // Decoded values go to the rule at their offset, or into the reassembly buffer.
  auto take = [&](std::size_t offset, std::span<const float> values) {
    if (!t.whole.empty()) {
      if (!chunk_fits(offset, values.size(), size, why)) return false;
      if (!kernels::copy_finite(values, t.whole.span().subspan(offset, values.size()))) {
        why = "update has non-finite values";
        return false;
      }
      return true;
    }
    if (core_.aggregator->accept({t.client, offset, values, t.weight}) ==
        aggregation::Verdict::kRejected) {
      why = "non-finite values or bad shape";
      return false;
    }
    return true;
  };
  if (!decode_chunk(m, skip, t.decoder.get(), core_.decode_scratch, take, why)) return false;
  if (m.complete && !t.whole.empty()) {
    // FedNova under DP normalises first, then clips: the clip bounds what enters the mean,
    // Delta_i / a_i, so the sensitivity stays S / m whatever a_i is. Clipping Delta_i before the
    // division would let a client with small a_i weigh up to S / a_i, and would clip a client with
    // large a_i for the length of its work rather than for its direction.
    if (fednova_ && dp_clip_ > 0) scale_in_double(t.whole.span(), 1.0 / t.work);
    // Each range is clipped to S as well: a client that skipped client.dp_clip is bounded by
    // S per shard (S sqrt(shards) in all); one that clipped is unchanged.
    if (dp_clip_ > 0) (void)aggregation::clip_l2(t.whole.span(), dp_clip_);
    if (core_.aggregator->accept({t.client, 0, t.whole.span(), t.weight}) ==
        aggregation::Verdict::kRejected) {
      why = "non-finite values or bad shape";
      return false;
    }
  }
  return true;
}

// A federated push: fp32 chunks (kDenseF32), or the framed pieces of a compressed encoding
// (aggregation/push_codec.h), each decoded as soon as its bytes are in into a buffer reused for
// every push. Values stream into a streaming rule at their offsets; for a non-streaming rule, or
// when DP clips each update (dp.clip), they are reassembled into a pooled buffer first. Anything
// malformed refuses this push with an ack and leaves the round running.
void FederatedMode::on_push(Message& m, const transport::Push& p) {
  const std::string key = m.sender + "#" + std::to_string(m.envelope.seq);
  auto it = transfers_.find(key);
  if (m.offset == 0 && it == transfers_.end())
    it = transfers_.emplace(key, start_transfer(m, p)).first;
  if (it == transfers_.end()) {
    // A chunk of a transfer this shard no longer holds: its round closed or was dropped while
    // the update streamed in. The sender still waits for an answer: its last chunk gets one.
    if (m.complete) {
      core_.reply_ack(m, false,
                      "round " + std::to_string(m.envelope.round) + " closed during the transfer");
      COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender << "'s update for round "
                       << m.envelope.round << " arrived after its round closed: refused";
    }
    return;
  }
  Transfer& t = *it->second;
  if (t.rejected) return;
  if (t.done) {
    // The end of a second transfer of an update another one finished (the resend after a
    // slow first): applied once, acknowledged again.
    if (m.complete) core_.reply_ack(m, true, "");
    return;
  }
  std::string why;
  const ChunkPlace place = place_chunk(t.received, m);
  switch (place.kind) {
    case ChunkPlace::kNext: break;
    case ChunkPlace::kTaken: return;  // the other transfer of this update brought it
    case ChunkPlace::kGap:
      why = "chunk at byte " + std::to_string(m.offset) + " while " + std::to_string(t.received) +
            " bytes are in";
      break;
  }
  if (!why.empty() || !feed(t, m, place.skip, why)) {
    t.rejected = true;
    if (!secure_) core_.aggregator->end_update(t.client, false);
    release(t);
    streaming_.erase(m.sender);
    core_.reply_ack(m, false, why);
    COHORT_LOG(Warn) << "shard " << core_.index << ": refused the update of " << m.sender << ": "
                     << why;
    return;
  }
  t.received = m.offset + m.payload.size();
  if (m.complete) {
    if (!secure_) core_.aggregator->end_update(t.client, true);
    release(t);
    t.done = true;
    streaming_.erase(m.sender);
    applied_.insert(m.sender);
    nova_.n += t.samples;
    nova_.n_a += t.samples * t.work;
    nova_.n_over_a += t.samples / t.work;
    nova_.a += t.work;
    ++nova_.count;
    core_.reply_ack(m, true, "");
    COHORT_LOG(Debug) << "shard " << core_.index << ": applied the update of " << m.sender
                      << " for round " << m.envelope.round;
  }
}

}  // namespace

std::unique_ptr<ShardMode> make_federated_mode(ShardCore& core, const DpOptions& dp,
                                               Normalization normalization, bool secure) {
  return std::make_unique<FederatedMode>(core, dp, normalization, secure);
}

}  // namespace cohort::server
