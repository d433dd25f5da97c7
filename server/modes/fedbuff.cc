// FedBuff (docs/ALGORITHMS.md 1.6): deltas are folded in as they stream, weighted by
// s(tau) = 1/sqrt(1 + tau) where tau is the staleness (versions since the client's pull); the
// coordinator steps every shard together once K updates are in: the model moves by
// eta_g * (1/K) * sum and the version increments. Updates staler than server.max_staleness
// (>= 0) are refused.

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "cohort/core/log.h"

#include "modes.h"

namespace cohort::server {
namespace {

using transport::Message;

class FedBuffMode final : public ShardMode {
 public:
  FedBuffMode(ShardCore& core, const FedBuffOptions& options) : core_(core) {
    max_staleness_ = options.max_staleness;
    buffer_k_ = options.buffer_size;
  }

  void on_pull(Message& m, const transport::Pull& p) override { core_.serve_pull(m, p); }
  void on_push(Message& m, const transport::Push& p) override;

  // K = buffer_size updates, on every shard: the coordinator counts its own shard's, and a
  // client's push may still be on its way to this one. Not yet is not a failure: the
  // coordinator puts the buffers back and asks again shortly.
  void prepare(std::uint64_t /*step*/) override {
    if (buffered_ < buffer_k_) {
      core_.prepared.reason = "shard " + std::to_string(core_.index) + " holds " +
                              std::to_string(buffered_) + " of " + std::to_string(buffer_k_) +
                              " updates";
      return;
    }
    prepared_sum_.swap(buffer_sum_);
    buffer_sum_.assign(core_.size(), 0.0);
    prepared_count_ = buffered_;
    buffered_ = 0;
    core_.prepared.ok = true;
  }

  // The step set aside by prepare() moves the model (commit), or goes back into the buffer.
  void close(std::uint64_t step, bool commit) override {
    if (core_.prepared_round != step || !core_.prepared.ok) {
      core_.prepared_round = 0;
      core_.prepared = {};
      return;
    }
    const std::size_t size = core_.size();
    if (commit) {
      if (delta_.size() != size) delta_ = FloatBuffer(size);
      const double inv_k = 1.0 / static_cast<double>(prepared_count_);
      for (std::size_t i = 0; i < size; ++i)
        delta_[i] = static_cast<float>(prepared_sum_[i] * inv_k);
      core_.optimizer->apply_delta(core_.writable_params(), delta_.span());
      ++core_.version;
      core_.last_closed = step;
      core_.checkpoint_if_due(core_.version);
    } else {
      for (std::size_t i = 0; i < size; ++i) buffer_sum_[i] += prepared_sum_[i];
      buffered_ += prepared_count_;
    }
    std::fill(prepared_sum_.begin(), prepared_sum_.end(), 0.0);
    prepared_count_ = 0;
    core_.prepared_round = 0;
    core_.prepared = {};
  }

  void on_coordinator_restart() override {
    last_task_.clear();  // the new coordinator numbers its tasks afresh
    if (core_.prepared_round == 0) return;
    // Worded as a federated shard's drop, which names its round and applied updates (none here).
    COHORT_LOG(Info) << "shard " << core_.index << ": the coordinator restarted: dropped round 0"
                     << " (0 update(s) applied), it will be reopened";
    close(core_.prepared_round, false);  // back into the buffer
  }

  [[nodiscard]] std::size_t buffered() const override { return buffered_; }
  [[nodiscard]] std::size_t prepared_count() const override { return prepared_count_; }

 private:
  // One client's update of one task, fed by its transfer and by any resend that continues it
  // (place_chunk()): every transfer key of the push shares it.
  struct BufferedTask {
    double weight = 1.0;                                // s(tau)
    std::unique_ptr<aggregation::PushDecoder> decoder;  // compressed pushes only
    std::string client;
    std::uint64_t task = 0;      // the coordinator's task id (the push's round)
    transport::Push push;        // the first chunk's header: a resend must match it
    std::uint64_t bytes = 0;     // the payload's length
    std::uint64_t received = 0;  // payload bytes folded in, [0, received)
    bool done = false;           // buffered, or refused part-way
  };
  using Tasks = std::unordered_map<std::string, std::shared_ptr<BufferedTask>>;

  // The update ends (complete or refused): it no longer streams. The transfer `it` is forgotten;
  // another transfer of the same update, if any, finds it done.
  void end_transfer(Tasks::iterator it, bool buffered);

  // Checks the first chunk of a push and starts its task; false when refused (acked).
  bool start(const Message& m, const transport::Push& p, const std::string& key);

