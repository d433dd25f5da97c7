// The shard: owns [begin, end) of the flat parameter vector, serves pulls, folds pushes in, and
// closes rounds (FedBuff: steps) in two phases when the coordinator says so. It takes each
// received transport::Message (or chunk of one) and answers through an Outbox, never an
// Endpoint; the mode's policy (modes/) does what differs between federated, FedBuff and
// data-parallel training. Internal to the server library.
//
// Thread-safety: none; one thread drives a shard (node.cc's loop, or a test).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/clock.h"

#include "shard_core.h"

namespace cohort::server {

class Shard {
 public:
  // Shard options.node.index of options.node.shards, in options.modes, answering through `out`.
  // `metrics` may be null (only shard 0 writes metrics). Keeps what it needs of `options`
  // (checkpoints, DP, the mode's settings, the rule's and the optimizer's sections). `clock`
  // times the data-parallel workers' steps (server.batch_policy = speed); it must outlive the
  // shard.
  Shard(const ServerOptions& options, const Registries& registries, Outbox& out,
        MetricsSink* metrics, const Clock& clock = steady_clock());
  ~Shard();

  // Lays out the range and loads the newest checkpoint, or initialises from the model's seed.
  // Throws ConfigError for a checkpoint of another model or layout.
  void setup(const std::string& model_spec, std::uint64_t model_size);

  [[nodiscard]] bool ready() const { return !core_.params().empty() || size() == 0; }
  [[nodiscard]] std::uint64_t begin() const { return core_.begin; }
  [[nodiscard]] std::uint64_t end() const { return core_.end; }
  [[nodiscard]] std::size_t size() const { return core_.size(); }
  [[nodiscard]] std::uint64_t version() const { return core_.version; }
  [[nodiscard]] std::uint64_t last_closed() const { return core_.last_closed; }
  [[nodiscard]] const ShardStats& stats() const { return core_.stats; }
  [[nodiscard]] std::span<const float> params() const { return core_.params().span(); }
  // The aggregation rule's name, and the fewest complete updates with which it can aggregate.
  [[nodiscard]] const std::string& rule_name() const { return core_.aggregator_name; }
  [[nodiscard]] std::size_t rule_min_updates() const;

  // The coordinator's selection for federated round `round` (RoundOpen): the first message for a
  // newer round replaces the list, later ones for the same round add to it. Only these clients'
  // pushes for the round are accepted.
  void open_round(std::uint64_t round, const std::vector<NodeId>& clients);

  // Handles a pull or push message (or chunk); returns true if it was one. REQUIRES: ready().
  bool handle(transport::Message& m);

  // Phase one of closing round `round` (RoundClose.prepare): the rule computes the aggregate
  // (FedBuff: the buffered updates are set aside as this step's), nothing is applied yet. The
  // coordinator commits only if every shard's rule could, so a round moves every shard's range
  // or none. Asked again for the same round (a retry), it answers the same.
  Prepared prepare_round(std::uint64_t round);

  // Round r is over: fold in (commit) or throw away what arrived (FedBuff: put the step's
  // updates back into the buffer). Returns the new version. A repeated close is a no-op.
  std::uint64_t close_round(std::uint64_t round, bool commit);

  // Secure aggregation (server.secure_aggregation): stop taking round `round`'s masked inputs and
  // name whose this shard holds complete; then take the seeds that remove their masks, which
  // prepare_round() uses.
  [[nodiscard]] std::vector<NodeId> secagg_held(std::uint64_t round) {
    return mode_->secagg_held(round);
  }
  void secagg_seeds(std::uint64_t round, const transport::SecAggData& seeds) {
    mode_->secagg_seeds(round, seeds);
  }

  // FedBuff's buffered updates, and how many the step being prepared set aside.
  [[nodiscard]] std::size_t buffered() const { return mode_->buffered(); }
  [[nodiscard]] std::size_t prepared_count() const { return mode_->prepared_count(); }

  // The coordinator welcomed this shard (again). A new epoch means it restarted: whatever round
  // this shard had open belongs to the old coordinator, which the new one reopens from scratch,
  // so its updates go (a resend would otherwise be acknowledged as "already applied" and the old
  // update kept). `committed` is the coordinator's last committed round: a round this shard
  // prepared and the coordinator committed before it died is committed here too.
  void on_welcome(std::uint64_t epoch, std::uint64_t committed);

  // Writes a checkpoint now (when a checkpoint directory is set); a failure is logged.
  void checkpoint() { core_.checkpoint(); }

 private:
  const Registries& registries_;
  Modes modes_;
  // For setup(): the registries' factories read the sections themselves (the plug-in API).
  std::string aggregator_name_;
  ConfigSection aggregator_options_;
  std::string optimizer_name_;
  ConfigSection optimizer_options_;
  std::string checkpoint_dir_;  // named in the error for a checkpoint of another model
  std::uint64_t model_seed_;
  ShardCore core_;
  std::unique_ptr<ShardMode> mode_;
  std::uint64_t coordinator_epoch_ = 0;  // of the coordinator that last welcomed this shard
};

}  // namespace cohort::server
