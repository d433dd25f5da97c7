// cohort-sim's fleet: N virtual clients behind one multiplexed DEALER per shard, their local
// training on a thread pool, and the virtual clock that decides who completes each round (the
// design is at the top of fleet.cc). Private to sim/.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/client/dataset.h"
#include "cohort/client/local_training.h"
#include "cohort/client/partition.h"
#include "cohort/client/secagg_session.h"
#include "cohort/client/trainer.h"
#include "cohort/core/buffer.h"
#include "cohort/core/thread_pool.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/network.h"
#include "cohort/server/population.h"
#include "cohort/sim/sim.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/secagg_messages.h"
#include "memory_budgets.h"
#include "options.h"
#include "report.h"
#include "sim_clock.h"

namespace cohort::sim {

// CPU time of the calling thread: local training's compute (or the protocol's, under secure
// aggregation), not counting time the thread spent preempted by the fleet, the shards or the
// other training threads.
double thread_cpu_seconds();

// A training thread's network and trainer; the fleet keeps one per thread.
struct Slot {
  std::unique_ptr<kernels::Network> net;
  std::optional<client::LocalTrainer> trainer;  // evaluates
  std::unique_ptr<client::LocalTraining> rule;  // trains: train.rule
};

// Speaks for options.clients virtual clients to the shards at `urls` until the coordinator says
// goodbye, options.server.rounds rounds are committed, or `stop` is set. Not thread-safe: one
// thread calls run() and then drain_until(); the training threads touch only their own job, the
// slots (slots_mu_) and the results (results_mu_).
class Fleet {
 public:
  // `shards_failed` says whether a shard's thread ended with an error (run() then throws).
  // `options` must be checked for Runner::kInProcess (sim_options_from). `memory` is the plan of
  // the clients' memory budgets (plan_fleet_memory): the clients that cannot train never
  // register (the shards' server.min_clients must count only the others), and the rest train
  // and are timed as planned. REQUIRES: at least one client fits.
  Fleet(const SimOptions& options, transport::Context& ctx, const std::vector<std::string>& urls,
        const std::atomic<bool>& stop, const std::function<bool()>& shards_failed,
        const client::LocalTrainingRegistry& rules, FleetMemory memory = {});

  // Loads the data and the clients' rows, and returns the population the coordinator admits in
  // bulk (InProcessOverrides::population): call it once, before the shards start and run().
  std::shared_ptr<const server::VirtualPopulation> prepare();

  // Registers every client (one Register stands for the population), then runs rounds; returns the
  // run's totals. Throws what a training job threw, ProtocolError for a malformed reply,
  // InternalError if a shard failed.
  Summary run();

  // After training: keep reading (the coordinator says goodbye to every client) until the shards
  // have returned, so no shard blocks on a full queue.
  void drain_until(const std::function<bool()>& done);

 private:
  struct Job {
    enum class Kind { kTrain, kPullOnly, kEvaluate };
    Kind kind = Kind::kTrain;
    std::uint32_t client = 0;
    transport::RoundStart rs;
    Fate fate = Fate::kCompletes;
    DeviceProfile profile;
    ClientTime time;
    std::size_t steps = 0;      // local steps asked for (rs.local_steps, else train.steps)
    std::uint64_t samples = 0;  // samples the virtual clock charged (samples_per_round)
    std::shared_ptr<const FloatBuffer> model;  // the round's pulled model, shared
    std::shared_ptr<FloatBuffer> delta;        // the trained update, sent zero-copy
    std::uint64_t start_seq = 0;
    // pulls_pending: 1 while it waits for the model; acks_pending: shards yet to ack its push.
    std::size_t pulls_pending = 0, acks_pending = 0;
    bool pulled = false, trained = false, pushed = false, done = false;
    bool mask_requested = false;  // secure aggregation: its masked input is being made
    std::vector<std::string> refusals;
    client::TrainResult result;
    client::EvalResult eval;
    double wall_train_s = 0, train_cpu_s = 0;
    std::uint64_t bytes_down = 0, bytes_up = 0;
    std::size_t micro_batch = 0;      // the slot network's micro-batch it trained with (0: whole)
    std::vector<std::uint32_t> rows;  // its rows, when computed (data.partition = sample:M)
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
    std::vector<bool> got;  // per shard: its pull reply arrived
    std::size_t pending = 0;
    std::vector<Job*> waiting;
  };

