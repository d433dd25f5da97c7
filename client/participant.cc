#include "cohort/client/participant.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <thread>

#include "cohort/aggregation/privacy.h"
#include "cohort/aggregation/push_codec.h"
#include "cohort/aggregation/registries.h"
#include "cohort/client/idx.h"
#include "cohort/client/partition.h"
#include "cohort/client/random.h"
#include "cohort/client/trainer.h"
#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/config.h"
#include "cohort/transport/endpoint.h"
#include "fatal_report.h"
#include "client_options.h"

namespace cohort::client {
namespace {

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;
using Clock = std::chrono::steady_clock;

// "I/N" -> (I, N).
std::pair<std::size_t, std::size_t> parse_part(const std::string& text) {
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    const auto i = std::stoul(text.substr(0, slash));
    const auto n = std::stoul(text.substr(slash + 1));
    if (n == 0 || i >= n) throw std::invalid_argument("out of range");
    return {i, n};
  } catch (const std::exception&) {
    throw ConfigError("data.part must look like I/N with 0 <= I < N, got '" + text + "'");
  }
}

// The push encoding that carries a built-in wire format.
transport::Encoding push_encoding(aggregation::WireFormat f) {
  using aggregation::WireFormat;
  switch (f) {
    case WireFormat::kDenseF32: return transport::Encoding::kDenseF32;
    case WireFormat::kFp16: return transport::Encoding::kDenseF16;
    case WireFormat::kBf16: return transport::Encoding::kDenseBf16;
    case WireFormat::kInt8: return transport::Encoding::kInt8;
    case WireFormat::kQsgd: return transport::Encoding::kQsgd;
    case WireFormat::kTopK: return transport::Encoding::kTopK;
    case WireFormat::kRandomK: return transport::Encoding::kRandomK;
    case WireFormat::kSign: return transport::Encoding::kSign;
    case WireFormat::kLowRank: return transport::Encoding::kPowerSgd;
  }
  throw InternalError("no push encoding for wire format " + std::to_string(static_cast<int>(f)));
}

class Participant {
 public:
  Participant(const Config& config, const std::atomic<bool>& stop) : config_(config), stop_(stop) {
    // Everything below fails before joining, so a bad option never costs a round nor leaves a
    // dead entry in the coordinator's pool.
    (void)non_empty(config, "client.server");
    (void)coordinator_options(config);  // client.name, tls.coordinator_name, tls.*, transport.*
    (void)int_in_range(config, "client.connect_timeout_ms", 1, std::int64_t{1} << 40);
    (void)int_in_range(config, "client.backoff_max_ms", 1, std::int64_t{1} << 40);
    (void)int_in_range(config, "client.step_delay_ms", 0, std::int64_t{1} << 40);
    (void)int_in_range(config, "data.seed", 0, std::numeric_limits<std::int64_t>::max());
    (void)parse_part(config.get_string("data.part"));
    // cohort-client's decentralized-only keys do nothing here: refused, not ignored.
    for (const char* key : {"peer.listen", "peer.advertise", "peer.handshake_timeout_ms"}) {
      if (config.is_set(key)) {
        throw ConfigError(std::string(key) + " applies to client.mode = decentralized only");
      }
    }
    (void)parse_partition_spec(config.get_string("data.partition"));
    // The device is made here, not after the Welcome: "cuda:0" without a GPU or "gpu7" stops the
    // client before it registers.
    device_ = kernels::make_device(
        config.get_string("client.device"),
        {.threads = static_cast<std::size_t>(int_in_range(config, "client.threads", 0, 1024))});
    const auto section = config.section("compressor");
    compressor_ = builtin_registries().compressors.create(section.get_string("name", "none"), section);
    if (!aggregation::wire_format_of(compressor_->encoding())) {
      throw ConfigError("compressor '" + section.get_string("name", "none") + "' writes encoding '" +
                        std::string(compressor_->encoding()) + "', which shards cannot decode");
    }
    // "none" (with or without error feedback, which is then the identity) pushes plain fp32.
    if (compressor_->encoding() == "none") compressor_.reset();
    dp_clip_ = config.get_double("client.dp_clip");
    if (!(dp_clip_ >= 0) || !std::isfinite(dp_clip_)) throw ConfigError("client.dp_clip must be >= 0");
    attack_ = config.get_string("client.attack");
    attack_scale_ = config.get_double("client.attack_scale");
    if (attack_ != "none" && attack_ != "sign_flip") {
      throw ConfigError("client.attack must be none or sign_flip, got '" + attack_ + "'");
    }
    if (!(attack_scale_ > 0) || !std::isfinite(attack_scale_)) {
      throw ConfigError("client.attack_scale must be > 0");
    }
  }

