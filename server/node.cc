// cohort-server's process: options checked at the edge, the endpoints, and the loop that hands
// each received message to the shard or the coordinator. The only file of the server that
// touches a transport::Endpoint; the shard and coordinator send through EndpointOutbox.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/tensorboard.h"
#include "cohort/core/thread_pool.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/network.h"
#include "cohort/server/server.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/secagg_messages.h"

#include "coordinator.h"
#include "mode.h"
#include "options.h"
#include "outbox.h"
#include "rendezvous.h"
#include "round_report.h"
#include "server_options.h"
#include "shard.h"
#include "telemetry.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;

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

// The Outbox of the shard and coordinator: the listening endpoint.
class EndpointOutbox final : public Outbox {
 public:
  explicit EndpointOutbox(Endpoint& ep) : ep_(ep) {}
  using Outbox::send;
  bool send(const transport::PeerHandle& peer, Envelope envelope,
            transport::Payload payload) override {
    return ep_.send(peer, std::move(envelope), std::move(payload)).has_value();
  }

 private:
  Endpoint& ep_;
};

// What run() checks before it opens a socket (and before server_options_from(), whose
// server.consistency error comes after these).
void check_options(const Config& config) {
  const auto shards = static_cast<std::uint32_t>(config.get_int("server.shards"));
  const auto index = static_cast<std::uint32_t>(config.get_int("server.shard"));
  if (shards < 1 || index >= shards) {
    throw ConfigError("server.shard must be in [0, server.shards)");
  }
  std::string name = config.get_string("server.name");
  if (name.empty()) name = "shard-" + std::to_string(index);
  if (index == 0 && name != config.get_string("tls.coordinator_name")) {
    throw ConfigError(
        "shard 0 is the coordinator, and clients and shards accept only the name "
        "tls.coordinator_name = '" +
        config.get_string("tls.coordinator_name") + "', but server.name is '" + name +
        "': set both alike");
  }
  if (index > 0 && config.get_string("server.coordinator").empty()) {
    throw ConfigError("shard " + std::to_string(index) +
                      " needs --coordinator (the url of shard 0)");
  }
}

// The dp.* options' ranges, and that DP applies to federated rounds only.
void check_dp_options(const DpOptions& dp, Modes modes) {
  const double dp_clip = dp.clip, dp_noise = dp.noise_multiplier;
  if (!(dp_clip >= 0) || !std::isfinite(dp_clip)) throw ConfigError("dp.clip must be >= 0");
  if (!(dp_noise >= 0) || !std::isfinite(dp_noise))
    throw ConfigError("dp.noise_multiplier must be >= 0");
  if (dp_noise > 0 && dp_clip == 0)
    throw ConfigError("dp.noise_multiplier needs dp.clip > 0 (the sensitivity)");
  if (const double d = dp.delta; !(d > 0 && d < 1)) throw ConfigError("dp.delta must be in (0, 1)");
  if (dp_clip > 0 && modes.mode != transport::TrainingMode::kFederated) {
    throw ConfigError("dp.clip applies to server.mode = federated only");
  }
}

// The listening endpoint's options.
transport::EndpointOptions listen_options(const ServerOptions& options, ThreadPool& pool) {
  auto opts = options.transport.endpoint;
  opts.pool = &pool;
  opts.deliver_chunks = true;  // pushes stream into the aggregator chunk by chunk
  // In one process (cohort-sim) a fleet socket may speak for many virtual clients.
  opts.multiplex = options.node.listen.rfind("inproc://", 0) == 0;
  set_listener_receive_queue(options.transport.receive_queue, opts);
  return opts;
}

