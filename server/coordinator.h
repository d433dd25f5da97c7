// The coordinator (on shard 0): membership, the round state machine (federated rounds, FedBuff
// steps, the data-parallel task), two-phase closes across the shards, evaluation and metrics.
// It takes received messages (handle()) and is ticked by its node's loop (tick()); it sends
// through an Outbox and reads time from a Clock, so tests drive it without sockets or sleeps.
// Internal to the server library; not thread-safe (one thread drives it).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cohort/aggregation/privacy.h"
#include "cohort/core/clock.h"
#include "cohort/core/metrics.h"
#include "cohort/server/population.h"

#include "mode.h"
#include "outbox.h"
#include "population_pool.h"
#include "profiles.h"
#include "round_report.h"
#include "secagg_round.h"
#include "server_options.h"
#include "shard.h"
#include "telemetry.h"

namespace cohort::server {

class Coordinator {
 public:
  // `local` is shard 0, in this process (set up already); `name` and `url` are shard 0's node id
  // and listening url, as the Welcome lists them. Every reference must outlive the coordinator.
  // Keeps what it needs of `options` (the modes, rounds, FedBuff, DP, [train] to forward).
  // `population` (cohort-sim, in one process): its members register in bulk, the first Register
  // from one of them standing for all (population.h); any other client is refused.
  Coordinator(const ServerOptions& options, Shard& local, Outbox& out, const Clock& clock,
              const NodeId& name, const std::string& url, MetricsSink& metrics,
              std::shared_ptr<const VirtualPopulation> population = nullptr);

  [[nodiscard]] bool finished() const { return finished_; }
  // Why training stopped without finishing (give_up), or empty.
  [[nodiscard]] const std::string& failure() const { return failure_; }
  // Sent in every Welcome: shards compare it to tell a restarted coordinator from a reconnect.
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  // The membership and progress the HTTP endpoint shows (coordinator_snapshot.cc).
  [[nodiscard]] CoordinatorSnapshot snapshot() const;
  // The index of the shard whose node id is `id`, if it is one of this federation's shards.
  [[nodiscard]] std::optional<std::uint32_t> shard_of(const NodeId& id) const;

  // Returns true if the message was the coordinator's (Register, ClientReport, a shard's
  // PushAck to a close, Heartbeat, Bye).
  bool handle(transport::Message& m);

  // Drives deadlines, retries and the start and close of rounds; call it after every message
  // and at least every 50 ms.
  void tick();

 private:
  // kPreparing: phase one of a close (every shard computes its aggregate); kClosing: phase two
  // (every shard commits or discards).
  // kUnmasking (secure aggregation): the round took its last report and unmasks before phase one.
  enum class State { kIdle, kRunning, kUnmasking, kPreparing, kClosing };
  struct ClientInfo {
    transport::PeerHandle peer;
    std::uint64_t dataset_size = 0;
    TimePoint last_seen;
    std::uint32_t index = 0;
    // False once a send to `peer` found the connection gone: the client sits out rounds (and does
    // not count towards server.min_clients) until it is heard from again, which after a
    // reconnect is its registration on the new session.
    bool reachable = true;
    bool evaluates = true;  // Register.no_evaluation unset: it has a test set
    // Federated: the measured device profile (profiles.h), reset when the client registers.
    ClientProfile profile;
  };
  struct ShardInfo {
    bool up = false;
    transport::PeerHandle peer;
    std::string url;
    NodeId node_id;
    bool closed = false;
    bool prepared = false;  // answered this close's phase one
  };

  [[nodiscard]] bool federated() const {
    return modes_.mode == transport::TrainingMode::kFederated;
  }
  [[nodiscard]] bool buffered() const { return modes_.mode == transport::TrainingMode::kBuffered; }
  [[nodiscard]] bool dataparallel() const {
    return modes_.mode == transport::TrainingMode::kDataParallel;
  }

