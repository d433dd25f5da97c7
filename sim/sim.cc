// cohort-sim's engine.
//
// Design
// ------
// The server is the real one: every shard runs cohort::server::run() on its own thread with an
// inproc:// listen url, in the process's one ZeroMQ context, unchanged in behaviour (the round
// state machine, selection, deadlines, streaming FedAvg and its metrics are those of
// cohort-server).
//
// The clients are a "fleet": one multiplexed DEALER per shard, owned by the fleet's thread,
// speaks for all N virtual clients (EndpointOptions::multiplex, plaintext inproc only). Each
// message carries the virtual client's node id as its sender; the shard's ROUTER gives every
// (connection, sender) pair its own peer handle, and replies through it name the virtual client
// in Envelope.recipient, so the fleet routes them. 10,000 clients therefore cost 10,000 ids,
// partitions and profiles, not 10,000 sockets (ZeroMQ's default limit is 1,023 per context, and
// each costs file descriptors). A virtual client holds its partition's row indices and a profile
// (~50 bytes). The model is pulled once per version and shared read-only by the clients that
// start from it (a federated round's model changes only when the round closes); a delta buffer
// exists only for each client in flight (a window of up to 64, within 64 MiB), sent zero-copy;
// and each training thread owns one network and trainer, so memory grows with the threads and
// the selected cohort, not with the registered clients.
//
// The protocol is the participant's (participant.cc): Register -> Welcome, and per RoundStart:
// Pull from every shard (once per model version, for all the clients that start from it), local
// training, Push of the delta to every shard, PushAck, ClientReport; evaluate_only rounds pull
// (or share) the model and evaluate on the test set.
//
// Virtual clock (sim_clock.h): when a round's RoundStarts are in, the fleet knows the selected
// cohort; from each client's profile, the bytes of its pulls and pushes and its training work it
// computes the simulated finish times, and plan_round() applies the coordinator's closing rule in
// simulated time. Clients that make the cut (the first K by simulated finish) run the protocol
// and report in time; later ones ("cut") and those past the deadline ("stragglers") pull and
// report that they missed the round; offline and dropped-out clients stay silent, as real ones
// would, so the real coordinator closes the round at its (real-time) deadline,
// sim.wall_deadline_ms, with the rest. server.round_deadline_ms is the deadline on the simulated
// clock.
//
// Determinism: selection is the coordinator's seeded sampler over all N registered clients
// (server.min_clients = N). The profile, availability and dropout of a client in a round are
// functions of (sim.seed, client, round). Training seeds are the participant's. Who completes is
// decided on the simulated clock, never by thread timing. FedAvg sums in double, and double
// addition is not associative, so the fleet pushes the completed updates strictly in client-id
// order (a reorder window behind the training threads) and sends reports in that order too. The
// metrics files then differ between runs only in fields named wall_*.
#include "cohort/sim/sim.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cohort/client/idx.h"
#include "cohort/client/partition.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/metrics.h"
#include "cohort/core/thread_pool.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/server/server.h"
#include "cohort/transport/endpoint.h"
#include "sim_clock.h"

