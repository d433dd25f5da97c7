#include "cohort/client/participant.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "client_options.h"
#include "cohort/aggregation/privacy.h"
#include "cohort/aggregation/push_codec.h"
#include "cohort/aggregation/registries.h"
#include "cohort/client/client_work.h"
#include "cohort/client/local_training.h"
#include "cohort/client/local_work.h"
#include "cohort/client/push_encoding.h"
#include "cohort/client/secagg_session.h"
#include "cohort/client/shard_client.h"
#include "cohort/client/trainer.h"
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/random.h"
#include "cohort/core/thread_pool.h"
#include "cohort/transport/config.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/secagg_messages.h"
#include "fatal_report.h"

namespace cohort::client {
namespace {

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;
using Clock = std::chrono::steady_clock;

class Participant {
 public:
  // The compressor is made here, before joining (the work made its device and read its data):
  // a compressor shards cannot decode stops the client before it registers.
  Participant(ParticipantOptions options, ClientWork& work, const std::atomic<bool>& stop)
      : options_(std::move(options)), stop_(stop), work_(work) {
    const auto& section = options_.compressor;
    compressor_ =
        builtin_registries().compressors.create(section.get_string("name", "none"), section);
    if (!aggregation::wire_format_of(compressor_->encoding())) {
      throw ConfigError("compressor '" + section.get_string("name", "none") +
                        "' writes encoding '" + std::string(compressor_->encoding()) +
                        "', which shards cannot decode");
    }
    // "none" (with or without error feedback, which is then the identity) pushes plain fp32.
    if (compressor_->encoding() == "none") compressor_.reset();
  }

  // Why run() returned 1 (empty when it returned 0).
  [[nodiscard]] const std::string& failure() const { return failure_; }

  int run() {
    ThreadPool pool(2);
    pool_ = &pool;
    auto o = options_.endpoint;
    o.pool = pool_;
    coordinator_.emplace(Endpoint::connect(ctx_, options_.server, o));
    // Shard 0 answers over the coordinator's connection; the others get one each, which must
    // prove the shard's node id.
    links_.emplace(ctx_, *coordinator_, [this](const std::string& node_id) {
      auto so = options_.endpoint;
      so.security.expected_peer = node_id;
      so.pool = pool_;
      return so;
    });
    try {
      return serve();
    } catch (const Error& e) {
      // Stopping for good: the coordinator drops us from its pool instead of waiting for a client
      // that will never answer (it can only hear it over an established session).
      report_fatal(e.what());
      throw;
    }
  }

 private:
  int serve() {
    join();
    auto next_heartbeat = Clock::now();
    // When the session with the coordinator broke (TLS: the connection dropped), if not back yet.
    std::optional<Clock::time_point> session_lost;
    while (!stopping()) {
      if (coordinator_->is_ready()) {
        session_lost.reset();
      } else if (!session_lost) {
        session_lost = Clock::now();
      } else if (Clock::now() - *session_lost > options_.connect_timeout) {
        failure_ = "lost the coordinator at " + options_.server +
                   " and could not reconnect within client.connect_timeout_ms";
        COHORT_LOG(Error) << name() << ": " << failure_;
        return 1;
      }
      if (coordinator_->stats().handshakes != coordinator_handshakes_) {
        COHORT_LOG(Info) << "new session with the coordinator; registering again";
        join();
        // The last report may have died with the old session; the coordinator counts it once.
        if (last_report_) send_report(*last_report_);
      }
      std::optional<Message> m;
      if (!deferred_.empty()) {
        m = std::move(deferred_.front());
        deferred_.pop_front();
      } else {
        m = coordinator_->receive(100ms);
      }
      if (m) {
        if (auto* rs = std::get_if<transport::RoundStart>(&m->envelope.body)) {
          current_round_ = rs->round;
          if (rs->mode == transport::TrainingMode::kDataParallel && !rs->evaluate_only) {
            check_dataparallel();
            run_dataparallel(*rs);
          } else {
            run_round(*rs);
          }
        } else if (auto* bye = std::get_if<transport::Bye>(&m->envelope.body)) {
          if (bye->reason == "training failed") {
            // The coordinator gave up (its log says why): this client did not finish either.
            failure_ = "the coordinator stopped training: it failed";
            COHORT_LOG(Error) << name() << ": " << failure_;
            return 1;
          }
          COHORT_LOG(Info) << name() << ": training finished";
          return 0;
        } else if (auto* sa = std::get_if<transport::SecAgg>(&m->envelope.body)) {
          on_secagg(*m, *sa);
        } else if (auto* e = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
          COHORT_LOG(Warn) << name() << ": coordinator: " << e->message;
        }
      }
      // Not while the session is down: a send would wait there for the handshake (up to
      // transport's handshake timeout) instead of this loop driving the reconnect.
      if (Clock::now() >= next_heartbeat && coordinator_->is_ready()) {
        Envelope hb;
        hb.body = transport::Heartbeat{.clock = 0, .load = 0};
        try {
          coordinator_->send({}, std::move(hb));
        } catch (const TransportError& e) {
          COHORT_LOG(Debug) << "heartbeat not sent: " << e.what();
        }
        next_heartbeat = Clock::now() + heartbeat_;
      }
    }
    return 0;
  }