  void touch(const transport::Message& m);
  // The client's entry; a population member that is present but has none yet gets one (its peer
  // handle on the population's connection). nullptr for anyone else.
  ClientInfo* client(const NodeId& id);
  // Marks a client unreachable (a send found its connection gone) or reachable again.
  void set_reachable(const NodeId& id, ClientInfo& c, bool reachable);
  // The client leaves the pool (Bye, a fatal report, timed out).
  void drop_client(const NodeId& id);
  // A member's first Register (population mode): every present member is registered from here.
  void join_population(const transport::Message& m);
  // Population mode: the cohort drawn from the pool's counters (population_pool.h).
  std::vector<NodeId> select_members(std::size_t want);
  // The registered client at the evaluation cursor, which it advances (nullptr for a member that
  // is not reachable).
  std::pair<NodeId, ClientInfo*> next_to_evaluate();
  // Registered clients: in population mode the present members, whether they have an entry yet.
  [[nodiscard]] std::size_t registered_clients() const;
  [[nodiscard]] bool all_shards_up() const;
  [[nodiscard]] std::size_t live_clients() const;
  [[nodiscard]] bool enough_clients() const;  // live_clients() >= min_clients_
  [[nodiscard]] transport::Welcome welcome(std::uint32_t index) const;
  void on_register(const transport::Message& m, const transport::Register& r);
  void send_round_open(std::size_t i);
  void reply_error(const transport::Message& m, std::string why);
  std::vector<NodeId> select();
  void start_round();
  // Secure aggregation (server.secure_aggregation): its round, its start and its stages.
  void make_secagg(const SecAggOptions& options);
  void begin_secagg();
  void tick_secagg();
  // Starts and closes federated rounds; false when it finished or gave up (no sweep then).
  bool tick_federated(TimePoint now);
  void sweep_clients(TimePoint now);
  void tick_dataparallel(TimePoint now);
  void tick_fedbuff(TimePoint now);
  void on_report(const transport::Message& m, const transport::ClientReport& r);
  // A counted federated report: the client's profile takes its measurements (an incomplete
  // update's replace the averages: kMissAlpha), and its "client" record waits for the end of the
  // round.
  void note_client_report(const NodeId& id, const transport::ClientReport& r);
  // A federated report that came after its round stopped taking reports (a client whose planned
  // work did not fit the deadline, or one cut when the round filled): kept for the profile.
  void note_late_report(const NodeId& id, const transport::ClientReport& r);
  // RoundStart.local_steps for each client of the cohort `chosen`, in its order: train.steps
  // under server.work = fixed; under deadline the planner's counts (profiles.h), for a round
  // planned to the latest fixed-work finish of the cohort, at most (1 - margin) D. What a client
  // has not measured is taken from fleet_prior() (filled_from()) and its work is then at most
  // its fixed work; before any client has been measured, everyone gets server.min_local_steps.
  [[nodiscard]] std::vector<std::uint32_t> plan_work(const std::vector<NodeId>& chosen) const;
  // D of the planner: WorkOptions::plan_deadline_s, else the round's deadline.
  [[nodiscard]] double plan_deadline_seconds() const;
  // RoundStart.local_steps for a selected client: train.steps (server.work = fixed) or the
  // deadline planner's count from its profile, for a round planned to `round_s` seconds.
  [[nodiscard]] std::uint32_t local_steps_for(const ClientInfo& c, double round_s) const;
  // Once the running round takes no more reports: folds the late reports kept since the last
  // such point into the profiles (with kMissAlpha; not for clients that reported in time in this
  // round, whose measurement is newer), then writes the round's "client" records in client-id
  // order. A simulation's late reports all arrive before its next round ends, so it folds and
  // writes the same every run.
  void write_client_records();
  void on_fatal_report(const transport::Message& m, const transport::ClientReport& r);
  void on_task_report(const transport::Message& m, const transport::ClientReport& r);
  // The last round (FedBuff: step) the coordinator's own shard closed.
  [[nodiscard]] std::uint64_t committed_round() const { return local_.last_closed(); }
  void prepare_close(std::uint64_t round, std::size_t updates);
  bool send_round_close(bool ShardInfo::*answered, const transport::RoundClose& close);
  void resend_prepare();
  void prepared_everywhere();
  void round_failed(const std::string& why);
  void close_round(bool commit);
  void resend_close();
  void on_shard_ack(const transport::Message& m, const transport::PushAck& a);
  void round_closed();
  [[nodiscard]] RoundRecord current_record() const;
  void queue_line(std::uint64_t round_id, const RoundRecord& record);
  void give_up();
  void finish(const char* why = "training finished");