namespace cohort::client::sim {
namespace {

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU time of the calling thread: local training's compute, not counting time the thread spent
// preempted by the fleet, the shards or the other training threads.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  return buf;
}

std::string human_duration(double s) {
  char buf[32];
  if (s >= 86400)
    std::snprintf(buf, sizeof buf, "%.1fd", s / 86400);
  else if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%.1fm", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

// Server keys cohort-sim sets itself for its in-process shards (not in its schema).
bool set_by_sim(std::string_view key) {
  for (std::string_view k :
       {"server.shard", "server.listen", "server.coordinator", "server.advertise", "server.name",
        "server.port_file", "server.min_clients", "server.client_timeout_ms"}) {
    if (key == k) return true;
  }
  return key.rfind("tls.", 0) == 0;
}

// The server's configuration for shard `index` of the simulation.
Config shard_config(const Config& sim, std::uint32_t index, const std::vector<std::string>& urls) {
  const ConfigSchema schema = server::config_schema();
  Config c(schema);
  for (const auto& o : schema.options()) {
    // Only what the simulation's file or flags set: the server refuses a key its mode cannot
    // honour, and its defaults are the simulation's.
    if (set_by_sim(o.key) || !sim.is_set(o.key)) continue;
    c.set_value(o.key, [&]() -> Value {
      switch (o.type) {
        case ValueType::kBool:
          return sim.get_bool(o.key);
        case ValueType::kInt:
          return sim.get_int(o.key);
        case ValueType::kDouble:
          return sim.get_double(o.key);
        case ValueType::kString:
          return sim.get_string(o.key);
      }
      return sim.get_string(o.key);
    }());
  }
  for (const char* section : {"train", "aggregator", "server_optimizer"}) {
    const auto s = sim.section(section);
    for (const auto& name : s.names())
      c.set(std::string(section) + "." + name, s.get_string(name, ""));
  }
  c.set_value("server.shard", std::int64_t{index});
  c.set_value("server.listen", urls[index]);
  c.set_value("server.advertise", urls[index]);
  c.set_value("server.coordinator", index == 0 ? std::string() : urls[0]);
  c.set_value("server.name", "shard-" + std::to_string(index));
  c.set_value("server.port_file", std::string());
  c.set_value("server.min_clients", sim.get_int("sim.clients"));
  c.set_value("server.round_deadline_ms", sim.get_int("sim.wall_deadline_ms"));
  c.set_value("server.client_timeout_ms", std::int64_t{1} << 40);  // virtual clients never time out
  c.set_value("tls.insecure", true);
  if (index != 0) c.set_value("server.metrics_file", std::string());
  return c;
}

// A training thread's network and trainer; the fleet keeps one per thread.
struct Slot {
  std::unique_ptr<kernels::Network> net;
  std::optional<LocalTrainer> trainer;
};

struct RoundRecord {
  std::uint64_t seq = 0, round_id = 0;
  std::size_t selected = 0, completed = 0, cut = 0, stragglers = 0, silent = 0;
  bool committed = false;
  double sim_round_s = 0, sim_total_s = 0;
  double loss_sum = 0;
  std::uint64_t samples = 0, bytes = 0;
  double wall_round_s = 0, wall_train_s = 0, wall_train_cpu_s = 0;
  bool evaluated = false;
  double test_loss = 0, test_accuracy = 0;
};

class Fleet {
 public:
  Fleet(const Config& config, transport::Context& ctx, const std::vector<std::string>& urls,
        const std::atomic<bool>& stop, const std::function<bool()>& shards_failed)
      : config_(config),
        ctx_(ctx),
        urls_(urls),
        stop_(stop),
        shards_failed_(shards_failed),
        pool_(config.get_int("sim.threads") > 0
                  ? static_cast<std::size_t>(config.get_int("sim.threads"))
                  : 0),
        metrics_(config.get_string("sim.metrics_file")) {
    n_ = static_cast<std::size_t>(config.get_int("sim.clients"));
    seed_ = static_cast<std::uint64_t>(config.get_int("sim.seed"));
    k_ = static_cast<std::size_t>(
        std::max<std::int64_t>(1, config.get_int("server.clients_per_round")));
    min_updates_ =
        static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.min_updates")));
    deadline_s_ = static_cast<double>(config.get_int("server.round_deadline_ms")) / 1e3;
    rounds_ = static_cast<std::uint64_t>(config.get_int("server.rounds"));
    const std::size_t want = static_cast<std::size_t>(
        std::ceil(static_cast<double>(k_) * config.get_double("server.overselect")));
    expected_selected_ = std::min(std::max<std::size_t>(want, 1), n_);
    progress_ = config.get_bool("sim.progress");
    tty_ = isatty(fileno(stderr)) != 0;
    width_ = std::max<std::size_t>(5, std::to_string(n_ > 0 ? n_ - 1 : 0).size());
    const auto csv = config.get_string("sim.csv_file");
    if (!csv.empty()) {
      csv_.open(csv, std::ios::trunc);
      if (!csv_) throw ConfigError("cannot write sim.csv_file " + csv);
      csv_ << "round,round_id,committed,selected,completed,cut,stragglers,silent,train_loss,"
              "test_loss,test_accuracy,bytes,total_bytes,sim_round_seconds,sim_seconds,"
              "wall_round_seconds,wall_train_seconds,wall_seconds\n";
    }
  }

  Summary run() {
    started_ = Clock::now();
    load();
    transport::EndpointOptions o;
    o.node_id = "sim-fleet";
    o.security.insecure = true;
    o.multiplex = true;
    o.chunk_bytes = static_cast<std::size_t>(config_.get_int("transport.chunk_kib")) * 1024;
    for (const auto& url : urls_)
      eps_.push_back(std::make_unique<Endpoint>(Endpoint::connect(ctx_, url, o)));
    for (auto& e : eps_) ep_ptrs_.push_back(e.get());
    registered_.assign(n_, false);
    while (!finished_) {
      if (stop_.load()) break;
      if (shards_failed_())
        throw InternalError("a server shard of the simulation failed (see its log)");
      drive_registration();
      // While the training threads have more queued work than threads, a result can wait a few
      // milliseconds (its push goes out in order anyway): waking every millisecond then costs the
      // training threads more than it saves. Near the end of a round every millisecond counts.
      const bool busy = in_flight_ > 0;
      const bool queued = training_ > pool_.size();
      const int ready = Endpoint::poll(ep_ptrs_, !busy ? 20ms : queued ? 5ms : 1ms);
      if (ready >= 0) {
        for (std::size_t i = 0; i < eps_.size(); ++i) {
          while (auto m = eps_[i]->receive(0ms)) dispatch(*m);
        }
      }
      collect_results();
      // Plan, then start: a round planned now starts its jobs before the next wait; and when
      // advance() closes the active round, the next one (its RoundStarts are usually in by then)
      // is planned and started at once, not after a poll timeout.
      for (int pass = 0; pass < 2; ++pass) {
        check_stalled_collection();
        const bool was_active = active_.has_value();
        advance();
        if (!was_active || active_) break;
      }
      progress_line(false);
    }
    if (active_) {
      // Training finished at the last round's K-th update: its cut and late clients need not
      // report any more (their bytes are counted from the plan either way).
      for (auto& j : active_->jobs) {
        if (!j->done && j->pulls_pending + j->acks_pending > 0) --in_flight_;
        j->done = true;
      }
      close_active();
    }
    flush_records(true);
    if (progress_ && tty_) std::fputc('\n', stderr);
    summary_.wall_seconds = seconds_since(started_);
    summary_.threads = pool_.size();
    return summary_;
  }

  // After training: keep reading (the coordinator says goodbye to every client) until the shards
  // have returned, so no shard blocks on a full queue.
  void drain_until(const std::function<bool()>& done) {
    const auto until = Clock::now() + 30s;
    while (!done() && Clock::now() < until) {
      if (Endpoint::poll(ep_ptrs_, 20ms) >= 0) {
        for (auto& e : eps_)
          while (e->receive(0ms)) {
          }
      }
    }
  }

 private:
  struct Job {
    enum class Kind { kTrain, kPullOnly, kEvaluate };
    Kind kind = Kind::kTrain;
    std::uint32_t client = 0;
    transport::RoundStart rs;
    Fate fate = Fate::kCompletes;
    ClientTime time;
    std::shared_ptr<const FloatBuffer> model;  // the round's pulled model, shared
    std::shared_ptr<FloatBuffer> delta;        // the trained update, sent zero-copy
    std::uint64_t start_seq = 0;
    std::size_t pulls_pending = 0, acks_pending = 0;  // pulls_pending: 1 while it waits for the model
    bool pulled = false, trained = false, pushed = false, done = false;
    std::vector<std::string> refusals;
    TrainResult result;
    EvalResult eval;
    double wall_train_s = 0, train_cpu_s = 0;
    std::uint64_t bytes_down = 0, bytes_up = 0;
  };

  struct Result {
    Job* job = nullptr;
    std::exception_ptr error;
  };

  // One pull per model version. A federated round's model changes only when the round closes,
  // so every client that starts from version v receives the same bytes: the fleet pulls them
  // once, through the first virtual client that needs them (the protocol's Pull from every
  // shard), and the clients share that copy read-only. A real fleet downloads it once per
  // client; the virtual clock and the byte counts still charge every client its download.
  struct PulledModel {
    std::uint64_t version = 0;
    std::uint32_t requester = 0;  // the virtual client whose pulls fetch it
    std::uint64_t round = 0;      // the round its pulls were sent in
    std::uint64_t seq = 0;        // order of requests: a shard answers one client in order
    std::shared_ptr<FloatBuffer> params;
    std::vector<bool> got;        // per shard: its pull reply arrived
    std::size_t pending = 0;
    std::vector<Job*> waiting;
  };

  struct Collecting {
    std::uint64_t round = 0;
    transport::RoundStart rs;
    std::vector<std::uint32_t> clients;
    Clock::time_point last_arrival;
  };

  struct Active {
    std::uint64_t round = 0;
    transport::RoundStart rs;
    std::vector<std::unique_ptr<Job>> jobs;  // completers in id order, then the others in id order
    std::size_t completers = 0;
    std::size_t next_start = 0, next_push = 0;
    RoundRecord record;
    Clock::time_point wall_start;
  };

  std::string name_of(std::uint32_t c) const {
    char name[32];
    std::snprintf(name, sizeof name, "c%0*u", static_cast<int>(width_), static_cast<unsigned>(c));
    return name;
  }
  std::optional<std::uint32_t> client_of(const std::string& name) const {
    if (name.size() != width_ + 1 || name[0] != 'c') return std::nullopt;
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < name.size(); ++i) {
      if (name[i] < '0' || name[i] > '9') return std::nullopt;
      v = v * 10 + static_cast<std::uint64_t>(name[i] - '0');
    }
    if (v >= n_) return std::nullopt;
    return static_cast<std::uint32_t>(v);
  }

  void load() {
    if (n_ == 0) throw ConfigError("sim.clients must be at least 1");
    auto data = load_fashion_mnist(config_.get_string("data.dir"));
    train_ = std::move(data.train);
    test_ = std::move(data.test);
    const auto spec = parse_partition_spec(config_.get_string("data.partition"));
    partition_ = make_partition(spec, train_.labels(), n_,
                                static_cast<std::uint64_t>(config_.get_int("data.seed")));
    partition_text_ = spec.to_string();
    const auto trace = config_.get_string("sim.profile_trace");
    if (!trace.empty()) {
      trace_ = read_profile_trace(trace);
    } else {
      profile_spec_.gflops =
          parse_distribution(config_.get_string("profile.gflops"), "profile.gflops");
      profile_spec_.uplink_mbps =
          parse_distribution(config_.get_string("profile.uplink_mbps"), "profile.uplink_mbps");
      profile_spec_.downlink_mbps =
          parse_distribution(config_.get_string("profile.downlink_mbps"), "profile.downlink_mbps");
      profile_spec_.latency_ms =
          parse_distribution(config_.get_string("profile.latency_ms"), "profile.latency_ms");
      parse_availability(config_.get_string("profile.availability"), profile_spec_);
      profile_spec_.dropout = config_.get_double("profile.dropout");
      if (!(profile_spec_.dropout >= 0 && profile_spec_.dropout <= 1)) {
        throw ConfigError("profile.dropout must be in [0, 1]");
      }
    }
    COHORT_LOG(Info) << "cohort-sim: " << n_ << " virtual clients (" << partition_text_ << "), "
                     << pool_.size() << " training threads";
  }

  DeviceProfile profile(std::uint32_t c) const {
    if (!trace_.empty()) return trace_[c % trace_.size()];
    return draw_profile(profile_spec_, seed_, c);
  }

  void send(std::size_t shard, std::uint32_t client, Envelope e, transport::Payload payload = {}) {
    e.sender = name_of(client);
    eps_[shard]->send({}, std::move(e), payload);
  }

  // ---- registration ---------------------------------------------------------------------------

  void drive_registration() {
    if (all_registered()) return;
    const auto now = Clock::now();
    if (!welcomed_any_) {
      // Until the first welcome (all shards up), one client knocks every 100 ms.
      if (now >= next_knock_) {
        send_register(0);
        next_knock_ = now + 100ms;
      }
      return;
    }
    while (next_register_ < n_ && next_register_ < welcomes_ + 512) {
      if (!registered_[next_register_]) send_register(static_cast<std::uint32_t>(next_register_));
      ++next_register_;
    }
    if (!retry_.empty() && now >= next_knock_) {
      for (auto c : retry_) send_register(c);
      retry_.clear();
      next_knock_ = now + 200ms;
    }
  }

  [[nodiscard]] bool all_registered() const { return welcomes_ >= n_; }

  void send_register(std::uint32_t c) {
    transport::Register r;
    r.role = transport::Role::kClient;
    r.dataset_size = partition_[c].size();
    r.device = "sim";
    r.partition = partition_text_ + " " + std::to_string(c) + "/" + std::to_string(n_);
    Envelope e;
    e.body = r;
    send(0, c, std::move(e));
  }

  void on_welcome(std::uint32_t c, const transport::Welcome& w) {
    if (!welcomed_any_) {
      welcomed_any_ = true;
      setup_model(w);
      next_register_ = 0;
    }
    if (!registered_[c]) {
      registered_[c] = true;
      ++welcomes_;
      if (all_registered()) {
        COHORT_LOG(Info) << "cohort-sim: " << n_ << " clients registered in "
                         << seconds_since(started_) << " s";
      }
    }
  }

  void setup_model(const transport::Welcome& w) {
    spec_ = kernels::make_network_spec(w.model_spec);
    model_size_ = spec_.parameter_count();
    // Clients in flight (pulled or pulling, training, waiting to push in order): enough to hide
    // the hops between fleet, shards and training threads when local work is small, within a
    // 64 MiB budget of model copies, and at least two per training thread.
    const std::size_t fit =
        (std::size_t{64} << 20) / std::max<std::size_t>(1, model_size_ * sizeof(float));
    window_ = std::clamp<std::size_t>(fit, 2 * pool_.size() + 2, 64);
    if (model_size_ != w.model_size)
      throw ProtocolError("the coordinator's model size does not match its spec");
    if (w.shards.size() != urls_.size())
      throw ProtocolError("the coordinator announced another shard map");
    shards_ = w.shards;
    ConfigSchema schema;
    schema.add_section("train", "");
    Config train_cfg(schema);
    train_cfg.merge_toml("[train]\n" + w.training_toml, "the coordinator's [train] section");
    options_ = trainer_options_from(train_cfg.section("train"));
    if (!options_.reset_optimizer_state) {
      // Training threads are shared by all clients; per-client optimizer state is not kept.
      throw ConfigError(
          "the simulation keeps no optimizer state between a client's rounds: "
          "train.reset_optimizer_state = false is not simulated");
    }
    device_ = kernels::make_device("cpu", {.threads = 1});
    for (std::size_t i = 0; i < pool_.size(); ++i) {
      auto slot = std::make_unique<Slot>();
      slot->net = device_->make_network(spec_);
      slot->net->init(static_cast<std::uint64_t>(config_.get_int("data.seed")));
      slot->trainer.emplace(*slot->net, options_);
      free_slots_.push_back(slot.get());
      slots_.push_back(std::move(slot));
    }
  }

  // ---- message dispatch -----------------------------------------------------------------------

  void dispatch(Message& m) {
    const auto& body = m.envelope.body;
    COHORT_LOG(Trace) << "fleet: " << transport::body_name(body) << " for '" << m.envelope.recipient
                      << "'";
    if (std::holds_alternative<transport::Bye>(body)) {
      finished_ = true;
      return;
    }
    const auto c = client_of(m.envelope.recipient);
    if (!c) {
      if (auto* e = std::get_if<transport::ErrorBody>(&body)) {
        COHORT_LOG(Warn) << "cohort-sim: " << e->message;
      }
      return;
    }
    if (auto* w = std::get_if<transport::Welcome>(&body)) {
      on_welcome(*c, *w);
    } else if (auto* e = std::get_if<transport::ErrorBody>(&body)) {
      if (!registered_[*c]) {
        retry_.push_back(*c);
        COHORT_LOG(Debug) << name_of(*c) << ": " << e->message;
      } else {
        COHORT_LOG(Warn) << name_of(*c) << ": " << e->message;
      }
    } else if (auto* rs = std::get_if<transport::RoundStart>(&body)) {
      on_round_start(*c, *rs);
    } else if (auto* r = std::get_if<transport::PullReply>(&body)) {
      on_pull_reply(*c, *r, m);
    } else if (auto* a = std::get_if<transport::PushAck>(&body)) {
      on_push_ack(*c, *a, m);
    }
  }

  void on_round_start(std::uint32_t c, const transport::RoundStart& rs) {
    if (rs.mode != transport::TrainingMode::kFederated) {
      throw ConfigError("cohort-sim runs federated rounds (server.mode = \"federated\")");
    }
    if (rs.evaluate_only) {
      auto job = std::make_unique<Job>();
      job->kind = Job::Kind::kEvaluate;
      job->client = c;
      job->rs = rs;
      evals_.push_back(std::move(job));
      start_job(*evals_.back());
      return;
    }
    if (collecting_.empty() || collecting_.back().round != rs.round) {
      collecting_.push_back(Collecting{rs.round, rs, {}, Clock::now()});
    }
    collecting_.back().clients.push_back(c);
    collecting_.back().last_arrival = Clock::now();
  }

  // A round whose RoundStarts stopped short of the selection size (a client left the pool):
  // plan it with what arrived after a quiet second. Not reached in a healthy simulation.
  void check_stalled_collection() {
    if (active_ || collecting_.empty()) return;
    auto& front = collecting_.front();
    if (front.clients.size() >= expected_selected_ || collecting_.size() > 1 ||
        seconds_since(front.last_arrival) > 1.0) {
      if (front.clients.size() < expected_selected_ && collecting_.size() == 1) {
        COHORT_LOG(Warn) << "cohort-sim: round " << front.round << " selected "
                         << front.clients.size() << " clients, expected " << expected_selected_;
      }
      Collecting next = std::move(front);
      collecting_.pop_front();
      plan(std::move(next));
    }
  }

  Job* find_job(std::uint32_t c, std::uint64_t round, bool eval) {
    if (eval) {
      for (auto& j : evals_)
        if (j->client == c && j->rs.round == round) return j.get();
      return nullptr;
    }
    if (!active_ || active_->round != round) return nullptr;
    for (auto& j : active_->jobs)
      if (j->client == c && !j->done) return j.get();
    return nullptr;
  }

  void on_pull_reply(std::uint32_t c, const transport::PullReply& r, const Message& m) {
    // A client may have requested two models (a cut client's old version and an evaluation):
    // a shard answers in order, so the reply belongs to its oldest request still waiting for
    // this shard.
    PulledModel* model = nullptr;
    for (auto& pm : models_) {
      if (pm->requester != c || pm->round != m.envelope.round || pm->pending == 0 ||
          r.shard >= pm->got.size() || pm->got[r.shard]) {
        continue;
      }
      if (!model || pm->seq < model->seq) model = pm.get();
    }
    if (!model) return;
    model->got[r.shard] = true;
    if (r.end > model_size_ || r.begin > r.end ||
        m.payload.size() != (r.end - r.begin) * sizeof(float)) {
      throw ProtocolError("shard " + std::to_string(r.shard) + " sent a reply of the wrong shape");
    }
    std::memcpy(model->params->data() + r.begin, m.payload.data(), m.payload.size());
    if (--model->pending > 0) return;
    std::shared_ptr<const FloatBuffer> params = model->params;
    const std::vector<Job*> waiting = std::move(model->waiting);
    model->waiting.clear();
    for (Job* j : waiting) give_model(*j, params);
  }

  void give_model(Job& job, std::shared_ptr<const FloatBuffer> params) {
    job.model = std::move(params);
    job.pulls_pending = 0;
    job.bytes_down += model_bytes();
    on_pulled(job);
  }

  std::uint64_t model_bytes() const {
    std::uint64_t b = 0;
    for (const auto& s : shards_) b += (s.end - s.begin) * sizeof(float);
    return b;
  }

  // The job gets the model of its round's version: at once when it is in, else when the pull
  // of it (sent now, if this is its first client) is answered.
  void request_model(Job& job) {
    const std::uint64_t version = job.rs.model_version;
    for (auto& pm : models_) {
      if (pm->version != version) continue;
      if (pm->pending == 0) {
        give_model(job, pm->params);
      } else {
        pm->waiting.push_back(&job);
      }
      return;
    }
    // Versions no job waits for any more are dropped (jobs keep their own reference).
    std::erase_if(models_, [](const auto& pm) { return pm->pending == 0; });
    auto pm = std::make_unique<PulledModel>();
    pm->version = version;
    pm->requester = job.client;
    pm->round = job.rs.round;
    pm->seq = ++starts_;
    pm->params = std::make_shared<FloatBuffer>(model_size_);
    pm->got.assign(shards_.size(), false);
    pm->pending = shards_.size();
    pm->waiting.push_back(&job);
    models_.push_back(std::move(pm));
    for (std::uint32_t i = 0; i < shards_.size(); ++i) {
      Envelope e;
      e.round = job.rs.round;
      e.body = transport::Pull{shards_[i].index, shards_[i].begin, shards_[i].end, version};
      send(i, job.client, std::move(e));
    }
  }

  void on_push_ack(std::uint32_t c, const transport::PushAck& a, const Message& m) {
    Job* job = find_job(c, m.envelope.round, false);
    if (!job || job->acks_pending == 0) return;
    if (!a.accepted) job->refusals.push_back(a.reason);
    if (--job->acks_pending == 0) finish_training_job(*job);
  }

  // ---- rounds ---------------------------------------------------------------------------------

  void plan(Collecting col) {
    std::sort(col.clients.begin(), col.clients.end());
    const std::uint64_t bytes_down = model_bytes(), bytes_up = bytes_down;  // dense fp32 both ways
    std::vector<Selected> sel(col.clients.size());
    std::vector<ClientTime> times(col.clients.size());
    for (std::size_t i = 0; i < col.clients.size(); ++i) {
      const std::uint32_t c = col.clients[i];
      const DeviceProfile p = profile(c);
      const auto samples = samples_per_round(partition_[c].size(), options_.batch_size,
                                             options_.epochs, options_.steps, options_.drop_last);
      times[i] = client_time(p, {bytes_down, bytes_up, training_flops(model_size_, samples)});
      sel[i].finish_s = times[i].total();
      sel[i].silent =
          !is_online(p, seed_, c, col.round, sim_now_) || drops_out(p, seed_, c, col.round);
    }
    const RoundPlan plan = plan_round(sel, k_, deadline_s_);
    active_.emplace();
    Active& a = *active_;
    a.round = col.round;
    a.rs = col.rs;
    a.wall_start = Clock::now();
    if (summary_.rounds == 0) first_round_wall_ = a.wall_start;
    auto& rec = a.record;
    rec.seq = ++summary_.rounds;
    rec.round_id = col.round;
    rec.selected = col.clients.size();
    rec.completed = plan.completes;
    rec.committed = plan.completes >= min_updates_;
    rec.sim_round_s = plan.close_s;
    sim_now_ += plan.close_s;
    rec.sim_total_s = sim_now_;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = 0; i < col.clients.size(); ++i) {
        const Fate f = plan.fate[i];
        if ((pass == 0) != (f == Fate::kCompletes)) continue;
        if (f == Fate::kCut) ++rec.cut;
        if (f == Fate::kStraggler) ++rec.stragglers;
        if (f == Fate::kSilent) {
          ++rec.silent;
          continue;
        }
        // Bytes are counted from the plan (what the protocol moves for this client), so a record
        // does not depend on how far late clients got when training ended; bytes_measured counts
        // what really moved.
        rec.bytes += bytes_down + (f == Fate::kCompletes ? bytes_up : 0);
        auto job = std::make_unique<Job>();
        job->kind = f == Fate::kCompletes ? Job::Kind::kTrain : Job::Kind::kPullOnly;
        job->client = col.clients[i];
        job->rs = col.rs;
        job->fate = f;
        job->time = times[i];
        a.jobs.push_back(std::move(job));
      }
    }
    a.completers = plan.completes;
    flush_records(false);  // the previous round asked for no evaluation if none is pending
  }

  // Starts jobs within the window, pushes trained updates in client-id order, closes the round.
  void advance() {
    if (!active_) {
      if (!collecting_.empty()) check_stalled_collection();
      if (!active_) return;
    }
    Active& a = *active_;
    // Completers first; the others only once every completer has reported (they would report
    // after the round closed).
    while (a.next_start < a.jobs.size() && in_flight_ < window_) {
      if (a.next_start >= a.completers && !completers_reported(a)) break;
      start_job(*a.jobs[a.next_start++]);
    }
    while (a.next_push < a.completers && a.jobs[a.next_push]->trained) push(*a.jobs[a.next_push++]);
    if (a.next_start == a.jobs.size() &&
        std::all_of(a.jobs.begin(), a.jobs.end(), [](const auto& j) { return j->done; })) {
      close_active();
    }
  }

  static bool completers_reported(const Active& a) {
    for (std::size_t i = 0; i < a.completers; ++i)
      if (!a.jobs[i]->done) return false;
    return true;
  }

  // A delta buffer: reused once ZeroMQ has released the last push that sent it (its deleter may
  // run on a shard's thread, hence the lock).
  std::shared_ptr<FloatBuffer> take_delta() {
    FloatBuffer b;
    {
      std::lock_guard lock(spare_->mu);
      if (!spare_->buffers.empty()) {
        b = std::move(spare_->buffers.back());
        spare_->buffers.pop_back();
      }
    }
    if (b.size() != model_size_) b = FloatBuffer(model_size_);
    auto* raw = new FloatBuffer(std::move(b));
    return std::shared_ptr<FloatBuffer>(raw, [spare = spare_](FloatBuffer* p) {
      {
        std::lock_guard lock(spare->mu);
        if (spare->buffers.size() < 256) spare->buffers.push_back(std::move(*p));
      }
      delete p;
    });
  }

  void start_job(Job& job) {
    ++in_flight_;
    job.start_seq = ++starts_;
    job.pulls_pending = 1;
    request_model(job);
  }

  void on_pulled(Job& job) {
    job.pulled = true;
    if (job.kind == Job::Kind::kPullOnly) {
      transport::ClientReport r = base_report(job);
      char why[160];
      if (job.fate == Fate::kStraggler) {
        std::snprintf(why, sizeof why,
                      "could not push before the deadline (simulated finish %.1f s > %.1f s)",
                      job.time.total(), deadline_s_);
      } else {
        std::snprintf(why, sizeof why,
                      "the round closed before this update (simulated finish %.1f s)",
                      job.time.total());
      }
      r.message = why;
      send_report(job, r);
      complete(job);
      return;
    }
    submit(job);
  }

  void submit(Job& job) {
    ++training_;
    if (job.kind != Job::Kind::kEvaluate) job.delta = take_delta();
    Job* j = &job;
    pool_.submit([this, j] {
      Result res{j, nullptr};
      try {
        Slot* slot = acquire_slot();
        struct Release {
          Fleet* f;
          Slot* s;
          ~Release() { f->release_slot(s); }
        } release{this, slot};
        const FloatBuffer& model = *j->model;
        auto params = slot->net->parameters();
        std::copy(model.begin(), model.end(), params.begin());
        const auto t0 = Clock::now();
        const double cpu0 = thread_cpu_seconds();
        if (j->kind == Job::Kind::kEvaluate) {
          j->eval = slot->trainer->evaluate(test_);
        } else {
          const auto seed = static_cast<std::uint64_t>(config_.get_int("data.seed")) * 1000003ULL +
                            j->rs.model_version * 7919ULL + j->client;
          j->result = slot->trainer->train(train_, partition_[j->client], seed);
          const auto trained = slot->net->parameters();
          FloatBuffer& delta = *j->delta;
          for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = trained[i] - model[i];
        }
        j->wall_train_s = seconds_since(t0);
        j->train_cpu_s = thread_cpu_seconds() - cpu0;
      } catch (...) {
        res.error = std::current_exception();
      }
      std::lock_guard lock(results_mu_);
      results_.push_back(res);
    });
  }

  Slot* acquire_slot() {
    std::unique_lock lock(slots_mu_);
    slots_cv_.wait(lock, [&] { return !free_slots_.empty(); });
    Slot* s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  void release_slot(Slot* s) {
    {
      std::lock_guard lock(slots_mu_);
      free_slots_.push_back(s);
    }
    slots_cv_.notify_one();
  }

  void collect_results() {
    std::vector<Result> done;
    {
      std::lock_guard lock(results_mu_);
      done.swap(results_);
    }
    for (auto& r : done) {
      --training_;
      if (r.error) std::rethrow_exception(r.error);
      Job& job = *r.job;
      if (job.kind == Job::Kind::kEvaluate) {
        on_evaluated(job);
      } else {
        job.trained = true;
      }
    }
  }

  void push(Job& job) {
    const auto bytes = std::as_bytes(job.delta->span());
    job.acks_pending = shards_.size();
    for (std::uint32_t i = 0; i < shards_.size(); ++i) {
      const auto& s = shards_[i];
      Envelope e;
      e.round = job.rs.round;
      e.body = transport::Push{s.index,
                               s.begin,
                               s.end,
                               partition_[job.client].size(),
                               job.rs.model_version,
                               transport::Encoding::kDenseF32,
                               transport::PushKind::kDelta,
                               static_cast<float>(job.result.mean_loss),
                               0,
                               s.end - s.begin};
      const auto slice = bytes.subspan(s.begin * sizeof(float), (s.end - s.begin) * sizeof(float));
      job.bytes_up += slice.size();
      // Zero copy: ZeroMQ holds the delta until the shard has folded it in.
      send(i, job.client, std::move(e), transport::Payload{slice, job.delta});
    }
    job.pushed = true;
    job.delta.reset();
    job.model.reset();
  }

  transport::ClientReport base_report(const Job& job) const {
    transport::ClientReport r;
    r.round = job.rs.round;
    r.model_version = job.rs.model_version;
    r.bytes_sent = job.bytes_up;
    r.bytes_received = job.bytes_down;
    r.comm_seconds = static_cast<float>(job.time.download_s + job.time.upload_s);
    return r;
  }

  // Reports reach the coordinator in a fixed order: a round's reports wait for the evaluation
  // reports of earlier rounds, which the coordinator would otherwise see late or not at all
  // depending on thread timing.
  void send_report(const Job& job, const transport::ClientReport& r) {
    const bool wait = !r.evaluated && std::any_of(evals_.begin(), evals_.end(), [&](const auto& j) {
      return j->rs.round < r.round;
    });
    if (wait || (!r.evaluated && !held_reports_.empty())) {
      held_reports_.emplace_back(job.client, r);
      return;
    }
    Envelope e;
    e.round = r.round;
    e.body = r;
    send(0, job.client, std::move(e));
  }

  void release_reports() {
    while (!held_reports_.empty()) {
      const auto& [client, r] = held_reports_.front();
      if (std::any_of(evals_.begin(), evals_.end(),
                      [&](const auto& j) { return j->rs.round < r.round; }))
        return;
      Envelope e;
      e.round = r.round;
      e.body = r;
      send(0, client, std::move(e));
      held_reports_.pop_front();
    }
  }

  void finish_training_job(Job& job) {
    transport::ClientReport r = base_report(job);
    r.trained = job.refusals.empty();
    if (!job.refusals.empty()) r.message = "a shard refused the update: " + job.refusals.front();
    r.num_samples = partition_[job.client].size();
    r.train_loss = static_cast<float>(job.result.mean_loss);
    r.train_seconds = static_cast<float>(job.time.compute_s);
    send_report(job, r);
    auto& rec = active_->record;
    rec.loss_sum += job.result.mean_loss * static_cast<double>(r.num_samples);
    rec.samples += r.num_samples;
    rec.wall_train_s += job.wall_train_s;
    rec.wall_train_cpu_s += job.train_cpu_s;
    summary_.train_wall_seconds += job.wall_train_s;
    summary_.train_cpu_seconds += job.train_cpu_s;
    if (!job.refusals.empty()) {
      COHORT_LOG(Warn) << name_of(job.client) << ": " << r.message;
    }
    complete(job);
  }

  void complete(Job& job) {
    job.done = true;
    --in_flight_;
    job.model.reset();
    job.delta.reset();
    if (job.kind != Job::Kind::kEvaluate) summary_.bytes_measured += job.bytes_down + job.bytes_up;
  }

  void close_active() {
    Active& a = *active_;
    a.record.wall_round_s = seconds_since(a.wall_start);
    summary_.round_wall_seconds = seconds_since(first_round_wall_);
    summary_.sim_seconds = sim_now_;
    if (a.record.committed) ++summary_.committed;
    summary_.bytes += a.record.bytes;
    records_[a.round] = a.record;
    active_.reset();
    // A round's line waits for its evaluation, if one was asked for.
    flush_records(false);
  }

  void on_evaluated(Job& job) {
    transport::ClientReport r = base_report(job);
    r.comm_seconds = 0;
    r.evaluated = true;
    r.eval_loss = static_cast<float>(job.eval.loss);
    r.eval_accuracy = static_cast<float>(job.eval.accuracy);
    r.eval_count = job.eval.count;
    send_report(job, r);
    --in_flight_;
    job.model.reset();
    job.delta.reset();
    evaluated_[job.rs.round] = job.eval;
    summary_.eval_cpu_seconds += job.train_cpu_s;
    summary_.final_accuracy = job.eval.accuracy;
    summary_.final_loss = job.eval.loss;
    evals_.erase(std::remove_if(evals_.begin(), evals_.end(),
                                [&](const auto& j) { return j.get() == &job; }),
                 evals_.end());
    release_reports();
    flush_records(false);
  }

  // Writes the records of closed rounds, in order: a round's record once its evaluation is in,
  // or once a later round started (no evaluation was asked for), or at the end.
  void flush_records(bool all) {
    while (!records_.empty()) {
      auto it = records_.begin();
      RoundRecord& rec = it->second;
      const auto ev = evaluated_.find(it->first);
      const bool eval_pending = std::any_of(
          evals_.begin(), evals_.end(), [&](const auto& j) { return j->rs.round == it->first; });
      const bool later_started = active_ || !collecting_.empty();
      if (ev == evaluated_.end() && !all && (eval_pending || !later_started)) return;
      if (ev != evaluated_.end()) {
        rec.evaluated = true;
        rec.test_loss = ev->second.loss;
        rec.test_accuracy = ev->second.accuracy;
        evaluated_.erase(ev);
      }
      write_record(rec);
      records_.erase(it);
    }
  }

  void write_record(const RoundRecord& r) {
    total_bytes_ += r.bytes;
    const double loss = r.samples ? r.loss_sum / static_cast<double>(r.samples) : 0.0;
    const double wall = seconds_since(started_);
    std::vector<MetricField> f{{"round", r.seq},
                               {"round_id", r.round_id},
                               {"committed", r.committed},
                               {"selected", std::uint64_t{r.selected}},
                               {"completed", std::uint64_t{r.completed}},
                               {"cut", std::uint64_t{r.cut}},
                               {"stragglers", std::uint64_t{r.stragglers}},
                               {"silent", std::uint64_t{r.silent}},
                               {"train_loss", loss},
                               {"bytes", r.bytes},
                               {"total_bytes", total_bytes_},
                               {"sim_round_seconds", r.sim_round_s},
                               {"sim_seconds", r.sim_total_s}};
    if (r.evaluated) {
      f.push_back({"test_loss", r.test_loss});
      f.push_back({"test_accuracy", r.test_accuracy});
    }
    f.push_back({"wall_round_seconds", r.wall_round_s});
    f.push_back({"wall_train_seconds", r.wall_train_s});
    f.push_back({"wall_train_cpu_seconds", r.wall_train_cpu_s});
    f.push_back({"wall_seconds", wall});
    metrics_.write("sim_round", f);
    if (csv_) {
      char line[512];
      std::snprintf(
          line, sizeof line,
          "%llu,%llu,%d,%zu,%zu,%zu,%zu,%zu,%.9g,%s,%s,%llu,%llu,%.9g,%.9g,%.6f,%.6f,%.6f\n",
          static_cast<unsigned long long>(r.seq), static_cast<unsigned long long>(r.round_id),
          r.committed ? 1 : 0, r.selected, r.completed, r.cut, r.stragglers, r.silent, loss,
          r.evaluated ? std::to_string(r.test_loss).c_str() : "",
          r.evaluated ? std::to_string(r.test_accuracy).c_str() : "",
          static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(total_bytes_),
          r.sim_round_s, r.sim_total_s, r.wall_round_s, r.wall_train_s, wall);
      csv_ << line;
      csv_.flush();
    }
    last_line_ = r;
    have_last_ = true;
    progress_line(true);
  }

  void progress_line(bool round_done) {
    if (!progress_) return;
    if (!round_done) {
      if (!tty_ || seconds_since(last_progress_) < 0.25) return;
    }
    last_progress_ = Clock::now();
    const double wall = seconds_since(started_);
    std::string line;
    char buf[512];
    if (!welcomed_any_ || !all_registered()) {
      std::snprintf(buf, sizeof buf, "registering %zu/%zu clients | %.0fs", welcomes_, n_, wall);
      line = buf;
    } else {
      const std::uint64_t done = summary_.committed;
      const double eta = done > 0 ? seconds_since(first_round_wall_) / static_cast<double>(done) *
                                        static_cast<double>(rounds_ - std::min(done, rounds_))
                                  : 0.0;
      std::size_t reported = 0, selected = 0;
      std::uint64_t round = summary_.rounds;
      if (active_ && !round_done) {
        for (const auto& j : active_->jobs) reported += j->done ? 1 : 0;
        selected = active_->record.selected;
      } else if (have_last_) {
        reported = last_line_.completed;
        selected = last_line_.selected;
        round = last_line_.seq;
      }
      std::string acc = "-", loss = "-";
      if (have_last_ && last_line_.evaluated) {
        std::snprintf(buf, sizeof buf, "%.2f%%", last_line_.test_accuracy * 100);
        acc = buf;
        std::snprintf(buf, sizeof buf, "%.4f", last_line_.test_loss);
        loss = buf;
      }
      std::snprintf(buf, sizeof buf,
                    "round %llu/%llu | clients %zu/%zu | test loss %s | accuracy %s | %s | "
                    "simulated %s | wall %.0fs | ETA %.0fs",
                    static_cast<unsigned long long>(round),
                    static_cast<unsigned long long>(rounds_), reported, selected, loss.c_str(),
                    acc.c_str(), human_bytes(static_cast<double>(total_bytes_)).c_str(),
                    human_duration(sim_now_).c_str(), wall, eta);
      line = buf;
    }
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      if (round_done) std::fputc('\n', stderr);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  const Config& config_;
  transport::Context& ctx_;
  std::vector<std::string> urls_;
  const std::atomic<bool>& stop_;
  std::function<bool()> shards_failed_;
  ThreadPool pool_;
  MetricsSink metrics_;
  std::ofstream csv_;
  std::size_t n_ = 0, k_ = 1, min_updates_ = 1, window_ = 4, expected_selected_ = 1, width_ = 5;
  std::uint64_t seed_ = 1, rounds_ = 0;
  double deadline_s_ = 60;
  bool progress_ = true, tty_ = false;
  Clock::time_point started_, first_round_wall_, last_progress_;

  Dataset train_, test_;
  Partition partition_;
  std::string partition_text_;
  ProfileSpec profile_spec_;
  std::vector<DeviceProfile> trace_;

  std::vector<std::unique_ptr<Endpoint>> eps_;
  std::vector<Endpoint*> ep_ptrs_;
  std::vector<transport::ShardInfo> shards_;
  kernels::NetworkSpec spec_;  // outlives the slots' networks
  std::uint64_t model_size_ = 0;
  TrainerOptions options_;
  std::unique_ptr<kernels::Device> device_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_slots_;
  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  std::mutex results_mu_;
  std::vector<Result> results_;

  std::vector<bool> registered_;
  std::vector<std::uint32_t> retry_;
  std::size_t welcomes_ = 0, next_register_ = 0;
  bool welcomed_any_ = false, finished_ = false;
  Clock::time_point next_knock_;

  std::deque<Collecting> collecting_;
  std::optional<Active> active_;
  std::vector<std::unique_ptr<Job>> evals_;
  std::size_t in_flight_ = 0;
  std::size_t training_ = 0;  // jobs handed to the training threads whose results are not in
  std::deque<std::pair<std::uint32_t, transport::ClientReport>> held_reports_;
  std::uint64_t starts_ = 0;
  struct Spare {
    std::mutex mu;
    std::vector<FloatBuffer> buffers;
  };
  std::shared_ptr<Spare> spare_ = std::make_shared<Spare>();
  std::vector<std::unique_ptr<PulledModel>> models_;
  double sim_now_ = 0;
  std::map<std::uint64_t, RoundRecord> records_;
  std::map<std::uint64_t, EvalResult> evaluated_;
  std::uint64_t total_bytes_ = 0;
  RoundRecord last_line_;
  bool have_last_ = false;
  Summary summary_;
};

// The clients' keys, checked before any shard starts: an unknown train.* key or a bad value is a
// one-line error at start-up, not a failure after the virtual clients joined.
void check_client_side(const Config& config) {
  (void)trainer_options_from(config.section("train"));
  // The fleet trains on CPU threads of its own (sim.threads): a train.device or train.threads
  // would be ignored, so it is refused.
  const auto choice = device_choice_from(config.section("train"));
  if (choice.device != "cpu" || config.section("train").has("threads")) {
    throw ConfigError(
        "cohort-sim trains every virtual client on the CPU with one thread each: train.device "
        "and train.threads do not apply (set sim.threads for the number of training threads)");
  }
  (void)parse_partition_spec(config.get_string("data.partition"));
  if (config.get_int("data.seed") < 0) throw ConfigError("data.seed must be >= 0");
  if (config.get_int("sim.clients") < 1) throw ConfigError("sim.clients must be at least 1");
  const auto threads = config.get_int("sim.threads");
  if (threads < 0 || threads > 1024) {
    throw ConfigError("sim.threads must be between 0 and 1024, got " + std::to_string(threads));
  }
}

std::string sim_url(std::uint64_t run, std::uint32_t shard) {
  return "inproc://cohort-sim-" + std::to_string(run) + "-shard-" + std::to_string(shard);
}

}  // namespace