  int run() {
    load_data();
    ThreadPool pool(2);
    pool_ = &pool;
    auto o = coordinator_options(config_);
    o.pool = pool_;
    coordinator_.emplace(Endpoint::connect(ctx_, config_.get_string("client.server"), o));
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
    const auto give_up_after = std::chrono::milliseconds(config_.get_int("client.connect_timeout_ms"));
    while (!stop_.load()) {
      if (coordinator_->is_ready()) {
        session_lost.reset();
      } else if (!session_lost) {
        session_lost = Clock::now();
      } else if (Clock::now() - *session_lost > give_up_after) {
        COHORT_LOG(Error) << name() << ": lost the coordinator at " << config_.get_string("client.server")
                          << " and could not reconnect within client.connect_timeout_ms";
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
            COHORT_LOG(Error) << name() << ": the coordinator stopped training: it failed";
            return 1;
          }
          COHORT_LOG(Info) << name() << ": training finished";
          return 0;
        } else if (auto* e = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
          COHORT_LOG(Warn) << name() << ": coordinator: " << e->message;
        }
      }
      // Not while the session is down: a send would wait there for the handshake (up to
      // transport's handshake timeout) instead of this loop driving the reconnect.
      if (Clock::now() >= next_heartbeat && coordinator_->is_ready()) {
        Envelope hb;
        hb.body = transport::Heartbeat{0, 0};
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

  const std::string& name() const { return config_.get_string("client.name"); }

  void report_fatal(const std::string& why) {
    if (!coordinator_ || !registered_ || !coordinator_->is_ready()) return;
    send_fatal_report(*coordinator_, current_round_, why, name());
  }

  void load_data() {
    const auto [index, count] = parse_part(config_.get_string("data.part"));
    part_index_ = index;
    auto data = load_fashion_mnist(config_.get_string("data.dir"));
    train_ = std::move(data.train);
    test_ = std::move(data.test);
    const auto spec = parse_partition_spec(config_.get_string("data.partition"));
    const auto seed = static_cast<std::uint64_t>(config_.get_int("data.seed"));
    auto partition = make_partition(spec, train_.labels(), count, seed);
    indices_ = std::move(partition[index]);
    partition_text_ = spec.to_string() + " " + std::to_string(index) + "/" + std::to_string(count);
    COHORT_LOG(Info) << name() << ": " << indices_.size() << " training samples (" << partition_text_
                     << ")";
  }

  // Registers until welcomed; sets up the model and the shard connections.
  void join() {
    const auto deadline = Clock::now() + std::chrono::milliseconds(config_.get_int("client.connect_timeout_ms"));
    auto backoff = 200ms;
    for (;;) {
      if (stop_.load()) return;
      if (Clock::now() > deadline) {
        throw TransportError("no welcome from the coordinator at " + config_.get_string("client.server") +
                             " within client.connect_timeout_ms");
      }
      try {
        try {
          coordinator_->wait_ready(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
        } catch (const TimeoutError&) {
          throw;
        } catch (const TransportError& e) {
          coordinator_refused(config_, e.what());
        }
        coordinator_handshakes_ = coordinator_->stats().handshakes;
        transport::Register r;
        r.role = transport::Role::kClient;
        r.dataset_size = indices_.size();
        r.device = config_.get_string("client.device");
        r.partition = partition_text_;
        Envelope e;
        e.body = r;
        coordinator_->send({}, std::move(e));
        registered_ = true;  // a session with the real coordinator: it can hear a fatal report
        const auto until = Clock::now() + 2s;
        while (Clock::now() < until) {
          auto m = coordinator_->receive(100ms);
          if (!m) continue;
          if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) {
            on_welcome(*w);
            return;
          }
          if (auto* err = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
            COHORT_LOG(Info) << name() << ": " << err->message;
            break;
          }
          if (std::holds_alternative<transport::RoundStart>(m->envelope.body)) deferred_.push_back(std::move(*m));
        }
      } catch (const TimeoutError& e) {
        COHORT_LOG(Info) << name() << ": coordinator not reachable yet: " << e.what();
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(config_.get_int("client.backoff_max_ms")));
    }
  }

  void on_welcome(const transport::Welcome& w) {
    heartbeat_ = std::chrono::milliseconds(std::max<std::uint32_t>(w.heartbeat_ms, 100));
    // A new coordinator epoch: the coordinator restarted and reopens its round from scratch on
    // every shard, so a report of the old one must not count there (its update is gone).
    if (coordinator_epoch_ != 0 && w.coordinator_epoch != coordinator_epoch_) last_report_.reset();
    coordinator_epoch_ = w.coordinator_epoch;
    if (!net_ || w.model_spec != model_spec_) {
      model_spec_ = w.model_spec;
      spec_ = kernels::make_network_spec(w.model_spec);
      const auto& spec = spec_;
      if (spec.parameter_count() != w.model_size) {
        throw ProtocolError("the coordinator's model has " + std::to_string(w.model_size) +
                            " parameters, " + w.model_spec + " has " + std::to_string(spec.parameter_count()));
      }
      // Training options come from the server, so every client trains alike.
      ConfigSchema schema;
      schema.add_section("train", "");
      Config train_cfg(schema);
      train_cfg.merge_toml("[train]\n" + w.training_toml, "the coordinator's [train] section");
      auto section = train_cfg.section("train");
      options_ = trainer_options_from(section);
      net_ = device_->make_network(spec);
      net_->init(static_cast<std::uint64_t>(config_.get_int("data.seed")));
      trainer_.emplace(*net_, options_);
      global_ = FloatBuffer(spec.parameter_count());
      delta_ = FloatBuffer(spec.parameter_count());
    }
    const bool same_layout = w.shards.size() == shards_.size() &&
        std::equal(w.shards.begin(), w.shards.end(), shards_.begin(), [](const auto& a, const auto& b) {
          return a.begin == b.begin && a.end == b.end;
        });
    shards_ = w.shards;
    // One encoder per shard range, kept across rounds (and reconnects to the same layout): it holds
    // the error-feedback residuals and PowerSGD's warm start.
    if (compressor_ && (!same_layout || encoders_.size() != shards_.size())) {
      encoders_.clear();
      encoded_.assign(shards_.size(), {});
      for (const auto& s : shards_) {
        encoders_.push_back(std::make_unique<aggregation::PushEncoder>(*compressor_, s.end - s.begin));
      }
    }
    shard_eps_.clear();
    for (const auto& s : shards_) {
      if (s.index == 0) {
        shard_eps_.push_back(nullptr);  // the coordinator's own connection
        continue;
      }
      auto o = client_endpoint_options(config_, s.node_id);
      o.pool = pool_;
      shard_eps_.push_back(std::make_unique<Endpoint>(Endpoint::connect(ctx_, s.url, o)));
    }
    COHORT_LOG(Info) << name() << ": joined (" << w.model_spec << ", " << w.model_size
                     << " parameters, " << shards_.size() << " shards)";
  }

  Endpoint& shard_ep(std::size_t i) { return shard_eps_[i] ? *shard_eps_[i] : *coordinator_; }

  std::uint64_t bytes_sent() {
    std::uint64_t b = coordinator_->stats().bytes_sent;
    for (auto& e : shard_eps_) if (e) b += e->stats().bytes_sent;
    return b;
  }
  std::uint64_t bytes_received() {
    std::uint64_t b = coordinator_->stats().bytes_received;
    for (auto& e : shard_eps_) if (e) b += e->stats().bytes_received;
    return b;
  }

  // Sends `make(i)` to every shard and waits for each shard's answer that `accept` takes,
  // resending to shards that stay silent (exponential backoff) until `deadline`.
  // `patient`: the shard may hold the request on purpose (SSP/BSP), so resend only rarely.
  template <typename Make, typename Accept>
  bool exchange(Make make, Accept accept, Clock::time_point deadline, bool patient = false) {
    const std::size_t n = shards_.size();
    std::vector<bool> done(n, false);
    std::vector<Clock::time_point> resend(n);
    std::vector<std::chrono::milliseconds> backoff(n, patient ? 30000ms : 3000ms);
    auto send = [&](std::size_t i) {
      try {
        auto [env, payload] = make(i);
        shard_ep(i).send({}, std::move(env), payload);
      } catch (const TransportError& e) {
        COHORT_LOG(Info) << name() << ": shard " << i << " unreachable: " << e.what();
      }
      resend[i] = Clock::now() + backoff[i];
      backoff[i] = std::min(backoff[i] * 2, 20000ms);
    };
    for (std::size_t i = 0; i < n; ++i) send(i);
    while (std::count(done.begin(), done.end(), false) > 0) {
      if (stop_.load() || Clock::now() > deadline) return false;
      for (std::size_t i = 0; i < n; ++i) {
        if (done[i]) continue;
        auto m = shard_ep(i).receive(i == 0 || n == 1 ? 20ms : 5ms);
        if (m) {
          if (std::holds_alternative<transport::RoundStart>(m->envelope.body) ||
              std::holds_alternative<transport::Bye>(m->envelope.body)) {
            deferred_.push_back(std::move(*m));
          } else if (accept(i, *m)) {
            done[i] = true;
          }
        }
        if (!done[i] && Clock::now() >= resend[i]) send(i);
      }
    }
    return true;
  }

  void run_round(const transport::RoundStart& rs) {
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::milliseconds(rs.deadline_ms);
    const std::uint64_t sent0 = bytes_sent(), recv0 = bytes_received();
    transport::ClientReport report;
    report.round = rs.round;
    report.model_version = rs.model_version;
    // Pull every shard's range in parallel.
    auto params = net_->parameters();
    const bool pulled = exchange(
        [&](std::size_t i) {
          Envelope e;
          e.round = rs.round;
          e.body = transport::Pull{shards_[i].index, shards_[i].begin, shards_[i].end, rs.model_version};
          return std::pair{std::move(e), transport::Payload{}};
        },
        [&](std::size_t i, Message& m) {
          auto* r = std::get_if<transport::PullReply>(&m.envelope.body);
          if (!r || r->shard != shards_[i].index) return false;
          const std::size_t n = (r->end - r->begin);
          if (r->begin != shards_[i].begin || r->end != shards_[i].end || m.payload.size() != n * 4) {
            throw ProtocolError("shard " + std::to_string(i) + " sent a reply of the wrong shape");
          }
          std::memcpy(params.data() + r->begin, m.payload.data(), m.payload.size());
          return true;
        },
        deadline);
    if (!pulled) {
      report.message = "could not pull the model before the deadline";
      send_report(report);
      return;
    }
    const auto t_pulled = Clock::now();
    if (rs.evaluate_only) {
      auto eval = trainer_->evaluate(test_);
      report.evaluated = true;
      report.eval_loss = static_cast<float>(eval.loss);
      report.eval_accuracy = static_cast<float>(eval.accuracy);
      report.eval_count = eval.count;
      send_report(report);
      return;
    }
    std::copy(params.begin(), params.end(), global_.begin());
    // Shuffles depend on the model version and the partition, not on round ids, so the same
    // training happens under every server mode.
    const auto seed = static_cast<std::uint64_t>(config_.get_int("data.seed")) * 1000003ULL +
                      rs.model_version * 7919ULL + part_index_;
    const auto result = trainer_->train(train_, indices_, seed);
    const auto t_trained = Clock::now();
    auto trained = net_->parameters();
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = trained[i] - global_[i];
    // Client-level DP (ALGORITHMS.md 8.3, eq. 8.2): flat clipping of the whole delta.
    if (dp_clip_ > 0) (void)aggregation::clip_l2(delta_.span(), dp_clip_);
    // For robustness experiments only: a Byzantine client pushing -scale x its honest delta.
    if (attack_ == "sign_flip") {
      const auto f = static_cast<float>(-attack_scale_);
      for (auto& v : delta_.span()) v *= f;
    }
    // Encoded once per round, before any (re)send: encoding moves the error-feedback state.
    if (compressor_) {
      const auto seed = aggregation::compression_seed(
          static_cast<std::uint64_t>(config_.get_int("data.seed")), rs.round, part_index_);
      try {
        for (std::size_t i = 0; i < shards_.size(); ++i) {
          const auto& s = shards_[i];
          encoders_[i]->encode(delta_.span().subspan(s.begin, s.end - s.begin),
                               aggregation::compression_seed(seed, i, 0), encoded_[i]);
        }
      } catch (const KernelError& e) {  // a diverged client: tell the coordinator, send nothing
        report.message = std::string("update not sent: ") + e.what();
        send_report(report);
        return;
      }
    }
    const auto delta_bytes = std::as_bytes(delta_.span());
    std::vector<std::string> refusals;
    const bool pushed = exchange(
        [&](std::size_t i) {
          const auto& s = shards_[i];
          Envelope e;
          e.round = rs.round;
          const auto encoding = compressor_ ? push_encoding(encoders_[i]->format())
                                            : transport::Encoding::kDenseF32;
          e.body = transport::Push{s.index, s.begin, s.end, indices_.size(),
                                   rs.model_version, encoding,
                                   transport::PushKind::kDelta, static_cast<float>(result.mean_loss), 0,
                                   s.end - s.begin};
          const auto bytes = compressor_ ? std::span<const std::byte>(encoded_[i])
                                         : delta_bytes.subspan(s.begin * 4, (s.end - s.begin) * 4);
          return std::pair{std::move(e), transport::Payload{bytes, nullptr}};
        },
        [&](std::size_t, Message& m) {
          auto* a = std::get_if<transport::PushAck>(&m.envelope.body);
          if (!a || m.envelope.round != rs.round) return false;
          if (!a->accepted) refusals.push_back(a->reason);
          return true;
        },
        deadline);
    const auto t_pushed = Clock::now();
    report.trained = pushed && refusals.empty();
    if (!pushed) report.message = "could not push before the deadline";
    if (!refusals.empty()) report.message = "a shard refused the update: " + refusals.front();
    report.num_samples = indices_.size();
    report.train_loss = static_cast<float>(result.mean_loss);
    report.train_seconds = std::chrono::duration<float>(t_trained - t_pulled).count();
    report.comm_seconds = std::chrono::duration<float>((t_pulled - t0) + (t_pushed - t_trained)).count();
    report.bytes_sent = bytes_sent() - sent0;
    report.bytes_received = bytes_received() - recv0;
    send_report(report);
  }

  // Options that shape a federated delta have no data-parallel form: refused, not ignored.
  void check_dataparallel() const {
    if (compressor_) {
      throw ConfigError(
          "compressor.* does not apply to server.mode = dataparallel (gradients go uncompressed)");
    }
    if (dp_clip_ > 0) {
      throw ConfigError(
          "client.dp_clip does not apply to server.mode = dataparallel (it clips federated "
          "deltas, not gradients)");
    }
    if (attack_ != "none") {
      throw ConfigError("client.attack does not apply to server.mode = dataparallel");
    }
  }

  // Data-parallel: per step, pull the weights (the shards hold the pull until the consistency
  // model lets this worker's clock through), compute one batch's gradient, push it.
  void run_dataparallel(const transport::RoundStart& rs) {
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::milliseconds(rs.deadline_ms);
    const std::uint64_t sent0 = bytes_sent(), recv0 = bytes_received();
    transport::ClientReport report;
    report.round = rs.round;
    const std::size_t batch = std::max<std::uint32_t>(rs.batch_size, 1);
    const auto seed = static_cast<std::uint64_t>(config_.get_int("data.seed")) * 7919ULL + part_index_;
    const auto step_delay = std::chrono::milliseconds(config_.get_int("client.step_delay_ms"));
    std::vector<float> x(batch * train_.feature_dim()), dlogits;
    std::vector<std::int32_t> y(batch);
    double loss_sum = 0;
    double compute_s = 0;
    auto params = net_->parameters();
    for (std::uint64_t step = 0; step < rs.local_steps; ++step) {
      const bool pulled = exchange(
          [&](std::size_t i) {
            Envelope e;
            e.round = rs.round;
            e.body = transport::Pull{shards_[i].index, shards_[i].begin, shards_[i].end, step};
            return std::pair{std::move(e), transport::Payload{}};
          },
          [&](std::size_t i, Message& m) {
            auto* r = std::get_if<transport::PullReply>(&m.envelope.body);
            if (!r || r->shard != shards_[i].index || m.payload.size() != (r->end - r->begin) * 4) return false;
            std::memcpy(params.data() + r->begin, m.payload.data(), m.payload.size());
            return true;
          },
          deadline, /*patient=*/true);
      if (!pulled) {
        report.message = "could not pull at step " + std::to_string(step);
        break;
      }
      const auto c0 = Clock::now();
      const auto rows = dataparallel_batch(indices_, step, batch, seed);
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const auto row = train_.row(rows[r]);
        std::copy(row.begin(), row.end(), x.begin() + static_cast<std::ptrdiff_t>(r * row.size()));
        y[r] = train_.labels()[rows[r]];
      }
      const auto logits = net_->forward(x, rows.size(), true);
      dlogits.resize(logits.size());
      loss_sum += kernels::softmax_cross_entropy(logits, y, net_->output_size(), dlogits);
      net_->backward(dlogits);
      const auto grads = net_->gradients();
      const auto gbytes = std::as_bytes(grads);
      compute_s += std::chrono::duration<double>(Clock::now() - c0).count();
      COHORT_LOG(Debug) << name() << ": clock " << step;
      std::vector<std::string> refusals;
      const bool pushed = exchange(
          [&](std::size_t i) {
            const auto& s = shards_[i];
            Envelope e;
            e.round = rs.round;
            e.body = transport::Push{s.index, s.begin, s.end, rows.size(), step,
                                     transport::Encoding::kDenseF32, transport::PushKind::kGradient,
                                     0, step, s.end - s.begin};
            return std::pair{std::move(e), transport::Payload{gbytes.subspan(s.begin * 4, (s.end - s.begin) * 4), nullptr}};
          },
          [&](std::size_t, Message& m) {
            auto* a = std::get_if<transport::PushAck>(&m.envelope.body);
            if (!a || m.envelope.round != rs.round) return false;
            if (!a->accepted) refusals.push_back(a->reason);
            return true;
          },
          deadline, /*patient=*/true);
      if (!pushed || !refusals.empty()) {
        report.message = !pushed ? "could not push at step " + std::to_string(step)
                                 : "gradient refused: " + refusals.front();
        break;
      }
      if (step + 1 == rs.local_steps) report.trained = true;
      if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    }
    report.num_samples = rs.local_steps * batch;
    report.train_loss = rs.local_steps ? static_cast<float>(loss_sum / static_cast<double>(rs.local_steps)) : 0;
    report.train_seconds = static_cast<float>(compute_s);
    report.comm_seconds = std::chrono::duration<float>(Clock::now() - t0).count() - report.train_seconds;
    report.bytes_sent = bytes_sent() - sent0;
    report.bytes_received = bytes_received() - recv0;
    send_report(report);
  }

