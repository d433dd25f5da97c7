#include "cohort/server/server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>

#include "cohort/aggregation/privacy.h"
#include "cohort/aggregation/push_codec.h"
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/metrics.h"
#include "cohort/kernels/network.h"
#include "cohort/server/checkpoint.h"
#include "cohort/transport/endpoint.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/primitives.h"

#include "options.h"
#include "rendezvous.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;
using transport::PeerHandle;
using Clock = std::chrono::steady_clock;

std::string port_of(const std::string& url) { return url.substr(url.rfind(':') + 1); }

void write_port_file(const std::string& path, const std::string& url) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw ConfigError("cannot write server.port_file " + path);
    out << port_of(url) << '\n';
  }
  std::filesystem::rename(tmp, path);
}

// Contiguous ranges of [0, size) for `shards` shards, balanced by bytes (equal element counts,
// the remainder spread over the first shards).
std::pair<std::uint64_t, std::uint64_t> shard_range(std::uint64_t size, std::uint32_t shards,
                                                    std::uint32_t index) {
  const std::uint64_t base = size / shards, extra = size % shards;
  const std::uint64_t begin = index * base + std::min<std::uint64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

// The built-in wire format a push encoding carries (kDenseF32: raw fp32, no header).
std::optional<aggregation::WireFormat> wire_format(transport::Encoding e) {
  using aggregation::WireFormat;
  switch (e) {
    case transport::Encoding::kDenseF32: return WireFormat::kDenseF32;
    case transport::Encoding::kDenseF16: return WireFormat::kFp16;
    case transport::Encoding::kDenseBf16: return WireFormat::kBf16;
    case transport::Encoding::kInt8: return WireFormat::kInt8;
    case transport::Encoding::kQsgd: return WireFormat::kQsgd;
    case transport::Encoding::kTopK: return WireFormat::kTopK;
    case transport::Encoding::kRandomK: return WireFormat::kRandomK;
    case transport::Encoding::kSign: return WireFormat::kSign;
    case transport::Encoding::kPowerSgd: return WireFormat::kLowRank;
  }
  return std::nullopt;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// The shard: owns [begin, end) of the flat parameter vector, serves pulls, folds pushes in.

class Shard {
 public:
  Shard(const Config& config, const Registries& registries, std::uint32_t index,
        std::uint32_t shards, MetricsSink* metrics)
      : config_(config), registries_(registries), index_(index), shards_(shards), metrics_(metrics) {
    const auto dir = config.get_string("server.checkpoint_dir");
    if (!dir.empty()) store_.emplace(dir, "shard-" + std::to_string(index));
    mode_ = config.get_string("server.mode");
    consistency_ = config.get_string("server.consistency");
    staleness_bound_ = static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.get_int("server.staleness")));
    workers_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.clients_per_round")));
    max_staleness_ = config.get_int("server.max_staleness");
    buffer_k_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.buffer_size")));
    dp_clip_ = config.get_double("dp.clip");
    dp_noise_ = config.get_double("dp.noise_multiplier");
    dp_seed_ = static_cast<std::uint64_t>(config.get_int("dp.seed"));
    // Each shard draws its own noise: a seed shared by the shards would correlate their ranges.
    if (dp_seed_ == 0) dp_seed_ = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }

  // Lays out the range and loads the newest checkpoint, or initialises from the model's seed.
  void setup(const std::string& model_spec, std::uint64_t model_size) {
    auto [b, e] = shard_range(model_size, shards_, index_);
    begin_ = b;
    end_ = e;
    model_spec_ = model_spec;
    aggregator_name_ = config_.section("aggregator").get_string("name", "fedavg");
    aggregator_ = registries_.aggregators.create(aggregator_name_, config_.section("aggregator"));
    optimizer_ = registries_.server_optimizers.create(
        config_.section("server_optimizer").get_string("name", "sgd"), optimizer_options(config_));
    optimizer_->reset(size());
    if (store_) {
      std::vector<std::string> skipped;
      auto state = store_->load_latest(&skipped);
      for (const auto& s : skipped) COHORT_LOG(Warn) << "shard " << index_ << ": skipped " << s;
      if (state) {
        if (state->begin != begin_ || state->end != end_ || state->model_spec != model_spec) {
          throw ConfigError("checkpoint in " + config_.get_string("server.checkpoint_dir") +
                            " is for another model or shard layout (" + state->model_spec + ")");
        }
        params_ = std::move(state->params);
        version_ = state->version;
        last_closed_ = state->round;
        for (auto& [name, buf] : state->optimizer_state) {
          for (auto& [slot, span] : optimizer_->state()) {
            if (slot == name && span.size() == buf.size()) std::copy(buf.begin(), buf.end(), span.begin());
          }
        }
        COHORT_LOG(Info) << "shard " << index_ << ": resumed from checkpoint at round "
                         << last_closed_ << " (version " << version_ << ")";
        return;
      }
    }
    FloatBuffer full(model_size);
    kernels::make_network_spec(model_spec).initialize(
        static_cast<std::uint64_t>(config_.get_int("model.seed")), full.span());
    params_ = FloatBuffer(full.span().subspan(begin_, size()));
    COHORT_LOG(Info) << "shard " << index_ << ": owns [" << begin_ << ", " << end_ << ") of "
                     << model_size << " parameters";
  }

  [[nodiscard]] bool ready() const { return !params_.empty() || size() == 0; }
  [[nodiscard]] std::uint64_t begin() const { return begin_; }
  [[nodiscard]] std::uint64_t end() const { return end_; }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(end_ - begin_); }
  [[nodiscard]] std::uint64_t version() const { return version_; }
  [[nodiscard]] std::uint64_t last_closed() const { return last_closed_; }
  // The aggregation rule's name, and the fewest complete updates with which it can aggregate.
  [[nodiscard]] const std::string& rule_name() const { return aggregator_name_; }
  [[nodiscard]] std::size_t rule_min_updates() const { return aggregator_ ? aggregator_->min_updates() : 1; }

  // The coordinator's selection for federated round `round` (RoundOpen): the first message for a
  // newer round replaces the list, later ones for the same round add to it. Only these clients'
  // pushes for the round are accepted.
  void open_round(std::uint64_t round, const std::vector<NodeId>& clients) {
    if (round < selection_round_) return;
    if (round > selection_round_) {
      selection_round_ = round;
      selection_.clear();
    }
    selection_.insert(clients.begin(), clients.end());
  }

  // Handles a pull or push message; returns true if it was one.
  bool handle(Endpoint& ep, Message& m) {
    if (auto* p = std::get_if<transport::Pull>(&m.envelope.body)) {
      if (mode_ == "dataparallel") {
        pending_pulls_.push_back(PendingPull{m.peer, m.sender, m.envelope, *p});
        serve_pending_pulls(ep);
      } else {
        on_pull(ep, m, *p);
      }
      return true;
    }
    if (auto* p = std::get_if<transport::Push>(&m.envelope.body)) {
      if (mode_ == "dataparallel") {
        on_gradient_chunk(ep, m, *p);
      } else if (mode_ == "fedbuff") {
        on_buffered_chunk(ep, m, *p);
      } else {
        on_push_chunk(ep, m, *p);
      }
      return true;
    }
    return false;
  }

  // Phase one of closing round `round` (RoundClose.prepare): the rule computes the aggregate into
  // delta_ (FedBuff: the buffered updates are set aside as this step's), nothing is applied yet.
  // The coordinator commits only if every shard's rule could, so a round moves every shard's
  // range or none. Asked again for the same round (a retry), it answers the same.
  struct Prepared {
    bool ok = false;
    std::string reason;  // why not, when !ok
  };
  Prepared prepare_round(std::uint64_t round) {
    if (round <= last_closed_) return {true, ""};  // committed already: a late retry
    if (prepared_round_ == round) return prepared_;
    prepared_round_ = round;
    prepared_ = {};
    if (mode_ == "fedbuff") {
      // K = buffer_size updates, on every shard: the coordinator counts its own shard's, and a
      // client's push may still be on its way to this one. Not yet is not a failure: the
      // coordinator puts the buffers back and asks again shortly.
      if (buffered_ < buffer_k_) {
        prepared_.reason = "shard " + std::to_string(index_) + " holds " + std::to_string(buffered_) +
                           " of " + std::to_string(buffer_k_) + " updates";
        return prepared_;
      }
      prepared_sum_.swap(buffer_sum_);
      buffer_sum_.assign(size(), 0.0);
      prepared_count_ = buffered_;
      buffered_ = 0;
      prepared_.ok = true;
      return prepared_;
    }
    const std::size_t n = open_round_ == round ? aggregator_->completed_updates() : 0;
    if (n > 0) {
      delta_ = FloatBuffer(size());
      prepared_.ok = aggregator_->finish_round(delta_.span());
    }
    if (!prepared_.ok) {
      delta_ = FloatBuffer();
      prepared_.reason = "shard " + std::to_string(index_) + ": aggregator '" + aggregator_name_ +
                         "' could not aggregate " + std::to_string(n) +
                         " complete update(s) (it needs at least " +
                         std::to_string(aggregator_->min_updates()) + ")";
    }
    return prepared_;
  }

  // Round r is over: fold in (commit) or throw away what arrived. Returns the new version.
  std::uint64_t close_round(std::uint64_t round, bool commit) {
    if (round <= last_closed_) return version_;  // repeated close (coordinator retry)
    // A commit without phase one (a coordinator that skipped it) prepares now.
    if (commit && prepared_round_ != round) (void)prepare_round(round);
    const bool apply = commit && prepared_.ok;
    if (mode_ == "fedbuff") {
      close_step(round, commit);
      return version_;
    }
    if (apply && open_round_ == round) {
      if (dp_noise_ > 0) {
        // DP-FedAvg (8.4) with uniform weights: the mean of m updates clipped to S has
        // sensitivity S/m, so sigma = z S / m. compression_seed() only mixes the numbers.
        const double m = static_cast<double>(aggregator_->completed_updates());
        aggregation::add_gaussian_noise(
            delta_.span(), aggregation::dp_fedavg_noise_stddev(dp_noise_, dp_clip_, 1.0, m),
            aggregation::compression_seed(dp_seed_, round, index_));
      }
      optimizer_->apply_delta(params_.span(), delta_.span());
      ++version_;
    }
    // The delta buffer exists only while a round closes: during pushes a FedAvg shard holds
    // just its parameters and the running sum.
    delta_ = FloatBuffer();
    prepared_round_ = 0;
    prepared_ = {};
    committed_ += commit ? 1 : 0;
    last_closed_ = round;
    drop_open_round();
    if (store_ && commit) {
      const auto every = std::max<std::int64_t>(1, config_.get_int("server.checkpoint_every"));
      if (committed_ % static_cast<std::uint64_t>(every) == 0) checkpoint();
    }
    return version_;
  }

  // FedBuff's buffered updates, and how many the step being prepared set aside.
  [[nodiscard]] std::size_t buffered() const { return buffered_; }
  [[nodiscard]] std::size_t prepared_count() const { return prepared_count_; }

  // The coordinator welcomed this shard (again). A new epoch means it restarted: whatever round
  // this shard had open belongs to the old coordinator, which the new one reopens from scratch,
  // so its updates go (a resend would otherwise be acknowledged as "already applied" and the old
  // update kept). `committed` is the coordinator's last committed round: a round this shard
  // prepared and the coordinator committed before it died is committed here too.
  void on_welcome(std::uint64_t epoch, std::uint64_t committed) {
    const bool restarted = coordinator_epoch_ != 0 && epoch != coordinator_epoch_;
    coordinator_epoch_ = epoch;
    if (!restarted) return;
    if (mode_ != "dataparallel" && committed == last_closed_ + 1 && prepared_round_ == committed &&
        prepared_.ok) {
      COHORT_LOG(Info) << "shard " << index_ << ": the coordinator restarted having committed round "
                       << committed << ", which this shard had prepared: committing it";
      (void)close_round(committed, true);
    } else if (mode_ != "dataparallel" && committed != last_closed_) {
      COHORT_LOG(Warn) << "shard " << index_ << ": the coordinator restarted at round " << committed
                       << ", this shard's model is at round " << last_closed_
                       << " (checkpoints taken at different rounds?)";
    }
    if (open_round_ != 0 || !selection_.empty() || prepared_round_ != 0) {
      COHORT_LOG(Info) << "shard " << index_ << ": the coordinator restarted: dropped round "
                       << std::max(open_round_, selection_round_) << " (" << applied_.size()
                       << " update(s) applied), it will be reopened";
    }
    if (mode_ == "federated") {
      drop_open_round();
      selection_round_ = last_closed_;
      prepared_round_ = 0;
      prepared_ = {};
      delta_ = FloatBuffer();
    } else if (mode_ == "fedbuff" && prepared_round_ != 0) {
      close_step(prepared_round_, false);  // back into the buffer
    }
  }

  void checkpoint() {
    if (!store_ || params_.empty()) return;
    ShardState s;
    s.shard = index_;
    s.shards = shards_;
    s.begin = begin_;
    s.end = end_;
    s.round = last_closed_;
    s.version = version_;
    s.model_spec = model_spec_;
    s.params = params_.clone();
    for (auto& [name, span] : optimizer_->state()) s.optimizer_state.emplace_back(name, FloatBuffer(span));
    try {
      store_->save(s);
    } catch (const DataError& e) {
      COHORT_LOG(Error) << "checkpoint failed, the previous one stays: " << e.what();
    }
  }

 private:
  struct Transfer {
    bool rejected = false;
    ClientId client = 0;
    double weight = 1.0;
    std::unique_ptr<aggregation::PushDecoder> decoder;  // compressed pushes only
    FloatBuffer whole;  // the reassembled update: non-streaming rule or DP clipping
  };

  // Forgets the open round: its transfers, senders and the rule's state.
  void drop_open_round() {
    open_round_ = 0;
    for (auto& [key, t] : transfers_) release(t);
    transfers_.clear();
    pushed_.clear();
    applied_.clear();
    selection_.clear();
  }

  // FedBuff's phase two: the step set aside by prepare_round() moves the model (commit), or goes
  // back into the buffer (abort).
  void close_step(std::uint64_t step, bool commit) {
    if (prepared_round_ != step || !prepared_.ok) {
      prepared_round_ = 0;
      prepared_ = {};
      return;
    }
    if (commit) {
      if (delta_.size() != size()) delta_ = FloatBuffer(size());
      const double inv_k = 1.0 / static_cast<double>(prepared_count_);
      for (std::size_t i = 0; i < size(); ++i) delta_[i] = static_cast<float>(prepared_sum_[i] * inv_k);
      optimizer_->apply_delta(params_.span(), delta_.span());
      ++version_;
      last_closed_ = step;
      if (store_) {
        const auto every = std::max<std::int64_t>(1, config_.get_int("server.checkpoint_every"));
        if (version_ % static_cast<std::uint64_t>(every) == 0) checkpoint();
      }
    } else {
      for (std::size_t i = 0; i < size(); ++i) buffer_sum_[i] += prepared_sum_[i];
      buffered_ += prepared_count_;
    }
    std::fill(prepared_sum_.begin(), prepared_sum_.end(), 0.0);
    prepared_count_ = 0;
    prepared_round_ = 0;
    prepared_ = {};
  }

  // Buffers of finished transfers go back to the pools, so pushes never allocate.
  void release(Transfer& t) {
    if (t.decoder) spare_decoders_.push_back(std::move(t.decoder));
    if (!t.whole.empty() && t.whole.size() == size()) spare_updates_.push_back(std::move(t.whole));
    t.whole = FloatBuffer();
  }

  void reply_ack(Endpoint& ep, const Message& m, bool ok, std::string reason) {
    Envelope e;
    e.round = m.envelope.round;
    e.body = transport::PushAck{ok, std::move(reason), version_};
    ep.send(m.peer, std::move(e));
  }

  void on_pull(Endpoint& ep, const Message& m, const transport::Pull& p) {
    if (p.begin < begin_ || p.end > end_ || p.begin > p.end) {
      Envelope e;
      e.body = transport::ErrorBody{transport::ErrorCode::kBadRange,
                                    "shard " + std::to_string(index_) + " owns [" +
                                        std::to_string(begin_) + ", " + std::to_string(end_) + ")",
                                    m.envelope.seq};
      ep.send(m.peer, std::move(e));
      return;
    }
    Envelope e;
    e.round = m.envelope.round;
    e.body = transport::PullReply{index_, p.begin, p.end, version_, transport::Encoding::kDenseF32};
    auto slice = params_.span().subspan(p.begin - begin_, p.end - p.begin);
    ep.send(m.peer, std::move(e), transport::Payload{as_bytes(slice), nullptr});
  }

  // A federated push: fp32 chunks (kDenseF32), or the framed pieces of a compressed encoding
  // (aggregation/push_codec.h), each decoded as soon as its bytes are in into a buffer reused for
  // every push. Values stream into a streaming rule at their offsets; for a non-streaming rule, or
  // when DP clips each update (dp.clip), they are reassembled into a pooled buffer first. Anything
  // malformed refuses this push with an ack and leaves the round running.
  void on_push_chunk(Endpoint& ep, Message& m, const transport::Push& p) {
    const std::uint64_t key_seq = m.envelope.seq;
    const std::string key = m.sender + "#" + std::to_string(key_seq);
    auto it = transfers_.find(key);
    if (m.offset == 0 && it == transfers_.end()) {
      Transfer t;
      t.client = client_id(m.sender);
      std::string why;
      const std::uint64_t round = m.envelope.round;
      const auto format = wire_format(p.encoding);
      const bool compressed = p.encoding != transport::Encoding::kDenseF32;
      if (p.kind != transport::PushKind::kDelta) why = "this server runs federated rounds; send deltas";
      else if (!format) why = "unsupported encoding";
      else if (p.shard != index_ || p.begin != begin_ || p.end != end_) why = "wrong shard range";
      else if (!compressed && m.envelope.payload_bytes != size() * sizeof(float)) why = "wrong update length";
      else if (compressed && p.elements != size()) why = "wrong update length";
      else if (compressed && (m.envelope.payload_bytes == 0 ||
                              m.envelope.payload_bytes > aggregation::max_push_bytes(size())))
        why = "compressed update of " + std::to_string(m.envelope.payload_bytes) + " bytes for " +
              std::to_string(size()) + " elements";
      else if (round <= last_closed_) why = "round " + std::to_string(round) + " is closed (late push)";
      else if (round > selection_round_) why = "round " + std::to_string(round) + " has not opened on this shard";
      else if (!selection_.contains(m.sender)) why = m.sender + " was not selected for round " + std::to_string(round);
      else if (open_round_ != 0 && round != open_round_) why = "push for another round";
      else if (pushed_.contains(m.sender)) why = "duplicate push for this round";
      else if (p.num_samples == 0) why = "zero samples";
      if (!why.empty() && applied_.contains(m.sender) && round == open_round_) {
        // A resend of an update already folded in (its ack was lost, e.g. on a cut link):
        // acknowledge it again and ignore its bytes, so it counts once and is applied once.
        t.rejected = true;
        reply_ack(ep, m, true, "");
        COHORT_LOG(Info) << "shard " << index_ << ": " << m.sender << " resent its update for round "
                         << round << ", already applied: acknowledged again";
      } else if (!why.empty()) {
        t.rejected = true;
        reply_ack(ep, m, false, why);
        COHORT_LOG(Info) << "shard " << index_ << ": refused push from " << m.sender << ": " << why;
      } else {
        if (open_round_ == 0) {
          open_round_ = round;
          aggregator_->begin_round(round, size());
        }
        pushed_.insert(m.sender);
        // DP-FedAvg weighs clients equally: the noise is calibrated to the unweighted mean.
        t.weight = dp_clip_ > 0 ? 1.0 : static_cast<double>(p.num_samples);
        if (compressed) {
          if (spare_decoders_.empty()) spare_decoders_.push_back(std::make_unique<aggregation::PushDecoder>());
          t.decoder = std::move(spare_decoders_.back());
          spare_decoders_.pop_back();
          t.decoder->reset(size(), *format);
        }
        if (!aggregator_->is_streaming() || dp_clip_ > 0) {
          if (spare_updates_.empty()) spare_updates_.emplace_back(size());
          t.whole = std::move(spare_updates_.back());
          spare_updates_.pop_back();
        }
      }
      it = transfers_.emplace(key, std::move(t)).first;
    }
    if (it == transfers_.end()) {
      // A chunk of a transfer this shard no longer holds: its round closed or was dropped while
      // the update streamed in. The sender still waits for an answer: its last chunk gets one.
      if (m.complete) {
        reply_ack(ep, m, false, "round " + std::to_string(m.envelope.round) + " closed during the transfer");
        COHORT_LOG(Info) << "shard " << index_ << ": " << m.sender << "'s update for round "
                         << m.envelope.round << " arrived after its round closed: refused";
      }
      return;
    }
    if (it->second.rejected) return;
    Transfer& t = it->second;
    const auto bytes = m.payload.span();
    std::string why;
    // Decoded values go to the rule at their offset, or into the reassembly buffer.
    auto take = [&](std::size_t offset, std::span<const float> values) {
      if (!t.whole.empty()) {
        if (offset > size() || values.size() > size() - offset) {
          why = "chunk past the end of the range";
          return false;
        }
        if (!kernels::copy_finite(values, t.whole.span().subspan(offset, values.size()))) {
          why = "update has non-finite values";
          return false;
        }
        return true;
      }
      if (aggregator_->accept({t.client, offset, values, t.weight}) == aggregation::Verdict::kRejected) {
        why = "non-finite values or bad shape";
        return false;
      }
      return true;
    };
    bool ok = true;
    try {
      if (t.decoder) {
        ok = t.decoder->feed(bytes, decode_scratch_, take);
        if (ok && m.complete) t.decoder->finish();
      } else if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0) {
        why = "misaligned chunk";
        ok = false;
      } else {
        ok = take(static_cast<std::size_t>(m.offset / sizeof(float)),
                  {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)});
      }
    } catch (const ProtocolError& e) {
      why = std::string("malformed compressed update: ") + e.what();
      ok = false;
    }
    if (ok && m.complete && !t.whole.empty()) {
      // Each range is clipped to S as well: a client that skipped client.dp_clip is bounded by
      // S per shard (S sqrt(shards) in all); one that clipped is unchanged.
      if (dp_clip_ > 0) (void)aggregation::clip_l2(t.whole.span(), dp_clip_);
      if (aggregator_->accept({t.client, 0, t.whole.span(), t.weight}) == aggregation::Verdict::kRejected) {
        why = "non-finite values or bad shape";
        ok = false;
      }
    }
    if (!ok) {
      t.rejected = true;
      aggregator_->end_update(t.client, false);
      release(t);
      reply_ack(ep, m, false, why);
      COHORT_LOG(Warn) << "shard " << index_ << ": refused the update of " << m.sender << ": " << why;
      return;
    }
    if (m.complete) {
      aggregator_->end_update(t.client, true);
      release(t);
      applied_.insert(m.sender);
      reply_ack(ep, m, true, "");
      COHORT_LOG(Debug) << "shard " << index_ << ": applied the update of " << m.sender
                        << " for round " << m.envelope.round;
    }
  }

  // ---- data-parallel mode (ALGORITHMS.md section 3) ----------------------------------------
  //
  // A worker's clock is the number of gradients it has pushed. Worker p pulls with its clock c in
  // Pull.min_version; the pull is answered when c - min_q c_q <= s (BSP: s = 0, ASP: always).
  // ASP and SSP apply each gradient as it completes; BSP buffers the n gradients of a step and
  // applies their sum in a fixed (worker id) order, so a run is bit-reproducible.

  struct PendingPull {
    PeerHandle peer;
    NodeId worker;
    Envelope envelope;
    transport::Pull pull;
  };

  std::uint64_t min_clock() const {
    if (clocks_.size() < workers_) return 0;
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (const auto& [w, c] : clocks_) m = std::min(m, c);
    return m;
  }

  void serve_pending_pulls(Endpoint& ep) {
    const std::uint64_t bound = consistency_ == "bsp" ? 0 : staleness_bound_;
    const bool asp = consistency_ == "asp";
    const std::uint64_t slowest = min_clock();
    for (auto it = pending_pulls_.begin(); it != pending_pulls_.end();) {
      const std::uint64_t clock = it->pull.min_version;
      if (asp || clock <= slowest + bound) {
        if (metrics_ != nullptr) {
          metrics_->write("dp_pull", {{"shard", std::uint64_t{index_}},
                                      {"worker", it->worker},
                                      {"clock", clock},
                                      {"min_clock", slowest},
                                      {"version", version_}});
        }
        Message m{it->peer, it->worker, it->envelope, 0, PooledBuffer{}, true};
        on_pull(ep, m, it->pull);
        it = pending_pulls_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Reassembles a pushed gradient (the chunks of one transfer), then applies it.
  void on_gradient_chunk(Endpoint& ep, Message& m, const transport::Push& p) {
    const std::string key = m.sender + "#" + std::to_string(m.envelope.seq);
    if (m.offset == 0) {
      std::string why;
      if (p.kind != transport::PushKind::kGradient) why = "this server runs data-parallel; send gradients";
      else if (p.encoding != transport::Encoding::kDenseF32) why = "unsupported encoding";
      else if (p.shard != index_ || p.begin != begin_ || p.end != end_) why = "wrong shard range";
      else if (m.envelope.payload_bytes != size() * sizeof(float)) why = "wrong gradient length";
      else if (p.clock != clocks_[m.sender]) why = "gradient for clock " + std::to_string(p.clock) +
                                                   ", expected " + std::to_string(clocks_[m.sender]);
      if (!why.empty()) {
        reply_ack(ep, m, false, why);
        if (!m.complete) rejected_transfers_.insert(key);
        return;
      }
      // A sender streams one gradient at a time: what is left of an earlier one was abandoned
      // (the client restarted mid-push), and would otherwise hold its memory for good.
      const std::string prefix = m.sender + "#";
      std::erase_if(streaming_, [&](const std::string& k) { return k.starts_with(prefix); });
      for (auto g = gradients_.begin(); g != gradients_.end();) {
        if (g->first.starts_with(prefix)) {
          spare_.push_back(std::move(g->second));
          g = gradients_.erase(g);
        } else {
          ++g;
        }
      }
      if (piecewise()) {
        streaming_.insert(key);
      } else {
        // Gradient buffers are reused: a fresh 64 MiB buffer per push would page-fault its way in.
        if (spare_.empty()) spare_.emplace_back(size());
        gradients_[key] = std::move(spare_.back());
        spare_.pop_back();
      }
    }
    if (rejected_transfers_.contains(key)) {
      if (m.complete) rejected_transfers_.erase(key);
      return;
    }
    if (piecewise()) {
      on_streamed_gradient_chunk(ep, m, key);
      return;
    }
    auto it = gradients_.find(key);
    if (it == gradients_.end()) return;
    const auto bytes = m.payload.span();
    if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0 ||
        m.offset + bytes.size() > it->second.bytes()) {
      gradients_.erase(it);
      reply_ack(ep, m, false, "misaligned chunk");
      return;
    }
    // Copied and checked for NaN/Inf in one pass, chunk by chunk, while the data is hot.
    const std::span<const float> values(reinterpret_cast<const float*>(bytes.data()),
                                        bytes.size() / sizeof(float));
    if (!kernels::copy_finite(values, it->second.span().subspan(m.offset / sizeof(float), values.size()))) {
      spare_.push_back(std::move(it->second));
      gradients_.erase(it);
      if (!m.complete) rejected_transfers_.insert(key);  // drop the rest of this transfer
      reply_ack(ep, m, false, "gradient has non-finite values");
      return;
    }
    if (!m.complete) return;
    FloatBuffer g = std::move(it->second);
    gradients_.erase(it);
    struct Recycle {  // hands the buffer back to spare_ on every path out
      std::vector<FloatBuffer>& spare;
      FloatBuffer& buf;
      ~Recycle() {
        if (!buf.empty()) spare.push_back(std::move(buf));
      }
    } recycle{spare_, g};
    const std::uint64_t clock = clocks_[m.sender]++;
    if (consistency_ == "bsp") {
      step_buffer_[clock][m.sender] = std::move(g);
      auto& step = step_buffer_[clock];
      if (step.size() >= workers_) {
        // The n gradients of this step, summed in worker-id order, applied once.
        if (delta_.size() != size()) delta_ = FloatBuffer(size());
        delta_.fill(0.0f);
        for (auto& [w, grad] : step) {
          for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] += grad[i];
          spare_.push_back(std::move(grad));
        }
        optimizer_->apply_gradient(params_.span(), delta_.span());
        ++version_;
        step_buffer_.erase(clock);
      }
    } else {
      optimizer_->apply_gradient(params_.span(), g.span());
      ++version_;
    }
    reply_ack(ep, m, true, "");
    serve_pending_pulls(ep);
  }

  // ASP and SSP with an elementwise optimizer apply a gradient as it streams in, chunk by chunk,
  // straight from the received bytes (in plaintext, the received frame itself, never copied):
  // each chunk is checked for NaN/Inf and applied while it is hot in cache, so the step costs one
  // pass over the gradient, overlaps the transfer, and needs O(chunk) memory per pushing worker
  // instead of a reassembly buffer each. A chunk is the unit of atomicity, as a key or partition
  // is in ps-lite and BytePS: a chunk with a non-finite value is refused with the rest of its push
  // (the worker gets a refusal and its clock does not advance), while the chunks before it stay
  // applied; the model never sees a non-finite value. Consistency is unchanged: ASP promises none
  // within a step, and SSP bounds complete steps, which the clocks count.
  bool piecewise() const { return consistency_ != "bsp" && optimizer_->elementwise(); }
  static constexpr std::size_t kApplyBlock = 4096;  // floats: 16 KiB, well inside L1 + L2

  void on_streamed_gradient_chunk(Endpoint& ep, Message& m, const std::string& key) {
    auto it = streaming_.find(key);
    if (it == streaming_.end()) return;
    const auto bytes = m.payload.span();
    if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0 ||
        m.offset + bytes.size() > size() * sizeof(float)) {
      streaming_.erase(it);
      if (!m.complete) rejected_transfers_.insert(key);
      reply_ack(ep, m, false, "misaligned chunk");
      return;
    }
    const std::span<const float> values(reinterpret_cast<const float*>(bytes.data()),
                                        bytes.size() / sizeof(float));
    // Checked and applied a block at a time, so the apply reads each block from L1 right after
    // the check brought it there: one pass over the received bytes, not two.
    if (m.offset == 0) optimizer_->begin_gradient_step();
    const std::size_t base = m.offset / sizeof(float);
    for (std::size_t at = 0; at < values.size(); at += kApplyBlock) {
      const auto block = values.subspan(at, std::min(kApplyBlock, values.size() - at));
      if (!kernels::all_finite(block)) {
        streaming_.erase(it);
        if (!m.complete) rejected_transfers_.insert(key);  // drop the rest of this transfer
        reply_ack(ep, m, false, "gradient has non-finite values");
        return;
      }
      optimizer_->apply_gradient_range(base + at, params_.span().subspan(base + at, block.size()), block);
    }
    m.payload = PooledBuffer{};  // the frame goes back now, while it is warm
    if (!m.complete) return;
    streaming_.erase(it);
    ++clocks_[m.sender];
    ++version_;
    reply_ack(ep, m, true, "");
    serve_pending_pulls(ep);
  }

  // ---- FedBuff (ALGORITHMS.md 1.6) ----------------------------------------------------------
  //
  // Deltas are folded in as they stream, weighted by s(tau) = 1/sqrt(1 + tau) where tau is the
  // staleness (versions since the client's pull); after K complete updates the model moves by
  // eta_g * (1/K) * sum and the version increments. Updates staler than server.max_staleness
  // (>= 0) are refused.
  void on_buffered_chunk(Endpoint& ep, Message& m, const transport::Push& p) {
    const std::string key = m.sender + "#" + std::to_string(m.envelope.seq);
    if (m.offset == 0) {
      const std::uint64_t tau = version_ >= p.base_version ? version_ - p.base_version : 0;
      std::string why;
      const auto format = wire_format(p.encoding);
      const bool compressed = p.encoding != transport::Encoding::kDenseF32;
      if (p.kind != transport::PushKind::kDelta) why = "this server runs FedBuff; send deltas";
      else if (!format) why = "unsupported encoding";
      else if (p.shard != index_ || p.begin != begin_ || p.end != end_) why = "wrong shard range";
      else if (!compressed && m.envelope.payload_bytes != size() * sizeof(float)) why = "wrong update length";
      else if (compressed && (p.elements != size() || m.envelope.payload_bytes == 0 ||
                              m.envelope.payload_bytes > aggregation::max_push_bytes(size())))
        why = "wrong update length";
      else if (p.base_version > version_) why = "update from a future version";
      else if (max_staleness_ >= 0 && tau > static_cast<std::uint64_t>(max_staleness_))
        why = "update too stale (" + std::to_string(tau) + " versions)";
      else if (buffered_tasks_.contains(key)) why = "duplicate update";
      if (!why.empty()) {
        reply_ack(ep, m, false, why);
        rejected_transfers_.insert(key);
        return;
      }
      if (buffer_sum_.size() != size()) buffer_sum_.assign(size(), 0.0);
      BufferedTask task;
      task.weight = 1.0 / std::sqrt(1.0 + static_cast<double>(tau));
      if (compressed) {
        if (spare_decoders_.empty()) spare_decoders_.push_back(std::make_unique<aggregation::PushDecoder>());
        task.decoder = std::move(spare_decoders_.back());
        spare_decoders_.pop_back();
        task.decoder->reset(size(), *format);
      }
      buffered_tasks_[key] = std::move(task);
    }
    if (rejected_transfers_.contains(key)) {
      if (m.complete) rejected_transfers_.erase(key);
      return;
    }
    auto it = buffered_tasks_.find(key);
    if (it == buffered_tasks_.end()) return;
    auto drop = [&](const std::string& reason) {
      if (it->second.decoder) spare_decoders_.push_back(std::move(it->second.decoder));
      buffered_tasks_.erase(it);
      reply_ack(ep, m, false, reason);
    };
    // An update folded in part and then refused stays folded in part, as for any streaming rule.
    const double w = it->second.weight;
    std::string why;
    auto fold = [&](std::size_t first, std::span<const float> v) {
      if (first > size() || v.size() > size() - first) {
        why = "chunk past the end of the range";
        return false;
      }
      for (float x : v) {
        if (!std::isfinite(x)) {
          why = "update has non-finite values";
          return false;
        }
      }
      for (std::size_t i = 0; i < v.size(); ++i) buffer_sum_[first + i] += w * static_cast<double>(v[i]);
      return true;
    };
    const auto bytes = m.payload.span();
    bool ok = true;
    try {
      if (it->second.decoder) {
        ok = it->second.decoder->feed(bytes, decode_scratch_, fold);
        if (ok && m.complete) it->second.decoder->finish();
      } else if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0) {
        why = "misaligned chunk";
        ok = false;
      } else {
        ok = fold(static_cast<std::size_t>(m.offset / sizeof(float)),
                  {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)});
      }
    } catch (const ProtocolError& e) {
      why = std::string("malformed compressed update: ") + e.what();
      ok = false;
    }
    if (!ok) {
      drop(why);
      return;
    }
    if (!m.complete) return;
    if (it->second.decoder) spare_decoders_.push_back(std::move(it->second.decoder));
    buffered_tasks_.erase(it);
    ++buffered_;
    reply_ack(ep, m, true, "");
    // The coordinator steps every shard together (prepare_round, close_round) once K updates
    // are in; a shard never steps on its own count, which could differ from another shard's.
  }

  ClientId client_id(const NodeId& id) {
    auto [it, fresh] = client_ids_.try_emplace(id, static_cast<ClientId>(client_ids_.size()));
    return it->second;
  }

  const Config& config_;
  const Registries& registries_;
  std::uint32_t index_, shards_;
  std::uint64_t begin_ = 0, end_ = 0;
  std::string model_spec_;
  FloatBuffer params_;
  FloatBuffer delta_;
  std::uint64_t version_ = 0;
  std::uint64_t committed_ = 0;
  std::uint64_t open_round_ = 0;
  std::uint64_t last_closed_ = 0;
  std::uint64_t selection_round_ = 0;  // the newest round the coordinator opened (RoundOpen)
  std::set<NodeId> selection_;         // who was selected for it
  std::unique_ptr<aggregation::Aggregator> aggregator_;
  std::unique_ptr<aggregation::ServerOptimizer> optimizer_;
  std::unordered_map<std::string, Transfer> transfers_;
  std::vector<std::unique_ptr<aggregation::PushDecoder>> spare_decoders_;
  std::vector<FloatBuffer> spare_updates_;
  std::vector<float> decode_scratch_;  // one decoded piece; grows once, reused by every push
  double dp_clip_ = 0, dp_noise_ = 0;
  std::uint64_t dp_seed_ = 0;
  std::set<NodeId> pushed_;
  std::set<NodeId> applied_;  // senders whose update of the open round is complete and accepted
  std::unordered_map<NodeId, ClientId> client_ids_;
  std::optional<CheckpointStore> store_;
  MetricsSink* metrics_ = nullptr;
  std::string mode_, consistency_;
  std::uint64_t staleness_bound_ = 0;
  std::size_t workers_ = 1, buffer_k_ = 10, buffered_ = 0;
  std::int64_t max_staleness_ = -1;
  std::map<NodeId, std::uint64_t> clocks_;
  std::deque<PendingPull> pending_pulls_;
  std::unordered_map<std::string, FloatBuffer> gradients_;
  std::set<std::string> streaming_;  // gradients being applied as they stream (piecewise())
  std::vector<FloatBuffer> spare_;
  std::map<std::uint64_t, std::map<NodeId, FloatBuffer>> step_buffer_;
  std::set<std::string> rejected_transfers_;
  struct BufferedTask {
    double weight = 1.0;                                // s(tau)
    std::unique_ptr<aggregation::PushDecoder> decoder;  // compressed pushes only
  };
  std::unordered_map<std::string, BufferedTask> buffered_tasks_;
  std::vector<double> buffer_sum_;
  std::vector<double> prepared_sum_;  // FedBuff: the step being prepared
  std::size_t prepared_count_ = 0;
  std::uint64_t prepared_round_ = 0;  // the round (FedBuff: step) prepare_round() answered for
  Prepared prepared_;
  std::string aggregator_name_;
  std::uint64_t coordinator_epoch_ = 0;  // of the coordinator that last welcomed this shard
};