ConfigSchema sim_config_schema() {
  ConfigSchema s;
  const ConfigSchema server_schema = server::config_schema();
  for (const auto& o : server_schema.options()) {
    if (set_by_sim(o.key)) continue;
    std::string help = o.help;
    if (o.key == "server.mode") help = "federated (the only mode cohort-sim simulates)";
    if (o.key == "server.round_deadline_ms") {
      help = "a round closes at this deadline, on the simulated clock (--processes: real time)";
    }
    s.add(o.key, o.default_value, help);
  }
  s.add_section("train",
                "client-side training options (epochs, batch_size, lr, momentum, optimizer, ...)")
      .add_section("aggregator", "aggregation rule: name = " + builtin_registries().aggregators.names() +
                                     ", and its options")
      .add_section("server_optimizer", "server optimizer: name = " +
                                           builtin_registries().server_optimizers.names() +
                                           ", and its options (lr: each one's own default)")
      .add("data.dir", std::string(kFashionMnistDir), "folder with the Fashion-MNIST IDX files")
      .add("data.partition", std::string("iid"), "iid | dirichlet:ALPHA | shards:S | quantity:BETA")
      .add("data.seed", std::int64_t{1}, "seed of the partition and of local shuffles")
      .add("sim.clients", std::int64_t{100}, "N: virtual clients, all registered before round 1")
      .add("sim.threads", std::int64_t{0}, "local-training threads (0: one per core)")
      .add("sim.seed", std::int64_t{1}, "seed of device profiles, availability and dropouts")
      .add("sim.wall_deadline_ms", std::int64_t{120000},
           "real-time deadline of the in-process coordinator: a round with a silent (offline or "
           "dropped-out) client and fewer than K updates waits this long; must exceed a round's "
           "host time")
      .add("sim.metrics_file", std::string("sim_metrics.jsonl"),
           "per-round JSON lines (simulated and wall_* times)")
      .add("sim.csv_file", std::string("sim_metrics.csv"),
           "the same as CSV (--plot reads it); empty: none")
      .add("sim.progress", true, "live progress line on stderr")
      .add("sim.log_dir", std::string(""),
           "--processes: folder for the processes' logs and config (default: a new one under the "
           "temp dir)")
      .add("sim.profile_trace", std::string(""),
           "CSV of devices "
           "(gflops,uplink_mbps,downlink_mbps,latency_ms[,online_min,online_max,phase,dropout]); "
           "client i gets row i mod rows; overrides profile.*")
      .add("profile.gflops", std::string("10"),
           "training speed, GFLOP/s: X | uniform:A:B | lognormal:MEDIAN:SIGMA")
      .add("profile.uplink_mbps", std::string("10"), "uplink, Mbit/s (same forms)")
      .add("profile.downlink_mbps", std::string("50"), "downlink, Mbit/s (same forms)")
      .add("profile.latency_ms", std::string("50"), "one-way latency, ms (same forms)")
      .add("profile.availability", std::string("always"),
           "always | diurnal:MIN:MAX (online probability over a simulated day)")
      .add("profile.dropout", 0.0,
           "probability that a selected client drops out of the round (silent)");
  return s;
}