// One server process: shard `index`, and on shard 0 the coordinator. Owns the endpoints.
class Node {
 public:
  // `options` must outlive the node.
  Node(const ServerOptions& options, const Registries& registries, transport::Context& ctx,
       ThreadPool& pool, std::shared_ptr<const VirtualPopulation> population)
      : options_(options),
        index_(options.node.index),
        name_(options.node.name),
        ep_(Endpoint::bind(ctx, options.node.listen, listen_options(options, pool))),
        out_(ep_) {
    write_port_file(options.node.port_file, ep_.url());
    COHORT_LOG(Info) << name_ << " listening on " << ep_.url()
                     << (ep_.is_secure() ? " (TLS)" : " (plaintext)");
    if (index_ == 0) {
      metrics_.emplace(options.metrics_file);
      if (!options.tensorboard_dir.empty()) {
        tensorboard_.emplace(options.tensorboard_dir, round_scalars());
        tensorboard_->attach(*metrics_);
        COHORT_LOG(Info) << "TensorBoard scalars to " << tensorboard_->path().string();
      }
    }
    telemetry_.emplace(options, index_);
    if (metrics_) telemetry_->watch(*metrics_);
    http_ = start_http(options.http, telemetry_->store());
    shard_.emplace(options, registries, out_, metrics_ ? &*metrics_ : nullptr);
    if (index_ == 0) {
      const std::string& spec = options.model.spec;
      shard_->setup(spec, kernels::make_network_spec(spec).parameter_count());
      coordinator_.emplace(options, *shard_, out_, clock_, name_, ep_.url(), *metrics_,
                           std::move(population));
    } else {
      auto up = options.transport.endpoint;
      // Only the federation's coordinator may drive this shard: any other certificate of the same
      // CA is refused in the handshake.
      up.security.expected_peer = options.transport.tls.coordinator_name;
      upstream_.emplace(Endpoint::connect(ctx, options.node.coordinator, up));
    }
  }

  // Serves until training is finished (0), a fatal error (throws TrainingError), or `stop`.
  int serve(const std::atomic<bool>& stop);

 private:
  void register_upstream();
  // A message from the coordinator (shards 1..n-1); true when it said training is finished.
  bool on_upstream(Message& m);
  void on_secagg(Message& m, const transport::SecAgg& sa);
  // About once a second: the HTTP endpoint's figures; shards > 0 send theirs to shard 0.
  void refresh_telemetry();
  // Training is over: a last refresh, and server.http_linger_ms more of serving the endpoint.
  void linger(const std::atomic<bool>& stop);
  // A message on the listening endpoint: the shard's, else the coordinator's, else refused.
  void on_listener(Message& m);

  const ServerOptions& options_;
  std::uint32_t index_;
  std::string name_;
  SteadyClock clock_;
  Endpoint ep_;
  EndpointOutbox out_;
  std::optional<TensorBoardScalars> tensorboard_;  // shard 0 with metrics.tensorboard_dir
  std::optional<ServerTelemetry> telemetry_;       // before metrics_: its observer
  std::unique_ptr<observe::HttpServer> http_;      // after telemetry_, which it serves
  TimePoint next_refresh_;
  std::optional<MetricsSink> metrics_;  // after tensorboard_: it may write there
  std::optional<Shard> shard_;
  std::optional<Coordinator> coordinator_;
  std::optional<Endpoint> upstream_;
  bool welcomed_ = false;
};

void Node::register_upstream() {
  transport::Register r;
  r.role = transport::Role::kShard;
  r.shard_index = index_;
  r.listen_url = options_.node.advertise.empty() ? ep_.url() : options_.node.advertise;
  Envelope e;
  e.body = r;
  upstream_->send({}, std::move(e));
}