  // A selected client and the local steps its RoundStart asked for (0: train.*'s epochs/steps).
  struct Member {
    std::uint32_t client = 0;
    std::uint32_t local_steps = 0;
  };

  struct Collecting {
    std::uint64_t round = 0;
    transport::RoundStart rs;
    std::vector<Member> clients;
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

  std::string name_of(std::uint32_t c) const { return population_->name(c); }
  std::optional<std::uint32_t> client_of(const std::string& name) const {
    return population_->index_of(name);
  }
  DeviceProfile profile(std::uint32_t c) const;
  void send(std::size_t shard, std::uint32_t client, transport::Envelope e,
            transport::Payload payload = {});

  // ---- registration (fleet.cc) ------------------------------------------------------------------

  void drive_registration();
  // Every client that can train (memory_) is registered: the population's first Welcome.
  [[nodiscard]] bool all_registered() const { return welcomed_any_; }
  void send_register(std::uint32_t c);
  void on_welcome(std::uint32_t c, const transport::Welcome& w);
  void setup_model(const transport::Welcome& w);

  // ---- message dispatch and pulls (fleet.cc) ----------------------------------------------------

  void dispatch(transport::Message& m);
  void on_round_start(std::uint32_t c, const transport::RoundStart& rs);
  // A round whose RoundStarts stopped short of the selection size (a client left the pool):
  // plan it with what arrived after a quiet second. Not reached in a healthy simulation.
  void check_stalled_collection();
  Job* find_job(std::uint32_t c, std::uint64_t round, bool eval);
  void on_pull_reply(std::uint32_t c, const transport::PullReply& r, const transport::Message& m);
  void give_model(Job& job, std::shared_ptr<const FloatBuffer> params);
  std::uint64_t model_bytes() const;
  // The job gets the model of its round's version: at once when it is in, else when the pull
  // of it (sent now, if this is its first client) is answered.
  void request_model(Job& job);
  void on_push_ack(std::uint32_t c, const transport::PushAck& a, const transport::Message& m);

  // ---- rounds (fleet_rounds.cc) -----------------------------------------------------------------

  void plan(Collecting col);
  // Starts jobs within the window, pushes trained updates in client-id order, closes the round.
  void advance();
  static bool completers_reported(const Active& a);
  // A delta buffer: reused once ZeroMQ has released the last push that sent it (its deleter may
  // run on a shard's thread, hence the lock).
  std::shared_ptr<FloatBuffer> take_delta();
  void start_job(Job& job);
  void on_pulled(Job& job);
  void submit(Job& job);
  Slot* acquire_slot();
  void release_slot(Slot* s);
  void collect_results();
  void push(Job& job);

  // ---- reports to the coordinator, records (fleet_rounds.cc) ------------------------------------

  transport::ClientReport base_report(const Job& job) const;
  // Adds what the client measured on the virtual clock: throughput, and its link to each shard
  // (`pushed`: the push too, else the pull only).
  void add_measurements(const Job& job, bool pushed, transport::ClientReport& r) const;
  // Reports reach the coordinator in a fixed order: a round's reports wait for the evaluation
  // reports of earlier rounds, which the coordinator would otherwise see late or not at all
  // depending on thread timing.
  void send_report(const Job& job, const transport::ClientReport& r);
  void release_reports();
  void finish_training_job(Job& job);
  void complete(Job& job);
  void close_active();
  void on_evaluated(Job& job);
  // Writes the records of closed rounds, in order: a round's record once its evaluation is in,
  // or once a later round started (no evaluation was asked for), or at the end.
  void flush_records(bool all);
  void write_record(const RoundRecord& r);
  void progress_line(bool round_done);

  // ---- secure aggregation (fleet_secagg.cc) -----------------------------------------------------