Summary run_in_process(const Config& config, const Registries& registries,
                       const std::atomic<bool>& stop) {
  if (config.get_string("server.mode") != "federated") {
    throw ConfigError("cohort-sim simulates federated rounds: server.mode must be \"federated\"");
  }
  check_client_side(config);
  if (!trainer_options_from(config.section("train")).reset_optimizer_state) {
    // Training threads are shared by all clients; per-client optimizer state is not kept.
    throw ConfigError(
        "the simulation keeps no optimizer state between a client's rounds: "
        "train.reset_optimizer_state = false is not simulated");
  }
  const auto shards =
      static_cast<std::uint32_t>(std::max<std::int64_t>(1, config.get_int("server.shards")));
  static std::atomic<std::uint64_t> runs{0};
  const std::uint64_t run = ++runs;
  std::vector<std::string> urls;
  for (std::uint32_t i = 0; i < shards; ++i) urls.push_back(sim_url(run, i));
  std::vector<Config> shard_configs;
  for (std::uint32_t i = 0; i < shards; ++i) shard_configs.push_back(shard_config(config, i, urls));

  transport::Context ctx;
  std::atomic<bool> stop_shards{false};
  std::vector<std::atomic<bool>> finished(shards);
  std::vector<std::exception_ptr> errors(shards);
  std::mutex errors_mu;
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < shards; ++i) {
    threads.emplace_back([&, i] {
      try {
        server::run(shard_configs[i], registries, stop_shards, ctx);
      } catch (...) {
        std::lock_guard lock(errors_mu);
        errors[i] = std::current_exception();
        failed = true;
      }
      finished[i] = true;
    });
  }
  auto all_finished = [&] {
    return std::all_of(finished.begin(), finished.end(), [](const auto& f) { return f.load(); });
  };
  Summary summary;
  std::exception_ptr fleet_error;
  {
    std::optional<Fleet> fleet;
    try {
      fleet.emplace(config, ctx, urls, stop, [&] { return failed.load(); });
      summary = fleet->run();
      if (!stop.load()) fleet->drain_until(all_finished);
    } catch (...) {
      fleet_error = std::current_exception();
    }
    stop_shards = true;
    for (auto& t : threads) t.join();
  }  // the fleet's sockets close before the context
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (fleet_error) std::rethrow_exception(fleet_error);
  return summary;
}