// ---------------------------------------------------------------------------------------------
// The coordinator (shard 0): membership, the round state machine, evaluation and metrics.

class Coordinator {
 public:
  Coordinator(const Config& config, Shard& local, Endpoint& ep, const NodeId& name, MetricsSink& metrics)
      : config_(config), local_(local), ep_(ep), metrics_(metrics),
        rng_(static_cast<std::uint64_t>(config.get_int("server.seed"))) {
    shards_.resize(static_cast<std::size_t>(config.get_int("server.shards")));
    shards_[0] = {true, "", ep.url(), name, true};
    rounds_ = static_cast<std::uint64_t>(config.get_int("server.rounds"));
    per_round_ = static_cast<std::size_t>(config.get_int("server.clients_per_round"));
    min_clients_ = static_cast<std::size_t>(config.get_int("server.min_clients"));
    min_updates_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.min_updates")));
    max_failed_rounds_ =
        static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.get_int("server.max_failed_rounds")));
    deadline_ = std::chrono::milliseconds(config.get_int("server.round_deadline_ms"));
    eval_every_ = static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.get_int("server.eval_every")));
    overselect_ = config.get_double("server.overselect");
    weighted_ = config.get_string("server.selection") == "weighted";
    model_spec_ = config.get_string("model.spec");
    model_size_ = kernels::make_network_spec(model_spec_).parameter_count();
    round_ = local.last_closed();
    committed_ = local.version();
    mode_ = config.get_string("server.mode");
    if (mode_ == "dataparallel") rounds_ = 1;  // one long task per worker
    started_ = Clock::now();
    dp_noise_ = config.get_double("dp.noise_multiplier");
    dp_delta_ = config.get_double("dp.delta");
    buffer_k_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.buffer_size")));
    concurrency_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.concurrency")));
    rule_min_ = local.rule_min_updates();
    // A fresh epoch per coordinator process: shards tell a restart from a reconnect by it.
    std::random_device rd;
    epoch_ = ((std::uint64_t{rd()} << 32) ^ rd()) | 1;
  }

  [[nodiscard]] bool finished() const { return finished_; }
  // Why training stopped without finishing (give_up), or empty.
  [[nodiscard]] const std::string& failure() const { return failure_; }

  // Returns true if the message was the coordinator's.
  bool handle(Message& m) {
    if (auto* r = std::get_if<transport::Register>(&m.envelope.body)) {
      on_register(m, *r);
      return true;
    }
    if (auto* r = std::get_if<transport::ClientReport>(&m.envelope.body)) {
      touch(m);
      on_report(m, *r);
      return true;
    }
    if (auto* a = std::get_if<transport::PushAck>(&m.envelope.body)) {
      on_shard_ack(m, *a);
      return true;
    }
    if (std::holds_alternative<transport::Heartbeat>(m.envelope.body)) {
      touch(m);
      return true;
    }
    if (std::holds_alternative<transport::Bye>(m.envelope.body)) {
      clients_.erase(m.sender);
      return true;
    }
    return false;
  }

  void tick() {
    const auto now = Clock::now();
    if (finished_) return;
    if (state_ == State::kPreparing && now >= close_retry_) resend_prepare();
    if (state_ == State::kClosing && now >= close_retry_) resend_close();
    flush_lines(now);
    if (mode_ == "dataparallel") {
      tick_dataparallel(now);
      return;
    }
    if (mode_ == "fedbuff") {
      tick_fedbuff(now);
      return;
    }
    // Two passes: a round that closes here (every shard acknowledged at once: a single shard)
    // leaves the coordinator idle, and the next round starts now, not at the next message or
    // poll timeout (50 ms of nothing between rounds otherwise).
    for (int pass = 0; pass < 2; ++pass) {
      if (state_ == State::kIdle && all_shards_up() && committed_ >= rounds_) {
        finish();
        return;
      }
      if (state_ == State::kIdle && all_shards_up() && live_clients() >= min_clients_) start_round();
      if (state_ != State::kRunning) break;
      const std::size_t done = completed_.size();
      const bool enough = done >= per_round_;
      const bool all_reported = reported_ >= selected_.size();
      if (!(enough || all_reported || now >= round_deadline_)) break;
      if (done < min_updates_ || done < rule_min_) {
        const bool rule = done >= min_updates_;
        round_failed(std::to_string(done) + " complete update(s), fewer than " +
                     (rule ? "aggregator '" + local_.rule_name() + "' needs (" + std::to_string(rule_min_) + ")"
                           : "server.min_updates = " + std::to_string(min_updates_)));
        if (finished_) return;
        close_round(false);
      } else {
        // Phase one: every shard's rule computes its aggregate; the round commits only if all could.
        prepare_close(round_, done);
      }
      if (state_ != State::kIdle) break;
    }
    // Clients silent for too long leave the pool (their reconnect re-registers them). The sweep
    // walks every client, so it runs at most every 100 ms, not after every message.
    const auto timeout = std::chrono::milliseconds(config_.get_int("server.client_timeout_ms"));
    const bool sweep = now >= next_sweep_;
    if (sweep) next_sweep_ = now + 100ms;
    for (auto it = clients_.begin(); sweep && it != clients_.end();) {
      if (now - it->second.last_seen > timeout && !selected_.contains(it->first)) {
        COHORT_LOG(Info) << "client " << it->first << " timed out";
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Sent in every Welcome: shards compare it to tell a restarted coordinator from a reconnect.
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }

 private:
  // kPreparing: phase one of a close (every shard computes its aggregate); kClosing: phase two
  // (every shard commits or discards).
  enum class State { kIdle, kRunning, kPreparing, kClosing };
  struct ClientInfo {
    PeerHandle peer;
    std::uint64_t dataset_size = 0;
    Clock::time_point last_seen;
    std::uint32_t index = 0;
    // False once a send to `peer` found the connection gone: the client sits out rounds (and does
    // not count towards server.min_clients) until it is heard from again, which after a
    // reconnect is its registration on the new session.
    bool reachable = true;
  };
  struct ShardInfo {
    bool up = false;
    PeerHandle peer;
    std::string url;
    NodeId node_id;
    bool closed = false;
    bool prepared = false;  // answered this close's phase one
  };

  void touch(const Message& m) {
    auto it = clients_.find(m.sender);
    if (it != clients_.end()) {
      it->second.last_seen = Clock::now();
      it->second.peer = m.peer;
      it->second.reachable = true;
    }
  }

  [[nodiscard]] bool all_shards_up() const {
    return std::all_of(shards_.begin(), shards_.end(), [](const ShardInfo& s) { return s.up; });
  }
  [[nodiscard]] std::size_t live_clients() const {
    return static_cast<std::size_t>(std::count_if(clients_.begin(), clients_.end(),
                                                  [](const auto& c) { return c.second.reachable; }));
  }

  transport::Welcome welcome(std::uint32_t index) const {
    transport::Welcome w;
    w.client_index = index;
    w.model_size = model_size_;
    w.model_spec = model_spec_;
    w.heartbeat_ms = static_cast<std::uint32_t>(config_.get_int("server.heartbeat_ms"));
    for (std::uint32_t i = 0; i < shards_.size(); ++i) {
      auto [b, e] = shard_range(model_size_, static_cast<std::uint32_t>(shards_.size()), i);
      w.shards.push_back({i, shards_[i].url, shards_[i].node_id, b, e});
    }
    // Client-side training options travel as TOML, from the server's [train] section.
    std::ostringstream toml;
    for (const auto& name : config_.section("train").names()) {
      toml << name << " = " << to_string_value(config_.section("train"), name) << '\n';
    }
    w.training_toml = toml.str();
    w.coordinator_epoch = epoch_;
    w.current_round = committed_round();
    return w;
  }

  static std::string to_string_value(const ConfigSection& s, const std::string& name) {
    // Values keep their types: strings quoted, numbers and bools bare.
    const std::string text = s.get_string(name, "");
    try {
      (void)s.get_bool(name, false);
      return text;
    } catch (const ConfigError&) {
    }
    try {
      (void)s.get_double(name, 0);
      return text;
    } catch (const ConfigError&) {
    }
    std::string quoted = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return quoted + "\"";
  }

  void on_register(const Message& m, const transport::Register& r) {
    if (r.role == transport::Role::kShard) {
      if (r.shard_index == 0 || r.shard_index >= shards_.size()) {
        reply_error(m, "no shard " + std::to_string(r.shard_index) + " in a federation of " +
                           std::to_string(shards_.size()));
        return;
      }
      auto& s = shards_[r.shard_index];
      const bool again = s.up;
      s = {true, m.peer, r.listen_url, m.sender, false};
      COHORT_LOG(Info) << (again ? "shard re-registered: " : "shard registered: ") << m.sender
                       << " at " << r.listen_url;
      Envelope e;
      e.body = welcome(r.shard_index);
      ep_.send(m.peer, std::move(e));
      // A shard that restarted mid-round learns the running round's selection again.
      if (state_ == State::kRunning && mode_ == "federated") send_round_open(r.shard_index);
      if (state_ == State::kPreparing) resend_prepare();
      if (state_ == State::kClosing) resend_close();
      return;
    }
    if (r.role != transport::Role::kClient) {
      reply_error(m, "only clients and shards may register");
      return;
    }
    if (!all_shards_up()) {
      // Not yet: the client retries its registration until the shard map is complete.
      reply_error(m, "waiting for all shards to start");
      return;
    }
    auto [it, fresh] = clients_.try_emplace(m.sender);
    it->second.peer = m.peer;
    it->second.dataset_size = r.dataset_size;
    it->second.last_seen = Clock::now();
    it->second.reachable = true;
    if (fresh) it->second.index = next_client_index_++;
    COHORT_LOG(Info) << "client " << (fresh ? "registered: " : "re-registered: ") << m.sender
                     << " (" << r.dataset_size << " samples, " << r.device << ", " << clients_.size()
                     << " clients)";
    Envelope e;
    e.body = welcome(it->second.index);
    ep_.send(m.peer, std::move(e));
  }

  // Tells shard i (0: our own) who was selected for the running round, in batches of
  // kRoundOpenBatch ids.
  void send_round_open(std::size_t i) {
    if (i == 0) {
      local_.open_round(round_, round_selection_);
      return;
    }
    auto& s = shards_[i];
    std::size_t at = 0;
    do {
      const std::size_t end = std::min(round_selection_.size(), at + transport::kRoundOpenBatch);
      Envelope e;
      e.round = round_;
      e.body = transport::RoundOpen{round_, {round_selection_.begin() + static_cast<std::ptrdiff_t>(at),
                                             round_selection_.begin() + static_cast<std::ptrdiff_t>(end)}};
      if (!s.up || !ep_.send(s.peer, std::move(e))) {
        s.up = false;
        return;
      }
      at = end;
    } while (at < round_selection_.size());
  }

  void reply_error(const Message& m, std::string why) {
    Envelope e;
    e.body = transport::ErrorBody{transport::ErrorCode::kUnknownNode, std::move(why), m.envelope.seq};
    ep_.send(m.peer, std::move(e));
  }

  std::vector<NodeId> select() {
    std::vector<NodeId> pool;
    std::vector<double> weights;
    for (const auto& [id, c] : clients_) {
      if (!c.reachable) continue;
      pool.push_back(id);
      weights.push_back(static_cast<double>(std::max<std::uint64_t>(c.dataset_size, 1)));
    }
    std::size_t want = static_cast<std::size_t>(std::ceil(static_cast<double>(per_round_) * overselect_));
    want = std::min(std::max<std::size_t>(want, 1), pool.size());
    std::vector<NodeId> out;
    // Sampling without replacement; weighted by data size when asked.
    for (std::size_t k = 0; k < want; ++k) {
      std::size_t pick = 0;
      if (weighted_) {
        std::discrete_distribution<std::size_t> d(weights.begin(), weights.end());
        pick = d(rng_);
      } else {
        pick = std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(rng_);
      }
      out.push_back(pool[pick]);
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
      weights.erase(weights.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void start_round() {
    ++round_;
    selected_.clear();
    completed_.clear();
    reported_ = 0;
    reporters_.clear();
    round_loss_ = 0;
    round_samples_ = 0;
    round_bytes_ = 0;
    round_uplink_ = 0;
    round_train_s_ = 0;
    round_comm_s_ = 0;
    round_started_ = Clock::now();
    round_deadline_ = round_started_ + deadline_;
    const auto chosen = select();
    // The accountant's rate q: a fixed-size cohort of m of N clients, accounted as Poisson
    // sampling with q = m / N (exact when q = 1; see dp.noise_multiplier's help).
    const std::size_t live = live_clients();
    round_sampling_rate_ = live == 0 ? 1.0 : static_cast<double>(chosen.size()) / static_cast<double>(live);
    transport::RoundStart rs;
    rs.round = round_;
    rs.deadline_ms = static_cast<std::uint64_t>(deadline_.count());
    rs.local_epochs = static_cast<std::uint32_t>(config_.section("train").get_int("epochs", 1));
    rs.local_steps = static_cast<std::uint32_t>(config_.section("train").get_int("steps", 0));
    rs.model_version = local_.version();
    // Every shard learns the selection before any client does: a shard takes this round's pushes
    // only from these clients.
    round_selection_ = chosen;
    for (std::size_t i = 0; i < shards_.size(); ++i) send_round_open(i);
    for (const auto& id : chosen) {
      Envelope e;
      e.round = round_;
      e.body = rs;
      auto& c = clients_.at(id);
      if (ep_.send(c.peer, std::move(e))) {
        selected_.insert(id);
      } else {
        c.reachable = false;
        COHORT_LOG(Info) << "client " << id << " is unreachable (its connection is gone): out of the "
                         << "pool until it registers again";
      }
    }
    state_ = State::kRunning;
    COHORT_LOG(Debug) << "round " << round_ << " started with " << selected_.size() << " clients";
  }

  // ---- data-parallel: one long task per worker; the shards enforce the consistency model ----
  void tick_dataparallel(Clock::time_point now) {
    if (state_ == State::kIdle && !dp_started_ && all_shards_up() && live_clients() >= min_clients_) {
      dp_started_ = true;
      round_ = 1;
      round_started_ = now;
      round_deadline_ = now + deadline_;
      transport::RoundStart rs;
      rs.round = round_;
      rs.deadline_ms = static_cast<std::uint64_t>(deadline_.count());
      rs.local_steps = static_cast<std::uint32_t>(config_.get_int("server.steps"));
      rs.batch_size = static_cast<std::uint32_t>(config_.section("train").get_int("batch_size", 64));
      rs.mode = transport::TrainingMode::kDataParallel;
      std::size_t n = 0;
      for (const auto& [id, c] : clients_) {  // the first `clients_per_round` workers by name
        if (n++ >= per_round_) break;
        Envelope e;
        e.round = round_;
        e.body = rs;
        if (ep_.send(c.peer, std::move(e))) selected_.insert(id);
      }
      state_ = State::kRunning;
      COHORT_LOG(Info) << "data-parallel training (" << config_.get_string("server.consistency")
                       << ") started with " << selected_.size() << " workers";
    }
    if (state_ == State::kRunning && (reported_ >= selected_.size() || now >= round_deadline_)) {
      committed_ = rounds_;
      state_ = State::kIdle;
      last_round_s_ = std::chrono::duration<double>(now - round_started_).count();
      queue_line(round_, current_record());
    }
    if (state_ == State::kIdle && dp_started_) finish();
  }

  // ---- FedBuff: keep `concurrency` clients busy; every K updates all shards step together ----
  //
  // A shard buffers the updates it accepts; the coordinator counts them on its own shard and, at
  // K, closes a step in two phases like a round: every shard sets its buffer aside (prepare),
  // then all apply it (commit), or, if one shard holds nothing, all put it back (abort). Tasks
  // are issued while no step is closing, so a task pulls a model every shard agrees on, and only
  // as many as the remaining steps still need: K x steps left, less what is buffered and in
  // flight. The count comes from the shard itself, never from reports, which may arrive after
  // the step that took their update.
  void tick_fedbuff(Clock::time_point now) {
    if (!all_shards_up()) return;
    if (!fb_started_) {
      if (live_clients() < min_clients_) return;
      fb_started_ = true;
      round_started_ = now;
    }
    for (auto it = busy_.begin(); it != busy_.end();) {  // a task past its deadline is given up
      it = now > it->second ? busy_.erase(it) : std::next(it);
    }
    if (state_ != State::kIdle) return;
    if (committed_ >= rounds_) {
      finish();
      return;
    }
    const std::size_t want = static_cast<std::size_t>(rounds_ - committed_) * buffer_k_;
    // Starved: a step was not ready (another shard holds fewer updates than this one, which
    // took fewer into the last step) and nothing is in flight to fill it: one more task.
    const bool starved = fb_short_ && busy_.empty();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      if (busy_.size() >= concurrency_) break;
      if (starved ? !busy_.empty() : local_.buffered() + busy_.size() >= want) break;
      if (busy_.contains(it->first) || !it->second.reachable) continue;
      transport::RoundStart rs;
      rs.round = ++round_;
      rs.deadline_ms = static_cast<std::uint64_t>(deadline_.count());
      rs.local_epochs = static_cast<std::uint32_t>(config_.section("train").get_int("epochs", 1));
      rs.local_steps = static_cast<std::uint32_t>(config_.section("train").get_int("steps", 0));
      rs.model_version = local_.version();
      rs.mode = transport::TrainingMode::kBuffered;
      Envelope e;
      e.round = rs.round;
      e.body = rs;
      if (ep_.send(it->second.peer, std::move(e))) {
        busy_[it->first] = now + deadline_;
      } else {
        it->second.reachable = false;
      }
    }
    if (local_.buffered() >= buffer_k_ && now >= fb_retry_) prepare_close(committed_ + 1, 0);
  }

  void on_report(const Message& m, const transport::ClientReport& r) {
    if (r.fatal) {
      // The client stops for good: say who and why now, not after deadlines run out.
      COHORT_LOG(Error) << "client " << m.sender << " stopped with an error: " << r.message;
      last_refusal_ = m.sender + " stopped: " + r.message.substr(0, 200);
      if (state_ == State::kRunning && mode_ == "federated" && r.round == round_ &&
          selected_.contains(m.sender) && reporters_.insert(m.sender).second) {
        ++reported_;
      }
      busy_.erase(m.sender);
      clients_.erase(m.sender);
      return;
    }
    if (mode_ == "fedbuff" && !r.evaluated) {
      busy_.erase(m.sender);
      if (!r.trained) {
        COHORT_LOG(Info) << "client " << m.sender << ": " << r.message;
        last_refusal_ = m.sender + ": " + r.message.substr(0, 200);
        return;
      }
      // A report may arrive after the step that averaged its update: it goes to the oldest
      // committed step still short of reports, else it waits for the next step.
      const Report report{static_cast<double>(r.train_loss) * static_cast<double>(r.num_samples),
                          r.num_samples, static_cast<double>(r.bytes_sent + r.bytes_received),
                          static_cast<double>(r.bytes_sent), static_cast<double>(r.train_seconds),
                          static_cast<double>(r.comm_seconds)};
      auto line = std::find_if(lines_.begin(), lines_.end(),
                               [](const Line& l) { return l.reports < l.record.clients; });
      if (line != lines_.end()) {
        line->add(report);
        flush_lines(Clock::now());
      } else {
        fb_reports_.push_back(report);
      }
      return;
    }
    if (r.evaluated) {
      for (auto& line : lines_) {
        if (line.waiting && line.eval_id == r.round) {
          line.waiting = false;
          line.eval = r;
        }
      }
      flush_lines(Clock::now());
      return;
    }
    if (state_ != State::kRunning || r.round != round_ || !selected_.contains(m.sender)) return;
    // A client resends its report after a reconnect, not knowing whether it arrived: count once.
    if (!reporters_.insert(m.sender).second) return;
    ++reported_;
    round_bytes_ += static_cast<double>(r.bytes_sent + r.bytes_received);
    round_uplink_ += static_cast<double>(r.bytes_sent);
    if (!r.trained) {
      COHORT_LOG(Info) << "client " << m.sender << " did not finish round " << r.round << ": "
                       << r.message;
      last_refusal_ = m.sender + ": " + r.message.substr(0, 200);
      return;
    }
    completed_.insert(m.sender);
    round_loss_ += static_cast<double>(r.train_loss) * static_cast<double>(r.num_samples);
    round_samples_ += r.num_samples;
    round_train_s_ = std::max(round_train_s_, static_cast<double>(r.train_seconds));
    round_comm_s_ = std::max(round_comm_s_, static_cast<double>(r.comm_seconds));
  }

  // The last round (FedBuff: step) the coordinator's own shard closed.
  [[nodiscard]] std::uint64_t committed_round() const { return local_.last_closed(); }

  // ---- closing a round (FedBuff: a step) on every shard, in two phases ----------------------
  //
  // Phase one (kPreparing): each shard's rule computes its range's aggregate and answers whether
  // it could. Phase two (kClosing): every shard commits, if all could, or discards. A robust rule
  // that refuses on one shard thus fails the round everywhere, and the round is logged and
  // recorded as failed, never counted as committed.
  void prepare_close(std::uint64_t round, std::size_t updates) {
    state_ = State::kPreparing;
    closing_round_ = round;
    closing_updates_ = updates;
    prepare_failure_.clear();
    for (std::size_t i = 1; i < shards_.size(); ++i) shards_[i].prepared = false;
    const auto local = local_.prepare_round(round);
    if (!local.ok) prepare_failure_ = local.reason;
    if (mode_ == "fedbuff") step_updates_ = local_.prepared_count();
    resend_prepare();
  }

  // Sends `close` to every shard but 0 that has not answered it yet (`answered`); the retry
  // comes 2 s later. True when every shard has answered.
  bool send_round_close(bool ShardInfo::*answered, const transport::RoundClose& close) {
    close_retry_ = Clock::now() + 2s;
    bool all = true;
    for (std::size_t i = 1; i < shards_.size(); ++i) {
      auto& s = shards_[i];
      if (s.*answered) continue;
      all = false;
      if (!s.up) continue;
      Envelope e;
      e.round = close.round;
      e.body = close;
      if (!ep_.send(s.peer, std::move(e))) s.up = false;
    }
    return all;
  }

  void resend_prepare() {
    const transport::RoundClose prepare{closing_round_, true, static_cast<std::uint32_t>(closing_updates_), true};
    if (send_round_close(&ShardInfo::prepared, prepare)) prepared_everywhere();
  }

  void prepared_everywhere() {
    if (state_ != State::kPreparing) return;
    if (prepare_failure_.empty()) {
      close_round(true);
      return;
    }
    if (mode_ == "fedbuff") {
      // Another shard's K-th update is still on its way: not a failure, ask again shortly.
      COHORT_LOG(Debug) << "step " << closing_round_ << " not ready: " << prepare_failure_;
      fb_retry_ = Clock::now() + 20ms;
      fb_short_ = true;
      close_round(false);
      return;
    }
    round_failed(prepare_failure_);
    if (finished_) return;
    close_round(false);
  }

  // A round (FedBuff: step) that does not commit: logged, recorded, and counted towards
  // server.max_failed_rounds.
  void round_failed(const std::string& why) {
    ++failed_in_a_row_;
    last_failure_ = why;
    const std::uint64_t id = mode_ == "fedbuff" ? committed_ + 1 : round_;
    COHORT_LOG(Warn) << (mode_ == "fedbuff" ? "step " : "round ") << id << " failed: " << why
                     << (mode_ == "fedbuff" ? "; its updates stay buffered" : "; discarded, retrying");
    metrics_.write("round_failed", {{"round_id", id},
                                    {"committed", committed_},
                                    {"clients", static_cast<std::uint64_t>(completed_.size())},
                                    {"selected", static_cast<std::uint64_t>(selected_.size())},
                                    {"reason", why}});
    if (max_failed_rounds_ > 0 && failed_in_a_row_ >= max_failed_rounds_) give_up();
  }

  void close_round(bool commit) {
    state_ = State::kClosing;
    closing_commit_ = commit;
    for (std::size_t i = 1; i < shards_.size(); ++i) shards_[i].closed = false;
    local_.close_round(closing_round_, commit);
    resend_close();
  }

  void resend_close() {
    const transport::RoundClose close{closing_round_, closing_commit_,
                                      static_cast<std::uint32_t>(completed_.size()), false};
    if (send_round_close(&ShardInfo::closed, close)) round_closed();
  }

  void on_shard_ack(const Message& m, const transport::PushAck& a) {
    if (m.envelope.round != closing_round_) return;
    const bool preparing = a.prepared;
    if (preparing ? state_ != State::kPreparing : state_ != State::kClosing) return;
    for (std::size_t i = 1; i < shards_.size(); ++i) {
      if (shards_[i].node_id != m.sender) continue;
      if (preparing) {
        if (shards_[i].prepared) return;
        shards_[i].prepared = true;
        if (!a.accepted && prepare_failure_.empty()) prepare_failure_ = a.reason;
      } else {
        shards_[i].closed = true;
      }
    }
    if (preparing) {
      if (std::all_of(shards_.begin() + 1, shards_.end(), [](const ShardInfo& s) { return s.prepared; })) {
        prepared_everywhere();
      }
    } else if (std::all_of(shards_.begin() + 1, shards_.end(), [](const ShardInfo& s) { return s.closed; })) {
      round_closed();
    }
  }

  void round_closed() {
    if (state_ != State::kClosing) return;
    state_ = State::kIdle;
    if (!closing_commit_) return;
    failed_in_a_row_ = 0;
    fb_short_ = false;
    ++committed_;
    const auto now = Clock::now();
    last_round_s_ = std::chrono::duration<double>(now - round_started_).count();
    RoundRecord record = mode_ == "fedbuff" ? RoundRecord{} : current_record();
    if (mode_ == "fedbuff") {
      record.clients = step_updates_;  // the updates this step averaged (on shard 0)
      record.round_s = last_round_s_;
      round_started_ = now;
    }
    if (dp_noise_ > 0) {
      accountant_.add_steps(std::min(round_sampling_rate_, 1.0), dp_noise_, 1);
      record.epsilon = accountant_.epsilon(dp_delta_).epsilon;
    }
    queue_line(mode_ == "fedbuff" ? committed_ : round_, record);
  }

  // A trained FedBuff task's report, kept until a step's line takes it.
  struct Report {
    double loss_sum = 0;  // train loss x samples
    std::uint64_t samples = 0;
    double bytes = 0, uplink = 0, train_s = 0, comm_s = 0;
  };

  // ---- progress lines and metrics: one per committed round (FedBuff: step), in order --------
  //
  // Every eval_every rounds and after the last, the new model is evaluated on one client's copy
  // of the test set; the line waits for that result (or its deadline) while later rounds go on
  // and queue behind it, so no round's line is lost or merged into another's.
  struct RoundRecord {
    std::size_t clients = 0, selected = 0;
    double train_loss = 0, bytes = 0, train_s = 0, comm_s = 0, round_s = 0;
    double uplink = 0;    // payload bytes the clients sent (compressed pushes count as sent)
    double epsilon = -1;  // DP: epsilon at dp.delta after this round; < 0 when DP is off
  };
  struct Line {
    std::uint64_t round_id = 0;   // federated: the round's id; FedBuff: the step
    std::uint64_t committed = 0;  // rounds (steps) committed with this one
    RoundRecord record;
    double sampling_rate = 1.0;
    bool waiting = false;         // for an evaluation
    std::uint64_t eval_id = 0;    // the RoundStart.round of the evaluation asked for
    Clock::time_point eval_deadline;
    std::optional<transport::ClientReport> eval;
    // FedBuff: the reports of the updates this step averaged (record.clients of them), which
    // may come in after the step; the line waits for them until `reports_deadline`.
    std::size_t reports = 0;
    double loss_sum = 0;
    std::uint64_t samples = 0;
    Clock::time_point reports_deadline;
    void add(const Report& r) {
      ++reports;
      loss_sum += r.loss_sum;
      samples += r.samples;
      record.bytes += r.bytes;
      record.uplink += r.uplink;
      record.train_s = std::max(record.train_s, r.train_s);
      record.comm_s = std::max(record.comm_s, r.comm_s);
      record.selected = reports;
      record.train_loss = samples ? loss_sum / static_cast<double>(samples) : 0;
    }
    [[nodiscard]] bool ready(Clock::time_point now) const {
      return (!waiting || now > eval_deadline) && (reports >= record.clients || now > reports_deadline);
    }
  };

  RoundRecord current_record() const {
    RoundRecord r;
    r.clients = completed_.size();
    r.selected = selected_.size();
    r.train_loss = round_samples_ ? round_loss_ / static_cast<double>(round_samples_) : 0;
    r.bytes = round_bytes_;
    r.uplink = round_uplink_;
    r.train_s = round_train_s_;
    r.comm_s = round_comm_s_;
    r.round_s = last_round_s_;
    return r;
  }

  void queue_line(std::uint64_t round_id, const RoundRecord& record) {
    Line line;
    line.round_id = round_id;
    line.committed = committed_;
    line.record = record;
    line.sampling_rate = round_sampling_rate_;
    if (mode_ == "fedbuff") {
      while (line.reports < line.record.clients && !fb_reports_.empty()) {
        line.add(fb_reports_.front());
        fb_reports_.pop_front();
      }
      line.reports_deadline = Clock::now() + deadline_;
    } else {
      line.reports = line.record.clients;  // a federated round's reports are all in
    }
    const bool eval = eval_every_ > 0 && (committed_ % eval_every_ == 0 || committed_ >= rounds_);
    // The first reachable client from the cursor on; one whose connection proves gone is skipped.
    for (std::size_t tries = 0; eval && tries < clients_.size(); ++tries) {
      auto it = clients_.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(eval_cursor_++ % clients_.size()));
      if (!it->second.reachable) continue;
      transport::RoundStart rs;
      // FedBuff's task ids and evaluations share one sequence, so a report names what it answers.
      rs.round = mode_ == "fedbuff" ? ++round_ : round_;
      rs.deadline_ms = static_cast<std::uint64_t>(deadline_.count());
      // Data-parallel shards read Pull.min_version as the worker's clock: an evaluation is not one.
      rs.model_version = mode_ == "dataparallel" ? 0 : local_.version();
      rs.evaluate_only = true;
      Envelope e;
      e.round = rs.round;
      e.body = rs;
      if (ep_.send(it->second.peer, std::move(e))) {
        line.waiting = true;
        line.eval_id = rs.round;
        line.eval_deadline = Clock::now() + deadline_;
        break;
      }
      it->second.reachable = false;
    }
    lines_.push_back(std::move(line));
    flush_lines(Clock::now());
  }

  // Prints the lines at the head of the queue whose evaluation is in or overdue.
  void flush_lines(Clock::time_point now) {
    while (!lines_.empty()) {
      Line& line = lines_.front();
      if (!line.ready(now)) break;
      print_round(line);
      lines_.pop_front();
    }
  }

  void print_round(const Line& line) {
    const RoundRecord& r = line.record;
    const auto& eval = line.eval;
    total_bytes_ += r.bytes;
    total_uplink_ += r.uplink;
    const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
    const std::uint64_t done = line.committed;
    const double eta = done > 0 ? elapsed / static_cast<double>(done) *
                                      static_cast<double>(rounds_ - std::min(done, rounds_))
                                : 0;
    char line_text[512];
    char dp[48] = "";
    if (r.epsilon >= 0) std::snprintf(dp, sizeof dp, " | DP eps %.3g (delta %.0e)", r.epsilon, dp_delta_);
    std::snprintf(line_text, sizeof line_text,
                  "%s %3llu/%llu | %s %zu/%zu | train loss %.4f | test loss %s | "
                  "accuracy %s | %s (up %s) | %.1fs (train %.1fs, comm %.1fs)%s | ETA %.0fs",
                  mode_ == "fedbuff" ? "step " : "round", static_cast<unsigned long long>(done),
                  static_cast<unsigned long long>(rounds_),
                  mode_ == "fedbuff" ? "updates" : "clients", r.clients, r.selected, r.train_loss,
                  eval ? std::to_string(eval->eval_loss).substr(0, 6).c_str() : "-",
                  eval ? (std::to_string(eval->eval_accuracy * 100).substr(0, 5) + "%").c_str() : "-",
                  human_bytes(r.bytes).c_str(), human_bytes(r.uplink).c_str(), r.round_s, r.train_s,
                  r.comm_s, dp, eta);
    std::printf("%s\n", line_text);
    std::fflush(stdout);
    std::vector<MetricField> f{{"round", done},
                               {"round_id", line.round_id},
                               {"clients", static_cast<std::uint64_t>(r.clients)},
                               {"selected", static_cast<std::uint64_t>(r.selected)},
                               {"train_loss", r.train_loss},
                               {"bytes", r.bytes},
                               {"total_bytes", total_bytes_},
                               {"uplink_bytes", r.uplink},
                               {"total_uplink_bytes", total_uplink_},
                               {"round_seconds", r.round_s},
                               {"train_seconds", r.train_s},
                               {"comm_seconds", r.comm_s},
                               {"wall_seconds", elapsed}};
    if (eval) {
      f.push_back({"test_loss", static_cast<double>(eval->eval_loss)});
      f.push_back({"test_accuracy", static_cast<double>(eval->eval_accuracy)});
      f.push_back({"test_count", eval->eval_count});
      last_accuracy_ = eval->eval_accuracy;
    }
    if (r.epsilon >= 0) {
      f.push_back({"dp_epsilon", r.epsilon});
      f.push_back({"dp_delta", dp_delta_});
      f.push_back({"dp_noise_multiplier", dp_noise_});
      f.push_back({"dp_sampling_rate", line.sampling_rate});
    }
    metrics_.write("round", f);
  }

  // After server.max_failed_rounds failed rounds (steps) in a row: the clients and shards are
  // told goodbye, and run() throws TrainingError with the reason.
  void give_up() {
    std::string why = std::to_string(failed_in_a_row_) + (mode_ == "fedbuff" ? " steps" : " rounds") +
                      " in a row failed (server.max_failed_rounds); the last: " + last_failure_ +
                      "; the last client refusal: " +
                      (last_refusal_.empty() ? std::string("none reported") : last_refusal_);
    if (last_refusal_.find("non-finite") != std::string::npos) {
      why += ". Non-finite updates usually mean a learning rate too high for the model.";
    }
    failure_ = why;
    COHORT_LOG(Error) << "training stopped: " << failure_;
    for (auto& line : lines_) {
      line.waiting = false;
      line.reports_deadline = Clock::now();
    }
    flush_lines(Clock::now());
    finish("training failed");
  }

  void finish(const char* why = "training finished") {
    flush_lines(Clock::now());
    if (!lines_.empty()) return;  // let the last evaluations arrive (or time out) first
    finished_ = true;
    COHORT_LOG(Info) << "training finished: " << committed_ << (mode_ == "fedbuff" ? " steps" : " rounds")
                     << " in " << std::chrono::duration<double>(Clock::now() - started_).count() << " s";
    for (auto& [id, c] : clients_) {
      Envelope e;
      e.body = transport::Bye{why};
      ep_.send(c.peer, std::move(e));
    }
    for (std::size_t i = 1; i < shards_.size(); ++i) {
      if (!shards_[i].up) continue;
      Envelope e;
      e.body = transport::Bye{why};
      ep_.send(shards_[i].peer, std::move(e));
    }
    metrics_.write("done", {{"rounds", committed_},
                            {"final_accuracy", static_cast<double>(last_accuracy_)},
                            {"total_uplink_bytes", total_uplink_},
                            {"wall_seconds",
                             std::chrono::duration<double>(Clock::now() - started_).count()}});
  }

  const Config& config_;
  Shard& local_;
  Endpoint& ep_;
  MetricsSink& metrics_;
  std::mt19937_64 rng_;
  std::vector<ShardInfo> shards_;
  std::map<NodeId, ClientInfo> clients_;
  std::uint32_t next_client_index_ = 0;
  std::string model_spec_;
  std::uint64_t model_size_ = 0;
  std::uint64_t rounds_ = 0, round_ = 0, committed_ = 0, eval_every_ = 1;
  std::size_t per_round_ = 0, min_clients_ = 1, min_updates_ = 1, rule_min_ = 1;
  std::uint64_t failed_in_a_row_ = 0, max_failed_rounds_ = 10;
  std::string last_refusal_, last_failure_, failure_;
  double overselect_ = 1.0;
  bool weighted_ = false;
  std::chrono::milliseconds deadline_{60000};
  State state_ = State::kIdle;
  std::uint64_t epoch_ = 0;
  std::uint64_t closing_round_ = 0;  // the round (FedBuff: step) being prepared or closed
  std::size_t closing_updates_ = 0;
  std::string prepare_failure_;      // the first shard's reason its rule could not aggregate
  bool closing_commit_ = false;
  Clock::time_point close_retry_;
  std::set<NodeId> selected_, completed_;
  std::vector<NodeId> round_selection_;  // the running round's cohort, as sent to the shards
  std::size_t reported_ = 0;
  std::set<NodeId> reporters_;  // who has reported in the running federated round
  double round_loss_ = 0, round_bytes_ = 0, round_train_s_ = 0, round_comm_s_ = 0;
  std::uint64_t round_samples_ = 0;
  double last_round_s_ = 0, total_bytes_ = 0;
  double round_uplink_ = 0, total_uplink_ = 0;
  double dp_noise_ = 0, dp_delta_ = 1e-5, round_sampling_rate_ = 1.0;
  aggregation::RdpAccountant accountant_;
  float last_accuracy_ = 0;
  Clock::time_point started_, round_started_, round_deadline_;
  std::deque<Line> lines_;  // committed rounds not yet printed, oldest first
  std::size_t eval_cursor_ = 0;
  bool finished_ = false;
  std::string mode_;
  bool dp_started_ = false, fb_started_ = false;
  std::size_t buffer_k_ = 10, concurrency_ = 10;
  std::size_t step_updates_ = 0;  // FedBuff: updates in the step being closed (shard 0's count)
  Clock::time_point fb_retry_;    // FedBuff: no new step before this after one not ready
  bool fb_short_ = false;         // FedBuff: a step was not ready since the last commit
  std::map<NodeId, Clock::time_point> busy_;
  std::deque<Report> fb_reports_;  // FedBuff: reports no step's line has taken yet
  Clock::time_point next_sweep_;  // of timed-out clients
};

transport::EndpointOptions endpoint_options(const Config& c, const std::string& name) {
  transport::EndpointOptions o;
  o.node_id = name;
  o.security.insecure = c.get_bool("tls.insecure");
  o.security.ca_file = c.get_string("tls.ca_file");
  o.security.cert_file = c.get_string("tls.cert_file");
  o.security.key_file = c.get_string("tls.key_file");
  o.chunk_bytes = static_cast<std::size_t>(c.get_int("transport.chunk_kib")) * 1024;
  return o;
}

}  // namespace

int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop) {
  transport::Context ctx;
  return run(config, registries, stop, ctx);
}