bool Node::on_upstream(Message& m) {
  Shard& shard = *shard_;
  if (auto* w = std::get_if<transport::Welcome>(&m.envelope.body)) {
    if (!welcomed_) shard.setup(w->model_spec, w->model_size);
    welcomed_ = true;
    shard.on_welcome(w->coordinator_epoch, w->current_round);
  } else if (auto* ro = std::get_if<transport::RoundOpen>(&m.envelope.body)) {
    shard.open_round(ro->round, ro->clients);
  } else if (auto* rc = std::get_if<transport::RoundClose>(&m.envelope.body)) {
    Envelope a;
    a.round = rc->round;
    if (rc->prepare) {
      auto p = shard.prepare_round(rc->round);
      a.body = transport::PushAck{.accepted = p.ok,
                                  .reason = std::move(p.reason),
                                  .version = shard.version(),
                                  .prepared = true};
    } else {
      const auto v = shard.close_round(rc->round, rc->commit);
      a.body = transport::PushAck{.accepted = true, .reason = "", .version = v, .prepared = false};
    }
    upstream_->send({}, std::move(a));
  } else if (auto* sa = std::get_if<transport::SecAgg>(&m.envelope.body)) {
    on_secagg(m, *sa);
  } else if (std::holds_alternative<transport::Bye>(m.envelope.body)) {
    COHORT_LOG(Info) << name_ << ": the coordinator says training is finished";
    return true;
  } else if (auto* err = std::get_if<transport::ErrorBody>(&m.envelope.body)) {
    COHORT_LOG(Warn) << "coordinator: " << err->message;
  }
  return false;
}

// Secure aggregation, from the coordinator: whose masked inputs this shard holds (answered), or
// the seeds that remove their masks.
void Node::on_secagg(Message& m, const transport::SecAgg& sa) {
  Shard& shard = *shard_;
  if (sa.stage == transport::SecAggStage::kHeld) {
    transport::SecAggData held;
    for (auto& node : shard.secagg_held(sa.round))
      held.members.push_back({.node = std::move(node)});
    auto bytes = std::make_shared<std::vector<std::byte>>(transport::encode_secagg(held));
    Envelope a;
    a.round = sa.round;
    a.body = transport::SecAgg{.round = sa.round, .stage = transport::SecAggStage::kHeld};
    upstream_->send({}, std::move(a), transport::Payload{*bytes, bytes});
  } else if (sa.stage == transport::SecAggStage::kSeeds && m.complete && m.offset == 0) {
    shard.secagg_seeds(sa.round, transport::decode_secagg(m.payload.span()));
  }
}

void Node::refresh_telemetry() {
  const auto start = clock_.now();
  telemetry_->refresh(ep_.stats(), shard_->stats());
  if (coordinator_) telemetry_->refresh(coordinator_->snapshot());
  if (upstream_ && welcomed_ && upstream_->is_ready()) {
    auto bytes = std::make_shared<std::vector<std::byte>>(telemetry_->encode_samples());
    Envelope e;
    e.body = transport::Telemetry{.shard = index_};
    upstream_->send({}, std::move(e), transport::Payload{*bytes, bytes});
  }
  telemetry_->add_refresh_time(std::chrono::duration<double>(clock_.now() - start).count());
}

void Node::linger(const std::atomic<bool>& stop) {
  refresh_telemetry();
  if (!http_ || options_.http.linger.count() == 0) return;
  COHORT_LOG(Info) << name_ << ": serving " << http_->url() << " for "
                   << options_.http.linger.count() << " ms more (server.http_linger_ms)";
  // The listener stays read: the other shards' last figures come in now. Other messages are
  // answered by nobody (training is over).
  const auto until = clock_.now() + options_.http.linger;
  Endpoint* listener[] = {&ep_};
  while (!stop.load() && clock_.now() < until) {
    if (Endpoint::poll(listener, 50ms) < 0) continue;
    auto m = ep_.receive(0ms);
    if (!m || !std::holds_alternative<transport::Telemetry>(m->envelope.body)) continue;
    try {
      on_listener(*m);
    } catch (const ProtocolError& e) {
      COHORT_LOG(Warn) << "dropped a message from " << m->sender << ": " << e.what();
    }
    refresh_telemetry();
  }
}