// ---- --processes ----------------------------------------------------------------------------

namespace {

std::string toml_value(const Value& v) {
  if (std::holds_alternative<std::string>(v)) {
    std::string out = "\"";
    for (char c : std::get<std::string>(v)) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  return to_string(v);
}

pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  const pid_t pid = fork();
  if (pid < 0) throw InternalError(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    FILE* out = std::fopen(log.c_str(), "w");
    if (out) {
      dup2(fileno(out), 1);
      dup2(fileno(out), 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

std::string read_port(const std::filesystem::path& file, pid_t pid, const std::atomic<bool>& stop) {
  for (int i = 0; i < 600 && !stop.load(); ++i) {
    std::ifstream in(file);
    std::string port;
    if (in >> port && !port.empty()) return port;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      throw InternalError("a shard exited before binding (see its log)");
    std::this_thread::sleep_for(50ms);
  }
  throw TimeoutError("a shard did not write its port file within 30 s");
}

}  // namespace

int run_processes(const Config& config, const std::filesystem::path& bin_dir,
                  const std::atomic<bool>& stop) {
  check_client_side(config);
  const auto n = config.get_int("sim.clients");
  constexpr std::int64_t kMaxProcesses = 200;
  if (n < 1 || n > kMaxProcesses) {
    throw ConfigError("--processes starts one process per client: sim.clients must be 1.." +
                      std::to_string(kMaxProcesses) + ", got " + std::to_string(n));
  }
  const auto server_bin = bin_dir / "cohort-server", client_bin = bin_dir / "cohort-client";
  for (const auto& b : {server_bin, client_bin}) {
    if (access(b.c_str(), X_OK) != 0)
      throw ConfigError("--processes needs " + b.string() + " (build it next to cohort-sim)");
  }
  const auto dir =
      config.get_string("sim.log_dir").empty()
          ? std::filesystem::temp_directory_path() / ("cohort-sim-" + std::to_string(getpid()))
          : std::filesystem::path(config.get_string("sim.log_dir"));
  std::filesystem::create_directories(dir);
  // The server's keys of the simulation file, as a cohort-server configuration.
  const ConfigSchema schema = server::config_schema();
  {
    std::ofstream out(dir / "server.toml");
    for (const auto& o : schema.options()) {
      if (set_by_sim(o.key) || o.key == "server.shards" || !config.is_set(o.key)) continue;
      Value v;
      switch (o.type) {
        case ValueType::kBool:
          v = config.get_bool(o.key);
          break;
        case ValueType::kInt:
          v = config.get_int(o.key);
          break;
        case ValueType::kDouble:
          v = config.get_double(o.key);
          break;
        case ValueType::kString:
          v = config.get_string(o.key);
          break;
      }
      out << o.key << " = " << toml_value(v) << '\n';
    }
    out << "server.min_clients = " << n << '\n';
    for (const char* section : {"train", "aggregator", "server_optimizer"}) {
      const auto s = config.section(section);
      for (const auto& name : s.names()) {
        const std::string text = s.get_string(name, "");
        double d = 0;
        char* end = nullptr;
        d = std::strtod(text.c_str(), &end);
        (void)d;
        const bool bare =
            (!text.empty() && end && *end == '\0') || text == "true" || text == "false";
        out << section << '.' << name << " = " << (bare ? text : toml_value(text)) << '\n';
      }
    }
  }
  const auto shards = std::max<std::int64_t>(1, config.get_int("server.shards"));
  std::vector<pid_t> servers, clients;
  auto kill_all = [&](std::vector<pid_t>& pids) {
    for (pid_t p : pids) kill(p, SIGTERM);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    pids.clear();
  };
  int code = 1;
  try {
    const std::string cfg = (dir / "server.toml").string();
    servers.push_back(spawn({server_bin, "--config", cfg, "--insecure", "--shard", "0", "--shards",
                             std::to_string(shards), "--listen", "tcp://127.0.0.1:*", "--port-file",
                             (dir / "port-0").string()},
                            dir / "shard-0.log"));
    const std::string coordinator =
        "tcp://127.0.0.1:" + read_port(dir / "port-0", servers[0], stop);
    for (std::int64_t i = 1; i < shards; ++i) {
      servers.push_back(spawn(
          {server_bin, "--config", cfg, "--insecure", "--shard", std::to_string(i), "--shards",
           std::to_string(shards), "--listen", "tcp://127.0.0.1:*", "--coordinator", coordinator,
           "--port-file", (dir / ("port-" + std::to_string(i))).string()},
          dir / ("shard-" + std::to_string(i) + ".log")));
    }
    const int width = static_cast<int>(std::max<std::size_t>(5, std::to_string(n - 1).size()));
    for (std::int64_t i = 0; i < n; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "c%0*lld", width, static_cast<long long>(i));
      clients.push_back(spawn({client_bin, "--insecure", "--server", coordinator, "--name", name,
                               "--data", config.get_string("data.partition"), "--part",
                               std::to_string(i) + "/" + std::to_string(n), "--set",
                               "data.dir=" + config.get_string("data.dir"), "--set",
                               "data.seed=" + std::to_string(config.get_int("data.seed"))},
                              dir / (std::string(name) + ".log")));
    }
    std::fprintf(stderr,
                 "cohort-sim --processes: %lld shards and %lld clients on loopback; logs in %s\n",
                 static_cast<long long>(shards), static_cast<long long>(n), dir.c_str());
    int status = 0;
    for (;;) {
      const pid_t p = waitpid(servers[0], &status, WNOHANG);
      if (p == servers[0]) break;
      if (stop.load()) {
        kill(servers[0], SIGTERM);
        waitpid(servers[0], &status, 0);
        break;
      }
      std::this_thread::sleep_for(100ms);
    }
    servers.erase(servers.begin());
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    // The coordinator's per-round lines, as cohort-server printed them.
    std::ifstream log(dir / "shard-0.log");
    for (std::string line; std::getline(log, line);) {
      if (line.rfind("round ", 0) == 0) std::printf("%s\n", line.c_str());
    }
  } catch (...) {
    kill_all(clients);
    kill_all(servers);
    throw;
  }
  kill_all(clients);
  kill_all(servers);
  return code;
}

void plot(const std::filesystem::path& csv, const std::filesystem::path& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    throw ConfigError(
        "--plot needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)");
  }
  if (!std::filesystem::exists(csv))
    throw DataError("--plot: no metrics CSV at " + csv.string() + " (sim.csv_file)");
  // Simulated time in the unit that suits the run's length (column 15: sim_seconds).
  double last_sim_s = 0;
  {
    std::ifstream in(csv);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    std::stringstream cells(last);
    std::string cell;
    for (int col = 1; std::getline(cells, cell, ','); ++col) {
      if (col == 15) last_sim_s = std::strtod(cell.c_str(), nullptr);
    }
  }
  const char* unit = last_sim_s >= 7200 ? "h" : last_sim_s >= 120 ? "min" : "s";
  const double div = last_sim_s >= 7200 ? 3600 : last_sim_s >= 120 ? 60 : 1;
  const std::string t = "($15/" + std::to_string(div) + ")";
  const auto script = std::filesystem::path(png.string() + ".gp");
  {
    std::ofstream out(script);
    out << "set terminal pngcairo size 1200,800 noenhanced\n"
        << "set output '" << png.string() << "'\n"
        << "set datafile separator ','\n"
        << "set key autotitle columnhead\n"
        << "set grid\n"
        << "set multiplot layout 2,2 title 'cohort-sim: " << csv.filename().string() << "'\n"
        << "set xlabel 'round'\nset ylabel 'test accuracy'\nset key bottom right\n"
        << "plot '" << csv.string() << "' using 1:11 with linespoints title 'accuracy'\n"
        << "set ylabel 'loss'\nset key top right\n"
        << "plot '" << csv.string()
        << "' using 1:9 with lines title 'train loss', '' using 1:10 with linespoints title 'test "
           "loss'\n"
        << "set xlabel 'simulated time (" << unit
        << ")'\nset ylabel 'test accuracy'\nset key bottom right\n"
        << "plot '" << csv.string() << "' using " << t << ":11 with linespoints title 'accuracy'\n"
        << "set ylabel 'loss'\nset key top right\n"
        << "plot '" << csv.string() << "' using " << t
        << ":9 with lines title 'train loss', '' using " << t
        << ":10 with linespoints title 'test loss'\n"
        << "unset multiplot\n";
  }
  const std::string cmd = "gnuplot '" + script.string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) throw DataError("gnuplot failed on " + script.string());
  std::filesystem::remove(script);
}

}  // namespace cohort::client::sim
