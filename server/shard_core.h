// What every mode of a shard shares (ShardCore: the range, the parameters, the version, the rule
// and optimizer, the two-phase close's bookkeeping, checkpoints, the ack), and the interface of a
// mode's policy (ShardMode), one per server.mode under modes/. Internal to the server library.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/aggregation/aggregator.h"
#include "cohort/aggregation/push_codec.h"
#include "cohort/aggregation/server_optimizer.h"
#include "cohort/core/buffer.h"
#include "cohort/core/metrics.h"
#include "cohort/server/checkpoint.h"
#include "cohort/transport/secagg_messages.h"

#include "mode.h"
#include "outbox.h"
#include "push_intake.h"
#include "server_options.h"

namespace cohort::server {

// A shard's answer to phase one of a close (RoundClose.prepare).
struct Prepared {
  bool ok = false;
  std::string reason;  // why not, when !ok
};

// Contiguous ranges of [0, size) for `shards` shards, balanced by bytes (equal element counts,
// the remainder spread over the first shards).
std::pair<std::uint64_t, std::uint64_t> shard_range(std::uint64_t size, std::uint32_t shards,
                                                    std::uint32_t index);

// A refusal's or a failed round's reason as a label value (late, non_finite, malformed, ...): a
// few words, not the message (telemetry.cc).
std::string reason_class(const std::string& reason);

// What a shard counts for its HTTP endpoint (telemetry.h).
struct ShardStats {
  std::uint64_t accepted = 0;                    // updates acked as accepted
  std::map<std::string, std::uint64_t> refused;  // updates refused, by reason_class()
  std::uint64_t push_bytes = 0, pull_bytes = 0;  // update bytes received, model bytes served
  std::uint64_t checkpoint_failures = 0;
  std::optional<std::chrono::steady_clock::time_point> last_checkpoint;
};

// The state a shard's modes share. Not thread-safe: one thread drives the shard.
struct ShardCore {
  // Checkpoints go to `checkpoint.dir` (none when empty).
  ShardCore(const CheckpointOptions& checkpoint, Outbox& out, std::uint32_t index,
            std::uint32_t shards, MetricsSink* metrics);

  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(end - begin); }
  [[nodiscard]] ShardRange range() const { return {index, begin, end}; }

  // Answers push `m` with a PushAck carrying `ok`, `reason` and the current version.
  void reply_ack(const transport::Message& m, bool ok, std::string reason);
  // Answers pull `m` with its slice of the parameters, or a kBadRange error outside this range.
  // `batch_size` goes into the PullReply (data-parallel speed batches; 0: none).
  void serve_pull(const transport::Message& m, const transport::Pull& p,
                  std::uint32_t batch_size = 0);
  // Writes a checkpoint of the range, the version and the optimizer's state (when a store is set).
  void checkpoint();
  // Checkpoints when `count` is a multiple of checkpoint_every (and a store is set).
  void checkpoint_if_due(std::uint64_t count);
  // Why a rule-based round could not close with `n` complete updates (phase one's refusal).
  [[nodiscard]] std::string rule_refusal(std::size_t n) const;
  // Phase two's bookkeeping, once a mode is done: round `round` is closed, committed or not.
  void finish_close(std::uint64_t round, bool commit);

  // Decoders for compressed pushes come from a pool, so pushes never allocate.
  std::unique_ptr<aggregation::PushDecoder> take_decoder(aggregation::WireFormat format);
  void give_back(std::unique_ptr<aggregation::PushDecoder> decoder);

  const std::uint64_t checkpoint_every;  // server.checkpoint_every, at least 1
  Outbox& out;
  MetricsSink* metrics;
  const std::uint32_t index, shards;
  std::uint64_t begin = 0, end = 0;
  std::string model_spec;
  // The range's parameters. Every write goes through writable_params() or set_params(): they drop
  // the snapshot that pulls are served from.
  [[nodiscard]] const FloatBuffer& params() const { return params_; }
  std::span<float> writable_params() {
    snapshot_current_ = false;
    return params_.span();
  }
  void set_params(FloatBuffer p) {
    snapshot_current_ = false;
    params_ = std::move(p);
  }
  ShardStats stats;
  std::uint64_t version = 0;
  std::uint64_t committed = 0;       // rounds committed by this process (checkpoint cadence)
  std::uint64_t last_closed = 0;     // the last round (FedBuff: step) closed
  std::uint64_t prepared_round = 0;  // the round (FedBuff: step) prepare_round() answered for
  Prepared prepared;
  std::string aggregator_name;
  std::unique_ptr<aggregation::Aggregator> aggregator;
  std::unique_ptr<aggregation::ServerOptimizer> optimizer;
  std::optional<CheckpointStore> store;
  std::vector<std::unique_ptr<aggregation::PushDecoder>> spare_decoders;
  std::vector<float> decode_scratch;  // one decoded piece; grows once, reused by every push

 private:
  FloatBuffer params_;
  // The parameters as pulls see them until they change: the first pull after a change copies
  // them, and every pull is sent from the copy without another (the transport keeps it alive
  // while it sends), so a version costs one copy however many clients pull it. The copy is
  // rewritten in place when the transport holds it no more, else a new one is made.
  std::shared_ptr<FloatBuffer> pull_snapshot_;
  bool snapshot_current_ = false;
};

// One mode's handling of pulls, pushes and the two phases of a close. The Shard does what every
// mode shares (repeated prepares and closes, the restart of the coordinator) and calls these.
class ShardMode {
 public:
  virtual ~ShardMode() = default;
  virtual void on_pull(transport::Message& m, const transport::Pull& p) = 0;
  virtual void on_push(transport::Message& m, const transport::Push& p) = 0;
  // Phase one for a round not prepared yet: fills core.prepared (cleared, prepared_round set).
  virtual void prepare(std::uint64_t round) = 0;
  // Phase two for a round not closed yet (a commit has been prepared).
  virtual void close(std::uint64_t round, bool commit) = 0;
  // The coordinator restarted: drops (FedBuff: puts back) what belonged to its rounds.
  virtual void on_coordinator_restart() = 0;
  // Federated: the coordinator's selection for `round` (see Shard::open_round).
  virtual void open_round(std::uint64_t /*round*/, const std::vector<NodeId>& /*clients*/) {}
  // Secure aggregation (federated): take no more of round `round`'s masked inputs, and name whose
  // this shard holds complete; then the seeds that remove their masks (prepare() uses them).
  [[nodiscard]] virtual std::vector<NodeId> secagg_held(std::uint64_t /*round*/) { return {}; }
  virtual void secagg_seeds(std::uint64_t /*round*/, const transport::SecAggData& /*seeds*/) {}
  // FedBuff: updates buffered, and how many the step being prepared set aside.
  [[nodiscard]] virtual std::size_t buffered() const { return 0; }
  [[nodiscard]] virtual std::size_t prepared_count() const { return 0; }
};

}  // namespace cohort::server