  const std::string& name() const { return options_.name; }
  bool stopping() { return stop_.load() || work_.should_stop(); }
  const std::vector<transport::ShardInfo>& shards() const { return links_->shards(); }

  void report_fatal(const std::string& why) {
    if (!coordinator_ || !registered_ || !coordinator_->is_ready()) return;
    send_fatal_report(*coordinator_, current_round_, why, name());
  }

  // Registers until welcomed; sets up the model and the shard connections.
  void join() {
    const auto deadline = Clock::now() + options_.connect_timeout;
    std::chrono::milliseconds backoff = 200ms;
    for (;;) {
      if (stopping()) return;
      if (Clock::now() > deadline) {
        throw TransportError("no welcome from the coordinator at " + options_.server +
                             " within client.connect_timeout_ms");
      }
      try {
        try {
          coordinator_->wait_ready(
              std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
        } catch (const TimeoutError&) {
          throw;
        } catch (const TransportError& e) {
          coordinator_refused(options_.server, options_.coordinator_name, e.what());
        }
        coordinator_handshakes_ = coordinator_->stats().handshakes;
        std::string refusal;
        const auto welcome = links_->register_once(
            transport::Register{.role = transport::Role::kClient,
                                .dataset_size = work_.num_samples(),
                                .device = work_.device(),
                                .partition = work_.describe(),
                                .no_evaluation = !work_.evaluates()},
            2s, [this](Message&& m) { deferred_.push_back(std::move(m)); }, &refusal);
        registered_ = true;  // a session with the real coordinator: it can hear a fatal report
        if (welcome) {
          on_welcome(*welcome);
          return;
        }
        if (!refusal.empty()) {
          COHORT_LOG(Info) << name() << ": " << refusal;
        }
      } catch (const TimeoutError& e) {
        COHORT_LOG(Info) << name() << ": coordinator not reachable yet: " << e.what();
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
  }

  void on_welcome(const transport::Welcome& w) {
    client_index_ = w.client_index;
    heartbeat_ = std::chrono::milliseconds(std::max<std::uint32_t>(w.heartbeat_ms, 100));
    // A new coordinator epoch: the coordinator restarted and reopens its round from scratch on
    // every shard, so a report of the old one must not count there (its update is gone).
    if (coordinator_epoch_ != 0 && w.coordinator_epoch != coordinator_epoch_) last_report_.reset();
    coordinator_epoch_ = w.coordinator_epoch;
    const bool same_model = welcomed_ && w.model_spec == model_spec_;
    if (!same_model) {
      // Training options come from the server, so every client trains alike.
      ConfigSchema schema;
      schema.add_section("train", "");
      Config train_cfg(schema);
      train_cfg.merge_toml("[train]\n" + w.training_toml, "the coordinator's [train] section");
      options_train_ = trainer_options_from(train_cfg.section("train"));
    }
    work_.on_welcome({.spec = w.model_spec,
                      .parameter_count = w.model_size,
                      .training_toml = w.training_toml,
                      .train = options_train_},
                     same_model);
    if (!same_model) {
      model_spec_ = w.model_spec;
      welcomed_ = true;
      if (work_.parameters().size() != w.model_size) {
        throw ProtocolError("the coordinator's model has " + std::to_string(w.model_size) +
                            " parameters; this client's work holds " +
                            std::to_string(work_.parameters().size()));
      }
      global_ = FloatBuffer(w.model_size);
      delta_ = FloatBuffer(w.model_size);
    }
    const auto& old = shards();
    const bool same_layout =
        w.shards.size() == old.size() &&
        std::equal(w.shards.begin(), w.shards.end(), old.begin(), [](const auto& a, const auto& b) {
          return a.begin == b.begin && a.end == b.end;
        });
    // Closes the old layout's endpoints and connects to the new one (shard 0: the coordinator).
    links_->connect(w.shards);
    // One encoder per shard range, kept across rounds (and reconnects to the same layout): it holds
    // the error-feedback residuals and PowerSGD's warm start.
    if (compressor_ && (!same_layout || encoders_.size() != shards().size())) {
      encoders_.clear();
      encoded_.assign(shards().size(), {});
      for (const auto& s : shards()) {
        encoders_.push_back(
            std::make_unique<aggregation::PushEncoder>(*compressor_, s.end - s.begin));
      }
    }
    COHORT_LOG(Info) << name() << ": joined (" << w.model_spec << ", " << w.model_size
                     << " parameters, " << shards().size() << " shards)";
  }

  // How every exchange with the shards runs: resent on the library's schedule (3 s doubling to
  // 20 s; `patient`: 30 s for requests a shard holds on purpose), given up on stop or at
  // `deadline`; a RoundStart or Bye that arrives meanwhile is served after the round.
  ExchangeOptions exchange_options(Clock::time_point deadline, bool patient) {
    return {.deadline = deadline,
            .patient = patient,
            .stop = &stop_,
            .other = [this](Message&& m) { deferred_.push_back(std::move(m)); },
            .who = name()};
  }

  void run_round(const transport::RoundStart& rs) {
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::milliseconds(rs.deadline_ms);
    const std::uint64_t sent0 = links_->bytes_sent(), recv0 = links_->bytes_received();
    const auto xo = exchange_options(deadline, /*patient=*/false);
    transport::ClientReport report;
    report.round = rs.round;
    report.model_version = rs.model_version;
    // Secure aggregation: the keys and shares go round before training (R0, R1).
    if (rs.secure_aggregation && !rs.evaluate_only && !secagg_keys(rs, deadline, report)) {
      send_report(report);
      return;
    }
    // Pull every shard's range in parallel.
    auto params = work_.parameters();
    const PullOutcome pulled =
        pull_all(*links_, shards(), steady_clock(), rs.round, rs.model_version, params, xo);
    if (!pulled) {
      report.message = "could not pull the model before the deadline";
      report.links = merge_link_samples(pulled.links, {});  // the shards that did answer
      send_report(report);
      return;
    }
    const auto t_pulled = Clock::now();
    if (rs.evaluate_only) {
      if (auto eval = work_.evaluate()) {
        report.evaluated = true;
        report.eval_loss = static_cast<float>(eval->loss);
        report.eval_accuracy = eval->has_accuracy ? static_cast<float>(eval->accuracy) : 0.0f;
        report.eval_count = eval->count;
      } else {
        report.message = "no test examples to evaluate on";
      }
      send_report(report);
      return;
    }
    std::copy(params.begin(), params.end(), global_.begin());
    // Shuffles depend on the model version and the partition, not on round ids, so the same
    // training happens under every server mode.
    const auto seed =
        options_.data_seed * 1000003ULL + rs.model_version * 7919ULL + options_.part_index;
    // RoundStart.local_steps > 0: exactly that many steps (server.work = deadline sizes it per
    // client); 0: train.epochs / train.steps as configured.
    const auto work = work_.train({.round = rs.round,
                                   .model_version = rs.model_version,
                                   .local_steps = rs.local_steps,
                                   .seed = seed});
    const TrainResult& result = work.trained;
    const std::uint64_t num_samples = work.num_samples > 0 ? work.num_samples : work_.num_samples();
    if (rs.local_steps > 0 && result.steps != rs.local_steps) {
      throw DataError(work_.trainer_name() + " took " + std::to_string(result.steps) +
                      " steps where round " + std::to_string(rs.round) + " asked for " +
                      std::to_string(rs.local_steps) + " (server.work sizes each client's steps)");
    }
    const auto t_trained = Clock::now();
    report.train_seconds = work.train_seconds > 0
                               ? static_cast<float>(work.train_seconds)
                               : std::chrono::duration<float>(t_trained - t_pulled).count();
    report.local_steps = static_cast<std::uint32_t>(result.steps);
    report.peak_training_bytes = result.peak_bytes;
    report.micro_batch = static_cast<std::uint32_t>(result.micro_batch);
    report.accumulation = static_cast<std::uint32_t>(result.accumulation);
    report.recompute = result.recompute;
    log_memory_plan(rs.round, result);
    if (report.train_seconds > 0) {
      report.samples_per_second =
          static_cast<float>(static_cast<double>(result.samples) / report.train_seconds);
    }
    if (auto failed =
            make_delta(rs.round)) {  // a diverged client: tell the coordinator, send nothing
      report.message = *failed;
      send_report(report);
      return;
    }
    auto delta_bytes = std::as_bytes(delta_.span());
    transport::Encoding dense = transport::Encoding::kDenseF32;
    std::vector<std::uint32_t> masked;
    if (secagg_ && secagg_->round() == rs.round) {
      if (!secagg_mask(rs.round, deadline, seed, masked, report)) {
        send_report(report);
        return;
      }
      delta_bytes = std::as_bytes(std::span<const std::uint32_t>(masked));
      dense = transport::Encoding::kMaskedU32;
    }
    COHORT_LOG(Debug) << name() << ": pushing its update for round " << rs.round;
    const PushOutcome pushed = push_all(
        *links_, shards(), steady_clock(),
        {.round = rs.round,
         .num_samples = num_samples,
         .base_version = rs.model_version,
         .encoding = dense,
         .kind = transport::PushKind::kDelta,
         .train_loss = static_cast<float>(result.mean_loss),
         .local_work = static_cast<float>(fednova_local_work(options_train_, result.steps))},
        [&](std::size_t i) {
          const auto& s = shards()[i];
          return compressor_ ? std::span<const std::byte>(encoded_[i])
                             : delta_bytes.subspan(s.begin * 4, (s.end - s.begin) * 4);
        },
        xo,
        [&](std::size_t i) { return compressor_ ? push_encoding(encoders_[i]->format()) : dense; });
    const auto t_pushed = Clock::now();
    report.trained = pushed.accepted();
    if (!pushed.answered) report.message = "could not push before the deadline";
    if (!pushed.refusals.empty())
      report.message = "a shard refused the update: " + pushed.refusals.front();
    report.num_samples = num_samples;
    report.train_loss = static_cast<float>(result.mean_loss);
    report.comm_seconds =
        std::chrono::duration<float>((t_pulled - t0) + (t_pushed - t_trained)).count();
    report.bytes_sent = links_->bytes_sent() - sent0;
    report.bytes_received = links_->bytes_received() - recv0;
    report.links = merge_link_samples(pulled.links, pushed.links);
    report.round_seconds = std::chrono::duration<float>(Clock::now() - t0).count();
    send_report(report);
  }

  // The round's training memory plan: at Info when it micro-batches or recomputes, else Debug.
  void log_memory_plan(std::uint64_t round, const TrainResult& result) const {
    const std::string memory_line =
        name() + ": round " + std::to_string(round) + ": " + std::to_string(result.steps) +
        " steps, training memory peak " + std::to_string(result.peak_bytes) + " bytes (batch " +
        std::to_string(options_train_.batch_size) + " as " + std::to_string(result.accumulation) +
        " x " + std::to_string(result.micro_batch) +
        (result.recompute ? ", recomputing activations" : "") + ")";
    if (result.accumulation > 1 || result.recompute) {
      COHORT_LOG(Info) << memory_line;
    } else {
      COHORT_LOG(Debug) << memory_line;
    }
  }

  // Secure aggregation's R0 and R1 (secagg_session.h): advertise, take U1's keys, send the
  // shares. False (with the report's message) when the round's key stages failed or ran out.
  bool secagg_keys(const transport::RoundStart& rs, Clock::time_point deadline,
                   transport::ClientReport& report) {
    if (compressor_) {
      throw ConfigError("compressor.name = " + options_.compressor.get_string("name", "none") +
                        " cannot run under the server's secure aggregation: a masked input is "
                        "not compressible (use compressor.name = none)");
    }
    secagg_.emplace(client_index_, rs.round, delta_.size());
    send_secagg(rs.round, transport::SecAggStage::kAdvertise, secagg_->advertise());
    const auto keys = await_secagg(rs.round, transport::SecAggStage::kKeys, deadline);
    if (!keys) {
      report.message = "secure aggregation: no keys from the coordinator (the key stage failed)";
      return false;
    }
    try {
      send_secagg(rs.round, transport::SecAggStage::kShares, secagg_->on_keys(*keys));
    } catch (const ProtocolError& e) {
      report.message = std::string("secure aggregation: ") + e.what();
      return false;
    }
    return true;
  }

  // R2: the shares forwarded to this client, then its masked input. False (with the report's
  // message) when they do not come or do not open.
  bool secagg_mask(std::uint64_t round, Clock::time_point deadline, std::uint64_t seed,
                   std::vector<std::uint32_t>& masked, transport::ClientReport& report) {
    const auto forwarded = await_secagg(round, transport::SecAggStage::kForwarded, deadline);
    if (!forwarded) {
      report.message = "secure aggregation: no shares forwarded (too few clients shared keys)";
      return false;
    }
    try {
      secagg_->on_forwarded(*forwarded);
      masked = secagg_->masked_input(delta_.span(), seed ^ 0x5ecA99ULL);
    } catch (const ProtocolError& e) {
      report.message = std::string("secure aggregation: ") + e.what();
      return false;
    }
    return true;
  }

  // R4, and stale stages: answered once per round, from the serve loop.
  void on_secagg(const Message& m, const transport::SecAgg& sa) {
    if (sa.stage != transport::SecAggStage::kUnmask || !secagg_ || secagg_->round() != sa.round ||
        !m.complete) {
      COHORT_LOG(Debug) << name() << ": secure aggregation message for round " << sa.round
                        << " ignored";
      return;
    }
    try {
      send_secagg(sa.round, transport::SecAggStage::kUnmaskShares,
                  secagg_->on_unmask(transport::decode_secagg(m.payload.span())));
    } catch (const ProtocolError& e) {
      COHORT_LOG(Warn) << name() << ": secure aggregation, round " << sa.round
                       << ": not unmasking: " << e.what();
    }
  }

  void send_secagg(std::uint64_t round, transport::SecAggStage stage,
                   const transport::SecAggData& data) {
    auto bytes = std::make_shared<std::vector<std::byte>>(transport::encode_secagg(data));
    Envelope e;
    e.round = round;
    e.body = transport::SecAgg{.round = round, .stage = stage};
    coordinator_->send({}, std::move(e), transport::Payload{*bytes, bytes});
  }

  // The coordinator's `stage` of secure aggregation for `round`, or nothing by `deadline` (or on
  // stop). Other messages wait in deferred_ for the serve loop.
  std::optional<transport::SecAggData> await_secagg(std::uint64_t round,
                                                    transport::SecAggStage stage,
                                                    Clock::time_point deadline) {
    // The stage may have come while the shards were pulled from (shard 0 answers over the
    // coordinator's connection): the exchange kept it with the other messages.
    for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
      const auto* sa = std::get_if<transport::SecAgg>(&it->envelope.body);
      if (sa == nullptr || sa->round != round || sa->stage != stage) continue;
      Message m = std::move(*it);
      deferred_.erase(it);
      deferred_.push_front(std::move(m));
      break;
    }
    while (!stopping() && Clock::now() < deadline) {
      std::optional<Message> m;
      if (!deferred_.empty() &&
          std::holds_alternative<transport::SecAgg>(deferred_.front().envelope.body)) {
        m = std::move(deferred_.front());
        deferred_.pop_front();
      } else {
        m = coordinator_->receive(100ms);
      }
      if (!m) continue;
      if (auto* sa = std::get_if<transport::SecAgg>(&m->envelope.body)) {
        if (sa->round == round && sa->stage == stage && m->complete && m->offset == 0) {
          try {
            return transport::decode_secagg(m->payload.span());
          } catch (const ProtocolError& e) {
            COHORT_LOG(Warn) << name() << ": secure aggregation: malformed stage: " << e.what();
            return std::nullopt;
          }
        }
        continue;  // a stale stage (an earlier round's)
      }
      if (auto* e = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
        COHORT_LOG(Warn) << name() << ": coordinator: " << e->message;
        continue;
      }
      deferred_.push_back(std::move(*m));
    }
    return std::nullopt;
  }

  // delta_ = trained - global_, clipped, attacked and encoded per shard as configured. Returns the
  // report's message when the update must not be sent (the encoder found it non-finite).
  std::optional<std::string> make_delta(std::uint64_t round) {
    auto trained = work_.parameters();
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = trained[i] - global_[i];
    // Client-level DP (docs/ALGORITHMS.md 8.3, eq. 8.2): flat clipping of the whole delta.
    if (options_.dp_clip > 0) (void)aggregation::clip_l2(delta_.span(), options_.dp_clip);
    // For robustness experiments only: a Byzantine client pushing -scale x its honest delta.
    if (options_.sign_flip) {
      const auto f = static_cast<float>(-options_.attack_scale);
      for (auto& v : delta_.span()) v *= f;
    }
    // Encoded once per round, before any (re)send: encoding moves the error-feedback state.
    if (!compressor_) return std::nullopt;
    const auto seed = aggregation::compression_seed(options_.data_seed, round, options_.part_index);
    try {
      for (std::size_t i = 0; i < shards().size(); ++i) {
        const auto& s = shards()[i];
        encoders_[i]->encode(delta_.span().subspan(s.begin, s.end - s.begin),
                             aggregation::compression_seed(seed, i, 0), encoded_[i]);
      }
    } catch (const KernelError& e) {
      return std::string("update not sent: ") + e.what();
    }
    return std::nullopt;
  }

  // Options that shape a federated delta have no data-parallel form: refused, not ignored.
  void check_dataparallel() const {
    if (compressor_) {
      throw ConfigError(
          "compressor.* does not apply to server.mode = dataparallel (gradients go uncompressed)");
    }
    if (options_.dp_clip > 0) {
      throw ConfigError(
          "client.dp_clip does not apply to server.mode = dataparallel (it clips federated "
          "deltas, not gradients)");
    }
    if (options_.sign_flip) {
      throw ConfigError("client.attack does not apply to server.mode = dataparallel");
    }
  }

  // Data-parallel: per step, pull the weights (the shards hold the pull until the consistency
  // model lets this worker's clock through), compute one batch's gradient, push it. With speed
  // batches (server.batch_policy = speed) shard 0's PullReply sets the step's batch b, the rows
  // come from one stream of epochs (dataparallel_rows), and the push is the SUM of the b
  // per-sample gradients with num_samples = b (ALGORITHMS.md 3.4); otherwise the mean over
  // RoundStart.batch_size rows (dataparallel_batch).
  void run_dataparallel(const transport::RoundStart& rs) {
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::milliseconds(rs.deadline_ms);
    const std::uint64_t sent0 = links_->bytes_sent(), recv0 = links_->bytes_received();
    const auto xo = exchange_options(deadline, /*patient=*/true);
    transport::ClientReport report;
    report.round = rs.round;
    const std::size_t batch = std::max<std::uint32_t>(rs.batch_size, 1);
    const auto seed = options_.data_seed * 7919ULL + options_.part_index;
    double loss_sum = 0;
    double compute_s = 0;
    auto params = work_.parameters();
    std::uint32_t assigned = 0;  // shard 0's batch for the step (0: RoundStart's, a mean)
    std::uint64_t cursor = 0;    // speed batches: rows taken so far from the stream of epochs
    for (std::uint64_t step = 0; step < rs.local_steps; ++step) {
      if (!pull_all(*links_, shards(), steady_clock(), rs.round, step, params, xo, &assigned)) {
        report.message = "could not pull at step " + std::to_string(step);
        break;
      }
      const auto c0 = Clock::now();
      const auto [rows, loss] = work_.gradient(
          {.step = step, .batch = batch, .assigned = assigned, .cursor = cursor, .seed = seed});
      cursor += rows;
      loss_sum += loss;
      const auto gbytes = std::as_bytes(work_.gradients());
      compute_s += std::chrono::duration<double>(Clock::now() - c0).count();
      COHORT_LOG(Debug) << name() << ": clock " << step;
      const PushOutcome pushed = push_all(
          *links_, shards(), steady_clock(),
          {.round = rs.round,
           .num_samples = rows,
           .base_version = step,
           .encoding = transport::Encoding::kDenseF32,
           .kind = transport::PushKind::kGradient,
           .train_loss = 0,
           .clock = step},
          [&](std::size_t i) {
            const auto& s = shards()[i];
            return gbytes.subspan(s.begin * 4, (s.end - s.begin) * 4);
          },
          xo);
      if (!pushed.accepted()) {
        report.message = !pushed.answered ? "could not push at step " + std::to_string(step)
                                          : "gradient refused: " + pushed.refusals.front();
        break;
      }
      if (step + 1 == rs.local_steps) report.trained = true;
      if (options_.step_delay.count() > 0) std::this_thread::sleep_for(options_.step_delay);
    }
    report.num_samples = cursor > 0 && assigned > 0 ? cursor : rs.local_steps * batch;
    report.train_loss =
        rs.local_steps ? static_cast<float>(loss_sum / static_cast<double>(rs.local_steps)) : 0;
    report.train_seconds = static_cast<float>(compute_s);
    report.comm_seconds =
        std::chrono::duration<float>(Clock::now() - t0).count() - report.train_seconds;
    report.bytes_sent = links_->bytes_sent() - sent0;
    report.bytes_received = links_->bytes_received() - recv0;
    send_report(report);
  }

  // Kept for a resend after a reconnect (the coordinator counts a report once).
  void send_report(const transport::ClientReport& r) {
    last_report_ = r;
    (void)links_->report(r, name());
  }

  const ParticipantOptions options_;
  const std::atomic<bool>& stop_;
  transport::Context ctx_;
  ThreadPool* pool_ = nullptr;
  std::optional<Endpoint> coordinator_;
  std::optional<ShardClient> links_;  // refers to ctx_ and coordinator_
  std::optional<transport::ClientReport> last_report_;
  std::uint64_t coordinator_epoch_ = 0;  // of the coordinator that last welcomed this client
  std::uint64_t coordinator_handshakes_ = 0;
  std::uint64_t current_round_ = 0;  // of the last RoundStart, for a fatal report
  bool registered_ = false;
  std::deque<Message> deferred_;
  std::chrono::milliseconds heartbeat_{2000};
  std::string model_spec_;
  bool welcomed_ = false;         // a Welcome made the work's model (model_spec_)
  TrainerOptions options_train_;  // the coordinator's [train]
  ClientWork& work_;
  std::string failure_;                  // why run() returned 1
  std::uint32_t client_index_ = 0;       // Welcome.client_index: the secure aggregation id
  std::optional<SecAggSession> secagg_;  // the latest round's secure aggregation
  FloatBuffer global_, delta_;
  std::unique_ptr<aggregation::Compressor> compressor_;  // null: plain fp32 pushes
  std::vector<std::unique_ptr<aggregation::PushEncoder>>
      encoders_;                                 // per shard, refer to compressor_
  std::vector<std::vector<std::byte>> encoded_;  // per shard: this round's payload, reused
};

}  // namespace

ConfigSchema participant_config_schema() {
  ConfigSchema s;
  s.add("client.server", std::string("tcp://127.0.0.1:7000"), "url of the coordinator (shard 0)")
      .add("client.name", std::string("client-0"), "node id; must be the certificate's CN")
      .add("client.device", std::string("cpu"), "cpu or cuda:N")
      .add("client.threads", std::int64_t{1},
           "CPU threads for local training (0: one per core; at most 1024)")
      .add("client.memory_budget", std::int64_t{0},
           "federated: this device's training memory budget in bytes (0: none); the client "
           "trains the coordinator's batch in micro-batches that fit, or stops naming the "
           "minimum (see --print-plan)")
      .add("client.connect_timeout_ms", std::int64_t{120000},
           "give up joining (or rejoining a lost coordinator) after this long")
      .add("client.backoff_max_ms", std::int64_t{5000}, "longest wait between retries")
      .add("client.step_delay_ms", std::int64_t{0},
           "data-parallel: sleep after each step (to emulate a straggler)")
      .add("data.dir", std::string(kFashionMnistDir), "folder with the Fashion-MNIST IDX files")
      .add("data.partition", std::string("iid"), "iid | dirichlet:ALPHA | shards:S | quantity:BETA")
      .add("data.part", std::string("0/1"), "which part this client holds: I/N")
      .add("data.seed", std::int64_t{1}, "seed of the partition (equal on every client)")
      .add(
          "client.dp_clip", 0.0,
          "client-level DP: clip the whole delta to this L2 norm before pushing (0: off; set it to "
          "the server's dp.clip)")
      .add("client.attack", std::string("none"),
           "FOR EXPERIMENTS ONLY: none | sign_flip (push -attack_scale x the honest delta, a "
           "Byzantine client for testing robust aggregators)")
      .add("client.attack_scale", 1.0, "FOR EXPERIMENTS ONLY: the scale of client.attack")
      .add_section(
          "compressor",
          "compression of pushed deltas: name = none | fp16 | bf16 | int8 | qsgd | topk | "
          "randomk | sign | powersgd, with its options (k_fraction, k, s, bucket_size, norm, "
          "chunk, stochastic, scaled, rank, cols, error_feedback); an unknown name or "
          "option is an error");
  transport::add_transport_config(s, /*listener=*/false);  // tls.*, transport.* but receive_queue
  add_data_source_keys(s);
  return s;
}

std::vector<std::uint32_t> dataparallel_batch(std::span<const std::uint32_t> indices,
                                              std::size_t step, std::size_t batch,
                                              std::uint64_t seed) {
  COHORT_CHECK(batch >= 1);
  const std::size_t per_epoch = std::max<std::size_t>(indices.size() / batch, 1);
  const std::size_t epoch = step / per_epoch, pos = (step % per_epoch) * batch;
  std::vector<std::uint32_t> order(indices.begin(), indices.end());
  Rng::for_stream(seed, epoch).shuffle(std::span<std::uint32_t>(order));
  const std::size_t end = std::min(order.size(), pos + batch);
  return {order.begin() + static_cast<std::ptrdiff_t>(pos),
          order.begin() + static_cast<std::ptrdiff_t>(end)};
}

std::vector<std::uint32_t> dataparallel_rows(std::span<const std::uint32_t> indices,
                                             std::uint64_t first, std::size_t count,
                                             std::uint64_t seed) {
  std::vector<std::uint32_t> rows;
  if (indices.empty()) return rows;
  rows.reserve(count);
  std::vector<std::uint32_t> order;
  std::uint64_t shuffled = std::numeric_limits<std::uint64_t>::max();  // the epoch in `order`
  for (std::uint64_t k = first; k < first + count; ++k) {
    const std::uint64_t epoch = k / indices.size();
    if (epoch != shuffled) {
      order.assign(indices.begin(), indices.end());
      Rng::for_stream(seed, epoch).shuffle(std::span<std::uint32_t>(order));
      shuffled = epoch;
    }
    rows.push_back(order[k % indices.size()]);
  }
  return rows;
}

int run_participant(const ParticipantOptions& options, const std::atomic<bool>& stop,
                    const LocalTrainingRegistry& rules) {
  const auto work = make_stock_work(options, rules);
  return run_participant(options, *work, stop).code;
}

ParticipantExit run_participant(const ParticipantOptions& options, ClientWork& work,
                                const std::atomic<bool>& stop) {
  Participant p(options, work, stop);
  const int code = p.run();
  return {.code = code, .failure = p.failure()};
}

}  // namespace cohort::client