  // A selected client's R0: its session, its advertisement.
  void secagg_begin(std::uint32_t c, const transport::RoundStart& rs);
  // The coordinator's stages for client c: keys (shares answered), forwarded shares, unmasking.
  void on_secagg(std::uint32_t c, const transport::Message& m, const transport::SecAgg& sa);
  void send_secagg(std::uint32_t c, std::uint64_t round, transport::SecAggStage stage,
                   const transport::SecAggData& data);
  // What a session's step on a training thread produced: a stage to send, the masked input, or
  // nothing (the shares opened); or why it failed.
  struct SecAggOut {
    std::optional<transport::SecAggStage> send;
    transport::SecAggData data;
    std::shared_ptr<std::vector<std::uint32_t>> masked;
    std::string error;
    std::uint32_t client = 0;
    std::uint64_t round = 0;
    double cpu_s = 0;
  };
  void secagg_task(std::uint32_t c, std::uint64_t round,
                   std::function<SecAggOut(client::SecAggSession&)> step);
  // Sends what the finished steps produced (the fleet's thread).
  void collect_secagg();
  // Masks the inputs of the round's trained completers whose shares are open (training threads).
  void secagg_prepare_inputs(Active& a);
  // The job may push: no secure aggregation, or its masked input is ready.
  [[nodiscard]] bool secagg_ready(const Job& job) const;
  // The job's masked input (secagg_ready()), handed over.
  std::shared_ptr<std::vector<std::uint32_t>> secagg_mask(const Job& job);
  // The round's protocol cost on the virtual clock (seconds), and its bytes into `rec`.
  double secagg_charge(const Active& a, RoundRecord& rec);

  const SimOptions sim_;
  const client::LocalTrainingRegistry& rules_;  // train.rule is made from it
  transport::Context& ctx_;
  std::vector<std::string> urls_;
  const std::atomic<bool>& stop_;
  std::function<bool()> shards_failed_;
  ThreadPool pool_;
  Reporter reporter_;
  const FleetMemory memory_;
  std::size_t n_ = 0;            // sim_.clients
  std::size_t registrants_ = 0;  // the clients that register: those whose memory fits
  std::uint32_t first_registrant_ = 0;
  std::size_t window_ = 4, expected_selected_ = 1;
  // The fleet's construction (the simulation's start), prepare()'s end, the first round's start.
  Clock::time_point started_, prepared_, first_round_wall_;

  client::Dataset train_, test_;
  client::ClientRows rows_;
  std::string partition_text_;
  std::shared_ptr<const server::VirtualPopulation> population_;
  std::vector<DeviceProfile> trace_;

  std::vector<std::unique_ptr<transport::Endpoint>> eps_;
  std::vector<transport::Endpoint*> ep_ptrs_;
  std::vector<transport::ShardInfo> shards_;
  kernels::NetworkSpec spec_;  // outlives the slots' networks
  std::uint64_t model_size_ = 0;
  client::TrainerOptions options_;
  std::unique_ptr<kernels::Device> device_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_slots_;
  std::mutex slots_mu_;  // guards free_slots_
  std::condition_variable slots_cv_;
  std::mutex results_mu_;  // guards results_
  std::vector<Result> results_;

  bool welcomed_any_ = false, finished_ = false;
  Clock::time_point next_knock_;

  std::deque<Collecting> collecting_;
  std::optional<Active> active_;
  std::vector<std::unique_ptr<Job>> evals_;
  std::size_t in_flight_ = 0;
  std::size_t training_ = 0;  // jobs handed to the training threads whose results are not in
  std::deque<std::pair<std::uint32_t, transport::ClientReport>> held_reports_;
  std::uint64_t starts_ = 0;
  // Secure aggregation: the round's sessions, and what each client spent on the protocol.
  struct SecAggClient {
    std::shared_ptr<client::SecAggSession> session;
    bool opened = false;                                 // its forwarded shares are open
    std::shared_ptr<std::vector<std::uint32_t>> masked;  // its masked input, until pushed
    double cpu_s = 0;
    std::uint64_t up = 0, down = 0;
  };
  std::map<std::uint32_t, SecAggClient> secagg_;
  std::uint64_t secagg_round_ = 0;
  // The round before secagg_round_, kept until its record is closed: the next round's stages may
  // start before close_active() charges this one (secagg_charge()).
  std::map<std::uint32_t, SecAggClient> secagg_prev_;
  std::uint64_t secagg_prev_round_ = 0;
  std::size_t secagg_tasks_ = 0;  // steps on the training threads whose results are not in
  std::mutex secagg_mu_;          // guards secagg_done_
  std::vector<SecAggOut> secagg_done_;
  struct Spare {
    std::mutex mu;  // guards buffers
    std::vector<FloatBuffer> buffers;
  };
  std::shared_ptr<Spare> spare_ = std::make_shared<Spare>();
  std::vector<std::unique_ptr<PulledModel>> models_;
  double sim_now_ = 0;
  std::map<std::uint64_t, RoundRecord> records_;
  std::map<std::uint64_t, client::EvalResult> evaluated_;
  Summary summary_;
};

}  // namespace cohort::sim