  ShardCore& core_;
  std::int64_t max_staleness_ = -1;
  std::size_t buffer_k_ = 10, buffered_ = 0;
  Tasks buffered_tasks_;  // by sender#seq
  std::set<std::string> rejected_transfers_;
  std::unordered_map<std::string, std::uint64_t> last_task_;  // client -> last task buffered
  // (client, task) streaming in, and its update.
  std::map<std::pair<std::string, std::uint64_t>, std::shared_ptr<BufferedTask>> streaming_;
  std::vector<double> buffer_sum_;
  std::vector<double> prepared_sum_;  // the step being prepared
  std::size_t prepared_count_ = 0;
  FloatBuffer delta_;  // the step's mean, reused by every step
};

bool FedBuffMode::start(const Message& m, const transport::Push& p, const std::string& key) {
  static constexpr PushRules kRules{.kind = transport::PushKind::kDelta,
                                    .wrong_kind = "this server runs FedBuff; send deltas"};
  // A client resends a push its ack has not answered within the resend wait (a loaded shard,
  // or a link that dropped mid-way), as a new transfer of the same task. It must count once:
  // buffered already, it is acknowledged again and its bytes ignored; still streaming, it
  // continues the update, taking the bytes the first transfer did not bring (the first broke
  // off, or is still coming: whichever reaches the end answers). A client's tasks come one
  // after another, so its last buffered task is all that needs keeping.
  const std::uint64_t task_id = m.envelope.round;
  const auto last = last_task_.find(m.sender);
  if (last != last_task_.end() && task_id == last->second) {
    rejected_transfers_.insert(key);
    core_.reply_ack(m, true, "");
    COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender
                     << " resent its update for task " << task_id
                     << ", already buffered: acknowledged again";
    return false;
  }
  if (const auto live = streaming_.find({m.sender, task_id}); live != streaming_.end()) {
    if (live->second->push == p && live->second->bytes == m.envelope.payload_bytes) {
      COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender
                       << " resent its update for task " << task_id << " while "
                       << live->second->received << " of " << live->second->bytes
                       << " bytes are in: the resend continues it";
      buffered_tasks_[key] = live->second;
      return true;
    }
    rejected_transfers_.insert(key);
    core_.reply_ack(m, false,
                    "a different update for task " + std::to_string(task_id) +
                        " while the first still streams in");
    return false;
  }
  const std::uint64_t version = core_.version;
  const std::uint64_t tau = version >= p.base_version ? version - p.base_version : 0;
  std::string why = check_push_shape(p, m.envelope.payload_bytes, core_.range(), kRules);
  if (why.empty()) {
    if (p.base_version > version) {
      why = "update from a future version";
    } else if (max_staleness_ >= 0 && tau > static_cast<std::uint64_t>(max_staleness_)) {
      why = "update too stale (" + std::to_string(tau) + " versions)";
    } else if (last != last_task_.end() && task_id < last->second) {
      why = "update for task " + std::to_string(task_id) + ", older than task " +
            std::to_string(last->second) + " already buffered";
    }
  }
  if (!why.empty()) {
    core_.reply_ack(m, false, why);
    rejected_transfers_.insert(key);
    return false;
  }
  if (buffer_sum_.size() != core_.size()) buffer_sum_.assign(core_.size(), 0.0);
  auto taken = std::make_shared<BufferedTask>();
  BufferedTask& task = *taken;
  task.weight = 1.0 / std::sqrt(1.0 + static_cast<double>(tau));
  if (p.encoding != transport::Encoding::kDenseF32)
    task.decoder = core_.take_decoder(*wire_format(p.encoding));
  task.client = m.sender;
  task.task = task_id;
  task.push = p;
  task.bytes = m.envelope.payload_bytes;
  streaming_[{m.sender, task_id}] = taken;
  buffered_tasks_[key] = std::move(taken);
  return true;
}

void FedBuffMode::end_transfer(Tasks::iterator it, bool buffered) {
  BufferedTask& t = *it->second;
  t.done = true;
  core_.give_back(std::move(t.decoder));
  streaming_.erase({t.client, t.task});
  if (buffered) last_task_[t.client] = t.task;
  buffered_tasks_.erase(it);
}

void FedBuffMode::on_push(Message& m, const transport::Push& p) {
  const std::string key = m.sender + "#" + std::to_string(m.envelope.seq);
  if (m.offset == 0) (void)start(m, p, key);
  if (rejected_transfers_.contains(key)) {
    if (m.complete) rejected_transfers_.erase(key);
    return;
  }
  auto it = buffered_tasks_.find(key);
  if (it == buffered_tasks_.end()) return;
  BufferedTask& task = *it->second;
  if (task.done) {
    // A second transfer of an update another one ended: its end hears the update's outcome
    // (buffered once; a refusal was heard by the transfer it ended).
    if (m.complete) {
      const auto last = last_task_.find(m.sender);
      const bool buffered = last != last_task_.end() && last->second == task.task;
      core_.reply_ack(m, buffered, buffered ? "" : "the update was refused part-way");
      buffered_tasks_.erase(it);
    }
    return;
  }
  std::string why;
  const ChunkPlace place = place_chunk(task.received, m);
  switch (place.kind) {
    case ChunkPlace::kNext: break;
    case ChunkPlace::kTaken: return;  // the other transfer of this update brought it
    case ChunkPlace::kGap:
      why = "chunk at byte " + std::to_string(m.offset) + " while " +
            std::to_string(task.received) + " bytes are in";
      end_transfer(it, false);
      core_.reply_ack(m, false, why);
      return;
  }
  // An update folded in part and then refused stays folded in part, as for any streaming rule.
  const double w = task.weight;
  const std::size_t size = core_.size();
  auto fold = [&](std::size_t first, std::span<const float> v) {
    if (!chunk_fits(first, v.size(), size, why)) return false;
    for (float x : v) {
      if (!std::isfinite(x)) {
        why = "update has non-finite values";
        return false;
      }
    }
    for (std::size_t i = 0; i < v.size(); ++i)
      buffer_sum_[first + i] += w * static_cast<double>(v[i]);
    return true;
  };
  if (!decode_chunk(m, place.skip, task.decoder.get(), core_.decode_scratch, fold, why)) {
    end_transfer(it, false);
    core_.reply_ack(m, false, why);
    return;
  }
  task.received = m.offset + m.payload.size();
  if (!m.complete) return;
  end_transfer(it, true);
  ++buffered_;
  core_.reply_ack(m, true, "");
  // The coordinator steps every shard together (prepare_round, close_round) once K updates
  // are in; a shard never steps on its own count, which could differ from another shard's.
}

}  // namespace

std::unique_ptr<ShardMode> make_fedbuff_mode(ShardCore& core, const FedBuffOptions& options) {
  return std::make_unique<FedBuffMode>(core, options);
}

}  // namespace cohort::server
