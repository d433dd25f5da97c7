#include "cohort/client/peer.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "client_options.h"
#include "cohort/aggregation/decentralized.h"
#include "cohort/client/idx.h"
#include "cohort/client/partition.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/zmq_comm.h"
#include "fatal_report.h"
#include "peer_learner.h"

namespace cohort::client {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace agg = cohort::aggregation;
using transport::Envelope;

class Peer {
 public:
  // The device is made here, before we bind or register: a bad one never takes a rank in the run.
  Peer(PeerOptions options, const std::atomic<bool>& stop)
      : options_(std::move(options)), stop_(stop), name_(options_.name) {
    device_ = kernels::make_device(options_.device, {.threads = options_.threads});
  }

  int run() {
    transport::Context& ctx = ctx_;
    comm_.emplace(ctx, 0, 1, options_.listen, options_.neighbours);
    std::string advertise = options_.advertise;
    if (advertise.empty()) advertise = comm_->url();
    coord_.emplace(transport::Endpoint::connect(ctx, options_.server, options_.coordinator));
    COHORT_LOG(Info) << name_ << ": listening on " << comm_->url() << ", joining "
                     << options_.server;

    // Loading the data takes seconds: before joining, so that heartbeats start at once after.
    data_ = load_data(options_.data, {FeatureScaling::Kind::kStandardize, 1.0});
    const transport::Welcome w = join(advertise);
    try {
      setup(w);
      train();
      return finish();
    } catch (const Error& e) {
      // Stopping for good: the coordinator takes us out of the topology at once, and its log
      // says why, instead of waiting for server.client_timeout_ms of silence.
      report_fatal(e.what());
      throw;
    }
  }

 private:
  transport::Welcome join(const std::string& advertise) {
    const auto deadline = Clock::now() + options_.connect_timeout;
    auto next_register = Clock::now();
    for (;;) {
      if (stop_.load()) throw TransportError("stopped before the decentralized run started");
      if (Clock::now() > deadline) {
        throw TimeoutError("no Welcome from the coordinator " + options_.server +
                           " (is cohort-server running with server.mode = decentralized?)");
      }
      if (Clock::now() >= next_register &&
          (coord_->is_ready() || options_.neighbours.security.insecure)) {
        transport::Register r;
        r.role = transport::Role::kPeer;
        r.listen_url = advertise;
        Envelope e;
        e.body = r;
        (void)coord_->send({}, std::move(e));
        next_register = Clock::now() + 2s;
      }
      if (!coord_->is_ready()) {
        try {
          coord_->wait_ready(200ms);
        } catch (const TimeoutError&) {
        } catch (const TransportError& e) {
          coordinator_refused(options_.server, options_.coordinator_name, e.what());
        }
        comm_->pump(0ms);
        continue;
      }
      comm_->pump(0ms);  // answer neighbours' handshakes while we wait
      auto m = coord_->receive(100ms);
      if (!m) continue;
      if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) return *w;
      if (auto* err = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
        throw TransportError("the coordinator refused us: " + err->message);
      }
    }
  }

  void apply_members(const transport::Welcome& w, std::uint64_t now) {
    std::vector<transport::PeerAddress> peers(w.shards.size());
    std::set<Rank> gone;
    for (const auto& s : w.shards) {
      if (s.index >= peers.size()) throw ProtocolError("a member list with a bad rank");
      peers[s.index] = {s.url, s.node_id};
      if (s.url.empty()) gone.insert(s.index);
    }
    comm_->set_peers(peers);
    if (!gossip_) return;
    for (Rank r : gone) {
      if (!gossip_->gone().contains(r)) {
        COHORT_LOG(Info) << name_ << ": rank " << r << " is gone; mixing without it";
        comm_->forget(r);
      }
    }
    std::set<Rank> keep = gone;
    for (Rank r : gossip_->gone()) {
      if (!gone.contains(r)) {
        // Back: it starts at w.current_round; until then we keep it out.
        rejoin_at_[r] = std::max<std::uint64_t>(w.current_round, now);
        keep.insert(r);
      }
    }
    gossip_->set_gone(keep);
  }

  void setup(const transport::Welcome& w) {
    rank_ = w.client_index;
    n_ = static_cast<Rank>(w.shards.size());
    comm_->set_rank(rank_);
    ConfigSchema schema;
    schema.add_section("decentralized", "");
    Config cfg(schema);
    cfg.merge_toml("[decentralized]\n" + w.training_toml,
                   "the coordinator's [decentralized] section");
    settings_ = agg::decentralized_settings_from(
        cfg.section("decentralized"),
        [](const std::string& spec) { (void)parse_partition_spec(spec); });
    steps_ = settings_.steps;
    lr_ = static_cast<float>(settings_.lr);
    heartbeat_ = std::chrono::milliseconds(std::max<std::uint32_t>(100, w.heartbeat_ms));
    start_ = w.current_round;
    step_delay_ = options_.step_delay;

    topology_ = agg::make_topology(settings_);
    auto opt = agg::make_optimizer(settings_, agg::make_compressor(settings_));
    agg::GossipOptions go;
    go.timeout = settings_.gossip_timeout;
    go.staleness = settings_.staleness;
    gossip_.emplace(*comm_, *topology_, go);
    apply_members(w, start_);

    const auto seed = options_.data_seed;
    const std::string partition =
        settings_.partition.empty() ? options_.partition : settings_.partition;
    const auto parts =
        make_partition(parse_partition_spec(partition), data_.train.labels(), n_, seed);
    spec_ = kernels::make_network_spec(w.model_spec);
    learner_.emplace(*device_, spec_, data_.train, parts[rank_], settings_.batch,
                     seed * 1000003ULL + rank_, seed, std::move(opt));
    COHORT_LOG(Info) << name_ << ": rank " << rank_ << " of " << n_ << ", " << settings_.algorithm
                     << " on " << topology_->name() << ", " << learner_->samples()
                     << " rows, steps " << start_ << ".." << steps_;
  }