int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop,
        transport::Context& ctx) {
  validate(config, registries);
  if (config.get_string("server.mode") == "decentralized") return run_rendezvous(config, stop, ctx);
  const auto shards = static_cast<std::uint32_t>(config.get_int("server.shards"));
  const auto index = static_cast<std::uint32_t>(config.get_int("server.shard"));
  if (shards < 1 || index >= shards) {
    throw ConfigError("server.shard must be in [0, server.shards)");
  }
  std::string name = config.get_string("server.name");
  if (name.empty()) name = "shard-" + std::to_string(index);
  if (index == 0 && name != config.get_string("tls.coordinator_name")) {
    throw ConfigError("shard 0 is the coordinator, and clients and shards accept only the name "
                      "tls.coordinator_name = '" + config.get_string("tls.coordinator_name") +
                      "', but server.name is '" + name + "': set both alike");
  }
  if (index > 0 && config.get_string("server.coordinator").empty()) {
    throw ConfigError("shard " + std::to_string(index) + " needs --coordinator (the url of shard 0)");
  }
  const std::string mode = config.get_string("server.mode");
  const std::string consistency = config.get_string("server.consistency");
  if (consistency != "bsp" && consistency != "asp" && consistency != "ssp") {
    throw ConfigError("server.consistency must be bsp, asp or ssp, got '" + consistency + "'");
  }
  const std::string spec = config.get_string("model.spec");
  const auto model_size = kernels::make_network_spec(spec).parameter_count();  // validates the spec early
  const double dp_clip = config.get_double("dp.clip"), dp_noise = config.get_double("dp.noise_multiplier");
  if (!(dp_clip >= 0) || !std::isfinite(dp_clip)) throw ConfigError("dp.clip must be >= 0");
  if (!(dp_noise >= 0) || !std::isfinite(dp_noise)) throw ConfigError("dp.noise_multiplier must be >= 0");
  if (dp_noise > 0 && dp_clip == 0) throw ConfigError("dp.noise_multiplier needs dp.clip > 0 (the sensitivity)");
  if (const double d = config.get_double("dp.delta"); !(d > 0 && d < 1)) throw ConfigError("dp.delta must be in (0, 1)");
  if (dp_clip > 0 && mode != "federated") throw ConfigError("dp.clip applies to server.mode = federated only");

  ThreadPool pool(2);
  auto opts = endpoint_options(config, name);
  opts.pool = &pool;
  opts.deliver_chunks = true;  // pushes stream into the aggregator chunk by chunk
  // In one process (cohort-sim) a fleet socket may speak for many virtual clients.
  opts.multiplex = config.get_string("server.listen").rfind("inproc://", 0) == 0;
  // Few queued chunks per client: memory stays O(model) + O(clients), and TCP pushes back. One is
  // best in plaintext, where the shard works on the frame ZeroMQ received, still hot in cache.
  // Under TLS the shard opens a chunk before it can use it: with one queued, ZeroMQ stops reading
  // the socket meanwhile, and 16 MiB pushes ran at 2.6 GB/s here against 3.6-4.5 with two. Two
  // pay off only while few clients stream at once: with many, the shard always has another
  // client's chunk to work on, so past 8 connected peers each gets one (a budget of 16).
  const std::int64_t queue = config.get_int("transport.receive_queue");
  if (queue < 0 || queue > 65536) {
    throw ConfigError("transport.receive_queue must be from 0 (automatic) to 65536, got " +
                      std::to_string(queue));
  }
  opts.receive_queue = queue > 0 ? static_cast<int>(queue) : (opts.security.insecure ? 1 : 2);
  if (queue == 0 && !opts.security.insecure) opts.receive_budget = 16;
  auto ep = Endpoint::bind(ctx, config.get_string("server.listen"), opts);
  write_port_file(config.get_string("server.port_file"), ep.url());
  COHORT_LOG(Info) << name << " listening on " << ep.url() << (ep.is_secure() ? " (TLS)" : " (plaintext)");

  std::optional<MetricsSink> metrics;
  if (index == 0) metrics.emplace(config.get_string("server.metrics_file"));
  Shard shard(config, registries, index, shards, metrics ? &*metrics : nullptr);
  std::optional<Coordinator> coordinator;
  std::optional<Endpoint> upstream;
  if (index == 0) {
    shard.setup(spec, model_size);
    coordinator.emplace(config, shard, ep, name, *metrics);
  } else {
    auto up = endpoint_options(config, name);
    // Only the federation's coordinator may drive this shard: any other certificate of the same
    // CA is refused in the handshake.
    up.security.expected_peer = config.get_string("tls.coordinator_name");
    upstream.emplace(Endpoint::connect(ctx, config.get_string("server.coordinator"), up));
  }

  auto register_upstream = [&] {
    transport::Register r;
    r.role = transport::Role::kShard;
    r.shard_index = index;
    r.listen_url = config.get_string("server.advertise").empty() ? ep.url()
                                                                 : config.get_string("server.advertise");
    Envelope e;
    e.body = r;
    upstream->send({}, std::move(e));
  };
  std::uint64_t upstream_handshakes = 0;
  auto next_register = Clock::now();
  bool welcomed = false;

  std::vector<Endpoint*> endpoints{&ep};
  if (upstream) endpoints.push_back(&*upstream);
  while (!stop.load()) {
    if (upstream) {
      // (Re-)register with the coordinator whenever the session is new or we are not welcomed.
      const auto hs = upstream->stats().handshakes;
      if ((hs != upstream_handshakes || !welcomed) && Clock::now() >= next_register) {
        try {
          register_upstream();
          upstream_handshakes = upstream->stats().handshakes;
        } catch (const TransportError& e) {
          COHORT_LOG(Warn) << "cannot reach the coordinator yet: " << e.what();
        }
        next_register = Clock::now() + 1s;
      }
    }
    const int ready = Endpoint::poll(endpoints, 50ms);
    if (ready >= 0) {
      auto m = endpoints[static_cast<std::size_t>(ready)]->receive(0ms);
      if (m) {
        try {
          if (ready == 1) {  // from the coordinator
            if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) {
              if (!welcomed) shard.setup(w->model_spec, w->model_size);
              welcomed = true;
              shard.on_welcome(w->coordinator_epoch, w->current_round);
            } else if (auto* ro = std::get_if<transport::RoundOpen>(&m->envelope.body)) {
              shard.open_round(ro->round, ro->clients);
            } else if (auto* rc = std::get_if<transport::RoundClose>(&m->envelope.body)) {
              Envelope a;
              a.round = rc->round;
              if (rc->prepare) {
                auto p = shard.prepare_round(rc->round);
                a.body = transport::PushAck{p.ok, std::move(p.reason), shard.version(), true};
              } else {
                const auto v = shard.close_round(rc->round, rc->commit);
                a.body = transport::PushAck{true, "", v, false};
              }
              upstream->send({}, std::move(a));
            } else if (std::holds_alternative<transport::Bye>(m->envelope.body)) {
              COHORT_LOG(Info) << name << ": the coordinator says training is finished";
              shard.checkpoint();
              return 0;
            } else if (auto* err = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
              COHORT_LOG(Warn) << "coordinator: " << err->message;
            }
          } else if (!(shard.ready() && shard.handle(ep, *m)) &&
                     !(coordinator && coordinator->handle(*m))) {
            if (!std::holds_alternative<transport::ErrorBody>(m->envelope.body)) {
              Envelope e;
              e.body = transport::ErrorBody{transport::ErrorCode::kMalformed,
                                            std::string("unexpected ") +
                                                std::string(transport::body_name(m->envelope.body)),
                                            m->envelope.seq};
              ep.send(m->peer, std::move(e));
            }
          }
        } catch (const ProtocolError& e) {
          COHORT_LOG(Warn) << "dropped a message from " << m->sender << ": " << e.what();
        }
      }
    }
    if (coordinator) {
      coordinator->tick();
      if (coordinator->finished()) {
        shard.checkpoint();
        std::this_thread::sleep_for(300ms);  // let the goodbyes leave
        if (!coordinator->failure().empty()) throw TrainingError(coordinator->failure());
        return 0;
      }
    }
  }
  COHORT_LOG(Info) << name << ": stopping (signal); writing a checkpoint";
  shard.checkpoint();
  return 0;
}

}  // namespace cohort::server