  Modes modes_;
  Shard& local_;
  Outbox& out_;
  const Clock& clock_;
  MetricsSink& metrics_;
  std::mt19937_64 rng_;
  std::vector<ShardInfo> shards_;
  // Every registered client; in population mode only the members selected or heard from (the
  // others are counted in population_pool_).
  std::map<NodeId, ClientInfo> clients_;
  std::shared_ptr<const VirtualPopulation> population_;
  PopulationPool population_pool_;
  transport::PeerHandle population_peer_;  // the handle its first Register came from
  bool population_joined_ = false;
  std::uint32_t next_client_index_ = 0;
  std::string model_spec_;
  std::uint64_t model_size_ = 0;
  std::uint64_t rounds_ = 0, round_ = 0, committed_ = 0, eval_every_ = 1;
  std::size_t per_round_ = 0, min_clients_ = 1, min_updates_ = 1, rule_min_ = 1;
  std::uint64_t failed_in_a_row_ = 0, max_failed_rounds_ = 10;
  std::string last_refusal_, last_failure_, failure_;
  double overselect_ = 1.0;
  Selection selection_ = Selection::kUniform;
  std::chrono::milliseconds deadline_{60000};
  WorkOptions work_;
  std::chrono::milliseconds client_timeout_{60000};
  std::uint32_t heartbeat_ms_ = 2000;
  std::uint32_t dp_steps_ = 100;  // data-parallel: steps each worker takes
  TrainForward train_;            // [train], forwarded to the clients
  State state_ = State::kIdle;
  std::uint64_t epoch_ = 0;
  std::uint64_t closing_round_ = 0;  // the round (FedBuff: step) being prepared or closed
  std::size_t closing_updates_ = 0;
  std::string prepare_failure_;  // the first shard's reason its rule could not aggregate
  bool closing_commit_ = false;
  TimePoint close_retry_;
  std::set<NodeId> selected_, completed_;
  std::vector<NodeId> round_selection_;  // the running round's cohort, as sent to the shards
  std::size_t reported_ = 0;
  std::set<NodeId> reporters_;                // who has reported in the running federated round
  std::map<NodeId, std::uint32_t> assigned_;  // RoundStart.local_steps sent this round
  std::map<NodeId, ClientRoundRecord> round_clients_;  // this round's records, by client
  std::map<NodeId, transport::ClientReport> late_;     // late reports not folded in yet
  // Complete updates per client over the whole run (they survive a re-registration).
  std::map<NodeId, std::uint64_t> participations_;
  // Rounds each client was selected for (less those it was cut from when the round closed early
  // with K updates), and the last one: server.selection = speed_aware's counts.
  std::map<NodeId, std::uint64_t> selections_, last_selected_;
  double round_loss_ = 0, round_bytes_ = 0, round_train_s_ = 0, round_comm_s_ = 0;
  std::uint64_t round_samples_ = 0;
  double last_round_s_ = 0;
  double round_uplink_ = 0;
  double dp_noise_ = 0, dp_delta_ = 1e-5, round_sampling_rate_ = 1.0;
  aggregation::RdpAccountant accountant_;
  std::optional<SecAggRound> secagg_;  // server.secure_aggregation != none (federated)
  bool dp_uniform_ = false;            // dp.clip > 0: every client weighs alike
  TimePoint started_, round_started_, round_deadline_;
  RoundReport report_;
  std::size_t eval_cursor_ = 0;
  bool finished_ = false;
  bool dp_started_ = false, fb_started_ = false;
  std::size_t buffer_k_ = 10, concurrency_ = 10;
  std::size_t step_updates_ = 0;   // FedBuff: updates in the step being closed (shard 0's count)
  TimePoint fb_retry_;             // FedBuff: no new step before this after one not ready
  bool fb_short_ = false;          // FedBuff: a step was not ready with no task in flight
  bool fb_prepared_idle_ = false;  // FedBuff: no task was in flight when this step was prepared
  std::map<NodeId, TimePoint> busy_;
  TimePoint next_sweep_;  // of timed-out clients
};

}  // namespace cohort::server