  void report_fatal(const std::string& why) {
    if (!coord_ || !coord_->is_ready()) return;
    send_fatal_report(*coord_, learner_ ? last_step_ : 0, why, name_);
  }

  void pump_coordinator(std::uint64_t t) {
    while (auto m = coord_->receive(0ms)) {
      if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) {
        apply_members(*w, t);
      } else if (auto* err = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
        COHORT_LOG(Warn) << name_ << ": coordinator says: " << err->message;
      } else if (std::get_if<transport::RoundClose>(&m->envelope.body)) {
        closed_ = true;
      }
    }
    if (Clock::now() >= next_heartbeat_) {
      Envelope e;
      e.body = transport::Heartbeat{t, 0};
      (void)coord_->send({}, std::move(e));
      next_heartbeat_ = Clock::now() + heartbeat_;
    }
  }

  void train() {
    double loss_sum = 0;
    std::size_t loss_count = 0;
    for (std::uint64_t t = start_; t < steps_; ++t) {
      if (stop_.load()) return;
      pump_coordinator(t);
      for (auto it = rejoin_at_.begin(); it != rejoin_at_.end();) {
        if (it->second <= t) {
          COHORT_LOG(Info) << name_ << ": rank " << it->first << " rejoins at step " << t;
          gossip_->rejoin(it->first, t);
          it = rejoin_at_.erase(it);
        } else {
          ++it;
        }
      }
      last_step_ = t;
      loss_sum += learner_->step(t, lr_, *gossip_);
      ++loss_count;
      if ((t + 1) % 50 == 0 || t + 1 == steps_) {
        COHORT_LOG(Info) << name_ << ": step " << (t + 1) << "/" << steps_ << " loss "
                         << loss_sum / static_cast<double>(loss_count);
        last_loss_ = loss_sum / static_cast<double>(loss_count);
        loss_sum = 0;
        loss_count = 0;
      }
      if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
    }
  }

  int finish() {
    if (stop_.load()) {
      Envelope e;
      e.body = transport::Bye{"stopped"};
      (void)coord_->send({}, std::move(e));
      coord_->receive(200ms);
      return 0;
    }
    const EvalResult eval = learner_->evaluate(data_.test);
    transport::ClientReport rep;
    rep.round = steps_;
    rep.trained = true;
    rep.num_samples = learner_->samples();
    rep.train_loss = static_cast<float>(last_loss_);
    rep.evaluated = true;
    rep.eval_loss = static_cast<float>(eval.loss);
    rep.eval_accuracy = static_cast<float>(eval.accuracy);
    rep.eval_count = eval.count;
    rep.bytes_sent = comm_->bytes_sent();
    rep.bytes_received = comm_->bytes_received();
    std::printf(
        "{\"peer\":\"%s\",\"rank\":%u,\"steps\":%llu,\"test_accuracy\":%.6f,"
        "\"bytes_sent\":%llu}\n",
        name_.c_str(), rank_, static_cast<unsigned long long>(steps_), eval.accuracy,
        static_cast<unsigned long long>(comm_->bytes_sent()));
    std::fflush(stdout);
    // Stay until the coordinator closes the run: slower neighbours may still need our session.
    const auto deadline = Clock::now() + options_.connect_timeout;
    auto next_report = Clock::now();
    while (!closed_ && !stop_.load() && Clock::now() < deadline) {
      if (Clock::now() >= next_report) {
        Envelope e;
        e.body = rep;
        (void)coord_->send({}, std::move(e));
        next_report = Clock::now() + 2s;
      }
      pump_coordinator(steps_);
      comm_->pump(50ms);
    }
    return 0;
  }

  const PeerOptions options_;
  const std::atomic<bool>& stop_;
  NodeId name_;
  transport::Context ctx_;  // outlives every socket below
  std::optional<transport::ZmqComm> comm_;
  std::optional<transport::Endpoint> coord_;
  Rank rank_ = 0, n_ = 1;
  agg::DecentralizedSettings settings_;
  std::uint64_t steps_ = 0, start_ = 0, last_step_ = 0;
  float lr_ = 0.05f;
  std::chrono::milliseconds heartbeat_{1000}, step_delay_{0};
  Clock::time_point next_heartbeat_{};
  std::unique_ptr<agg::Topology> topology_;
  std::optional<agg::Gossip> gossip_;
  std::map<Rank, std::uint64_t> rejoin_at_;
  TrainTest data_;
  kernels::NetworkSpec spec_;
  std::unique_ptr<kernels::Device> device_;
  std::optional<PeerLearner> learner_;
  double last_loss_ = 0;
  bool closed_ = false;
};

}  // namespace

void add_peer_config(ConfigSchema& schema) {
  schema
      .add("client.mode", std::string("federated"),
           "federated | decentralized (peer-to-peer, no parameter server)")
      .add("peer.listen", std::string("tcp://127.0.0.1:*"),
           "decentralized: url this peer binds for its neighbours")
      .add("peer.advertise", std::string(""),
           "decentralized: url neighbours dial (default: the bound url)")
      .add("peer.handshake_timeout_ms", std::int64_t{10000},
           "decentralized: first-contact handshake limit (ms, >= 1)");
}

int run_peer(const PeerOptions& options, const std::atomic<bool>& stop) {
  Peer p(options, stop);
  return p.run();
}

}  // namespace cohort::client