  void send_report(const transport::ClientReport& r) {
    last_report_ = r;
    Envelope e;
    e.round = r.round;
    e.body = r;
    try {
      coordinator_->send({}, std::move(e));
    } catch (const TransportError& err) {
      COHORT_LOG(Warn) << name() << ": report lost: " << err.what();
    }
  }

  const Config& config_;
  const std::atomic<bool>& stop_;
  transport::Context ctx_;
  ThreadPool* pool_ = nullptr;
  std::optional<Endpoint> coordinator_;
  std::optional<transport::ClientReport> last_report_;
  std::uint64_t coordinator_epoch_ = 0;  // of the coordinator that last welcomed this client
  std::uint64_t coordinator_handshakes_ = 0;
  std::uint64_t current_round_ = 0;  // of the last RoundStart, for a fatal report
  bool registered_ = false;
  std::vector<std::unique_ptr<Endpoint>> shard_eps_;
  std::vector<transport::ShardInfo> shards_;
  std::deque<Message> deferred_;
  std::chrono::milliseconds heartbeat_{2000};
  Dataset train_, test_;
  std::vector<std::uint32_t> indices_;
  std::string partition_text_;
  std::uint64_t part_index_ = 0;
  std::string model_spec_;
  TrainerOptions options_;
  std::unique_ptr<kernels::Device> device_;
  kernels::NetworkSpec spec_;  // outlives net_, which refers to it
  std::unique_ptr<kernels::Network> net_;
  std::optional<LocalTrainer> trainer_;
  FloatBuffer global_, delta_;
  std::unique_ptr<aggregation::Compressor> compressor_;  // null: plain fp32 pushes
  std::vector<std::unique_ptr<aggregation::PushEncoder>> encoders_;  // per shard, refer to compressor_
  std::vector<std::vector<std::byte>> encoded_;  // per shard: this round's payload, reused
  double dp_clip_ = 0;
  std::string attack_;
  double attack_scale_ = 1.0;
};

}  // namespace