void Node::on_listener(Message& m) {
  if (const auto* t = std::get_if<transport::Telemetry>(&m.envelope.body)) {
    // Only a shard of this federation speaks for itself; anything else is dropped.
    if (coordinator_ && m.complete && m.offset == 0 &&
        coordinator_->shard_of(m.sender) == t->shard) {
      telemetry_->on_remote(t->shard, m.payload.span());
    }
    return;
  }
  if (shard_->ready() && shard_->handle(m)) return;
  if (coordinator_ && coordinator_->handle(m)) return;
  if (std::holds_alternative<transport::ErrorBody>(m.envelope.body)) return;
  Envelope e;
  e.body = transport::ErrorBody{
      .code = transport::ErrorCode::kMalformed,
      .message = std::string("unexpected ") + std::string(transport::body_name(m.envelope.body)),
      .ref_seq = m.envelope.seq};
  ep_.send(m.peer, std::move(e));
}

int Node::serve(const std::atomic<bool>& stop) {
  std::uint64_t upstream_handshakes = 0;
  auto next_register = clock_.now();
  std::vector<Endpoint*> endpoints{&ep_};
  if (upstream_) endpoints.push_back(&*upstream_);
  while (!stop.load()) {
    if (upstream_) {
      // (Re-)register with the coordinator whenever the session is new or we are not welcomed.
      const auto hs = upstream_->stats().handshakes;
      if ((hs != upstream_handshakes || !welcomed_) && clock_.now() >= next_register) {
        try {
          register_upstream();
          upstream_handshakes = upstream_->stats().handshakes;
        } catch (const TransportError& e) {
          COHORT_LOG(Warn) << "cannot reach the coordinator yet: " << e.what();
        }
        next_register = clock_.now() + 1s;
      }
    }
    const int ready = Endpoint::poll(endpoints, 50ms);
    if (ready >= 0) {
      auto m = endpoints[static_cast<std::size_t>(ready)]->receive(0ms);
      if (m) {
        try {
          if (ready == 1) {  // from the coordinator
            if (on_upstream(*m)) {
              shard_->checkpoint();
              linger(stop);
              return 0;
            }
          } else {
            on_listener(*m);
          }
        } catch (const ProtocolError& e) {
          COHORT_LOG(Warn) << "dropped a message from " << m->sender << ": " << e.what();
        }
      }
    }
    if (clock_.now() >= next_refresh_) {
      refresh_telemetry();
      next_refresh_ = clock_.now() + 1s;
    }
    if (coordinator_) {
      coordinator_->tick();
      if (coordinator_->finished()) {
        shard_->checkpoint();
        std::this_thread::sleep_for(300ms);  // let the goodbyes leave
        linger(stop);
        if (!coordinator_->failure().empty()) throw TrainingError(coordinator_->failure());
        return 0;
      }
    }
  }
  COHORT_LOG(Info) << name_ << ": stopping (signal); writing a checkpoint";
  shard_->checkpoint();
  return 0;
}

}  // namespace

int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop) {
  transport::Context ctx;
  return run(config, registries, stop, ctx);
}

int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop,
        transport::Context& ctx) {
  return run(config, registries, stop, ctx, InProcessOverrides{});
}

int run(const Config& config, const Registries& registries, const std::atomic<bool>& stop,
        transport::Context& ctx, const InProcessOverrides& overrides) {
  validate(config, registries);
  if (config.get_string("server.mode") == "decentralized") {
    return run_rendezvous(rendezvous_options_from(config), stop, ctx);
  }
  check_options(config);
  // The edge: from here on the server reads typed options, never the Config.
  ServerOptions options = server_options_from(config);
  options.http.source = overrides.http_source;
  if (overrides.plan_deadline_ms > 0) {
    options.work.plan_deadline_s = static_cast<double>(overrides.plan_deadline_ms) / 1e3;
  }
  (void)kernels::make_network_spec(options.model.spec)
      .parameter_count();  // validates the spec early
  check_dp_options(options.dp, options.modes);
  ThreadPool pool(2);
  Node node(options, registries, ctx, pool, overrides.population);
  return node.serve(stop);
}

}  // namespace cohort::server