ConfigSchema participant_config_schema() {
  ConfigSchema s;
  s.add("client.server", std::string("tcp://127.0.0.1:7000"), "url of the coordinator (shard 0)")
      .add("client.name", std::string("client-0"), "node id; must be the certificate's CN")
      .add("client.device", std::string("cpu"), "cpu or cuda:N")
      .add("client.threads", std::int64_t{1}, "CPU threads for local training (0: one per core; at most 1024)")
      .add("client.connect_timeout_ms", std::int64_t{120000}, "give up joining (or rejoining a lost coordinator) after this long")
      .add("client.backoff_max_ms", std::int64_t{5000}, "longest wait between retries")
      .add("client.step_delay_ms", std::int64_t{0}, "data-parallel: sleep after each step (to emulate a straggler)")
      .add("data.dir", std::string(kFashionMnistDir), "folder with the Fashion-MNIST IDX files")
      .add("data.partition", std::string("iid"), "iid | dirichlet:ALPHA | shards:S | quantity:BETA")
      .add("data.part", std::string("0/1"), "which part this client holds: I/N")
      .add("data.seed", std::int64_t{1}, "seed of the partition (equal on every client)")
      .add("client.dp_clip", 0.0,
           "client-level DP: clip the whole delta to this L2 norm before pushing (0: off; set it to "
           "the server's dp.clip)")
      .add("client.attack", std::string("none"),
           "FOR EXPERIMENTS ONLY: none | sign_flip (push -attack_scale x the honest delta, a "
           "Byzantine client for testing robust aggregators)")
      .add("client.attack_scale", 1.0, "FOR EXPERIMENTS ONLY: the scale of client.attack")
      .add_section("compressor",
                   "compression of pushed deltas: name = none | fp16 | bf16 | int8 | qsgd | topk | "
                   "randomk | sign | powersgd, with its options (k_fraction, k, s, bucket_size, norm, "
                   "chunk, stochastic, scaled, rank, cols, error_feedback); an unknown name or "
                   "option is an error");
  transport::add_transport_config(s);  // tls.*, transport.*
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
  return {order.begin() + static_cast<std::ptrdiff_t>(pos), order.begin() + static_cast<std::ptrdiff_t>(end)};
}

int run_participant(const Config& config, const std::atomic<bool>& stop) {
  Participant p(config, stop);
  return p.run();
}

}  // namespace cohort::client
