// Data-parallel training (docs/ALGORITHMS.md section 3). A worker's clock is the number of
// gradients it has pushed. Worker p pulls with its clock c in Pull.min_version; the pull is
// answered when c - min_q c_q <= s (BSP: s = 0, ASP: always). ASP and SSP apply each gradient as it
// completes; BSP buffers the n gradients of a step and applies their sum in a fixed (worker id)
// order, so a run is bit-reproducible. Under BSP with server.batch_policy = speed (ALGORITHMS.md
// 3.4) the workers' batches differ: each pushes the sum of its per-sample gradients over its
// b_p samples (Push.num_samples = b_p), and the step applies n / B times the sum, B = sum b_p,
// which is the equal policy's step (the sum of n mean gradients) over the same B samples. Shard 0
// times each worker's step and hands out the batches (BatchBalancer) in its PullReplies.

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "cohort/core/log.h"
#include "cohort/kernels/primitives.h"

#include "../batch_balancer.h"
#include "modes.h"

namespace cohort::server {
namespace {

using transport::Message;

class DataParallelMode final : public ShardMode {
 public:
  DataParallelMode(ShardCore& core, Consistency consistency, const DataParallelOptions& options,
                   const Clock& clock)
      : core_(core), consistency_(consistency), clock_(clock) {
    staleness_bound_ = options.staleness;
    workers_ = options.workers;
    batch_size_ = options.batch_size;
    speed_ = consistency == Consistency::kBsp && options.batch_policy == BatchPolicy::kSpeed;
    if (speed_ && core.index == 0) {
      balancer_.emplace(options.workers, options.batch_size, options.max_worker_batch,
                        options.rebalance_every);
    }
  }

  void on_pull(Message& m, const transport::Pull& p) override {
    pending_pulls_.push_back(PendingPull{m.peer, m.sender, m.envelope, p});
    serve_pending_pulls();
  }
  void on_push(Message& m, const transport::Push& p) override;

  // The coordinator closes no data-parallel round; a close that came anyway fails as a
  // rule-based round with nothing in it would, and moves nothing.
  void prepare(std::uint64_t /*round*/) override { core_.prepared.reason = core_.rule_refusal(0); }
  void close(std::uint64_t round, bool commit) override { core_.finish_close(round, commit); }
  void on_coordinator_restart() override {}

 private:
  struct PendingPull {
    transport::PeerHandle peer;
    NodeId worker;
    transport::Envelope envelope;
    transport::Pull pull;
  };

  [[nodiscard]] std::uint64_t min_clock() const {
    if (clocks_.size() < workers_) return 0;
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (const auto& [w, c] : clocks_) m = std::min(m, c);
    return m;
  }

  void serve_pending_pulls();
  // Checks the first chunk of a gradient and prepares its reassembly; false when refused.
  bool start(const Message& m, const transport::Push& p, const std::string& key);
  // A chunk of a gradient reassembled before it is applied (BSP, or a non-elementwise rule).
  void on_whole_gradient_chunk(Message& m, const std::string& key);
  // The complete gradient `g` of m.sender: BSP buffers it for its step, ASP/SSP apply it.
  void apply(const Message& m, FloatBuffer& g);
  void on_streamed_gradient_chunk(Message& m, const std::string& key);

  // Speed batches: why push `p` of worker `w` is refused ("" if it is not), its samples and step
  // time taken in, the step's sum scaled to n / B, and the balancer told the step closed.
  [[nodiscard]] std::string check_samples(const NodeId& w, const transport::Push& p) const;
  void note_samples(const Message& m, std::uint64_t clock);
  void scale_step(std::uint64_t clock);
  void step_done(std::uint64_t clock);

  // ASP and SSP with an elementwise optimizer apply a gradient as it streams in, chunk by chunk,
  // straight from the received bytes (in plaintext, the received frame itself, never copied):
  // each chunk is checked for NaN/Inf and applied while it is hot in cache, so the step costs one
  // pass over the gradient, overlaps the transfer, and needs O(chunk) memory per pushing worker
  // instead of a reassembly buffer each. A chunk is the unit of atomicity, as a key or partition
  // is in ps-lite and BytePS: a chunk with a non-finite value is refused with the rest of its
  // push (the worker gets a refusal and its clock does not advance), while the chunks before it
  // stay applied; the model never sees a non-finite value. Consistency is unchanged: ASP
  // promises none within a step, and SSP bounds complete steps, which the clocks count.
  [[nodiscard]] bool piecewise() const {
    return consistency_ != Consistency::kBsp && core_.optimizer->elementwise();
  }
  static constexpr std::size_t kApplyBlock = 4096;  // floats: 16 KiB, well inside L1 + L2

  ShardCore& core_;
  Consistency consistency_;
  const Clock& clock_;
  std::uint64_t batch_size_ = 1;           // train.batch_size
  bool speed_ = false;                     // BSP with server.batch_policy = speed
  std::optional<BatchBalancer> balancer_;  // shard 0 under speed_
  // Shard 0 under speed_: when the open step began (the step before it closed). A worker's time
  // for the step runs from there to its gradient: everything it does between two gradients
  // (its next pull, the transfers, the compute) is on the step's critical path.
  std::uint64_t open_step_ = 0;
  TimePoint open_since_{};
  std::map<std::uint64_t, std::uint64_t> step_samples_;  // speed_: samples pushed per open step
  std::uint64_t staleness_bound_ = 0;
  std::size_t workers_ = 1;
  std::map<NodeId, std::uint64_t> clocks_;
  std::deque<PendingPull> pending_pulls_;
  std::unordered_map<std::string, FloatBuffer> gradients_;
  std::set<std::string> streaming_;  // gradients being applied as they stream (piecewise())
  std::vector<FloatBuffer> spare_;
  std::map<std::uint64_t, std::map<NodeId, FloatBuffer>> step_buffer_;
  std::set<std::string> rejected_transfers_;
  FloatBuffer step_sum_;  // BSP: the step's summed gradients
};

void DataParallelMode::serve_pending_pulls() {
  const std::uint64_t bound = consistency_ == Consistency::kBsp ? 0 : staleness_bound_;
  const bool asp = consistency_ == Consistency::kAsp;
  const std::uint64_t slowest = min_clock();
  for (auto it = pending_pulls_.begin(); it != pending_pulls_.end();) {
    const std::uint64_t clock = it->pull.min_version;
    if (asp || clock <= slowest + bound) {
      // A speed batch is fixed for the whole step: it changes only when a step closes.
      const std::uint64_t batch = balancer_ ? balancer_->batch(it->worker, clock) : batch_size_;
      if (core_.metrics != nullptr) {
        core_.metrics->write("dp_pull", {{"shard", std::uint64_t{core_.index}},
                                         {"worker", it->worker},
                                         {"clock", clock},
                                         {"min_clock", slowest},
                                         {"version", core_.version},
                                         {"batch", batch}});
      }
      const Message m{.peer = it->peer, .sender = it->worker, .envelope = it->envelope};
      core_.serve_pull(m, it->pull, balancer_ ? static_cast<std::uint32_t>(batch) : 0);
      it = pending_pulls_.erase(it);
    } else {
      ++it;
    }
  }
}

bool DataParallelMode::start(const Message& m, const transport::Push& p, const std::string& key) {
  static constexpr PushRules kRules{.kind = transport::PushKind::kGradient,
                                    .wrong_kind = "this server runs data-parallel; send gradients",
                                    .dense_only = true,
                                    .wrong_length = "wrong gradient length"};
  std::string why = check_push_shape(p, m.envelope.payload_bytes, core_.range(), kRules);
  if (why.empty() && clocks_[m.sender] > 0 && p.clock + 1 == clocks_[m.sender]) {
    // A resend of the gradient this shard took last (its ack was lost, or late past the
    // worker's resend wait): acknowledged again, its bytes ignored, so it counts once. A
    // refusal would stop a worker whose gradient was applied.
    core_.reply_ack(m, true, "");
    if (!m.complete) rejected_transfers_.insert(key);
    COHORT_LOG(Info) << "shard " << core_.index << ": " << m.sender
                     << " resent its gradient for clock " << p.clock
                     << ", already taken: acknowledged again";
    return false;
  }
  if (why.empty() && p.clock != clocks_[m.sender]) {
    why = "gradient for clock " + std::to_string(p.clock) + ", expected " +
          std::to_string(clocks_[m.sender]);
  }
  if (why.empty() && speed_) why = check_samples(m.sender, p);
  if (!why.empty()) {
    core_.reply_ack(m, false, why);
    if (!m.complete) rejected_transfers_.insert(key);
    return false;
  }
  // A sender streams one gradient at a time: what is left of an earlier one was abandoned
  // (the client restarted mid-push), and would otherwise hold its memory for good.
  const std::string prefix = m.sender + "#";
  std::erase_if(streaming_, [&](const std::string& k) { return k.starts_with(prefix); });
  for (auto g = gradients_.begin(); g != gradients_.end();) {
    if (g->first.starts_with(prefix)) {
      spare_.push_back(std::move(g->second));
      g = gradients_.erase(g);
    } else {
      ++g;
    }
  }
  if (piecewise()) {
    streaming_.insert(key);
  } else {
    // Gradient buffers are reused: a fresh 64 MiB buffer per push would page-fault its way in.
    if (spare_.empty()) spare_.emplace_back(core_.size());
    gradients_[key] = std::move(spare_.back());
    spare_.pop_back();
  }
  return true;
}

// Reassembles a pushed gradient (the chunks of one transfer), then applies it.
void DataParallelMode::on_push(Message& m, const transport::Push& p) {
  const std::string key = m.sender + "#" + std::to_string(m.envelope.seq);
  if (m.offset == 0 && !start(m, p, key)) return;
  if (rejected_transfers_.contains(key)) {
    if (m.complete) rejected_transfers_.erase(key);
    return;
  }
  if (piecewise()) {
    on_streamed_gradient_chunk(m, key);
  } else {
    on_whole_gradient_chunk(m, key);
  }
}

void DataParallelMode::on_whole_gradient_chunk(Message& m, const std::string& key) {
  auto it = gradients_.find(key);
  if (it == gradients_.end()) return;
  const auto bytes = m.payload.span();
  if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0 ||
      m.offset + bytes.size() > it->second.bytes()) {
    gradients_.erase(it);
    core_.reply_ack(m, false, "misaligned chunk");
    return;
  }
  // Copied and checked for NaN/Inf in one pass, chunk by chunk, while the data is hot.
  const std::span<const float> values(reinterpret_cast<const float*>(bytes.data()),
                                      bytes.size() / sizeof(float));
  if (!kernels::copy_finite(values,
                            it->second.span().subspan(m.offset / sizeof(float), values.size()))) {
    spare_.push_back(std::move(it->second));
    gradients_.erase(it);
    if (!m.complete) rejected_transfers_.insert(key);  // drop the rest of this transfer
    core_.reply_ack(m, false, "gradient has non-finite values");
    return;
  }
  if (!m.complete) return;
  FloatBuffer g = std::move(it->second);
  gradients_.erase(it);
  apply(m, g);
}

void DataParallelMode::apply(const Message& m, FloatBuffer& g) {
  struct Recycle {  // hands the buffer back to spare_ on every path out
    std::vector<FloatBuffer>& spare;
    FloatBuffer& buf;
    ~Recycle() {
      if (!buf.empty()) spare.push_back(std::move(buf));
    }
  } recycle{spare_, g};
  const std::uint64_t clock = clocks_[m.sender]++;
  if (consistency_ == Consistency::kBsp) {
    if (speed_) note_samples(m, clock);
    step_buffer_[clock][m.sender] = std::move(g);
    auto& step = step_buffer_[clock];
    if (step.size() >= workers_) {
      // The n gradients of this step, summed in worker-id order, applied once.
      if (step_sum_.size() != core_.size()) step_sum_ = FloatBuffer(core_.size());
      step_sum_.fill(0.0f);
      for (auto& [w, grad] : step) {
        for (std::size_t i = 0; i < step_sum_.size(); ++i) step_sum_[i] += grad[i];
        spare_.push_back(std::move(grad));
      }
      if (speed_) scale_step(clock);
      core_.optimizer->apply_gradient(core_.writable_params(), step_sum_.span());
      ++core_.version;
      step_buffer_.erase(clock);
      if (speed_) step_done(clock);
    }
  } else {
    core_.optimizer->apply_gradient(core_.writable_params(), g.span());
    ++core_.version;
  }
  core_.reply_ack(m, true, "");
  serve_pending_pulls();
}

void DataParallelMode::on_streamed_gradient_chunk(Message& m, const std::string& key) {
  auto it = streaming_.find(key);
  if (it == streaming_.end()) return;
  const auto bytes = m.payload.span();
  if (m.offset % sizeof(float) != 0 || bytes.size() % sizeof(float) != 0 ||
      m.offset + bytes.size() > core_.size() * sizeof(float)) {
    streaming_.erase(it);
    if (!m.complete) rejected_transfers_.insert(key);
    core_.reply_ack(m, false, "misaligned chunk");
    return;
  }
  const std::span<const float> values(reinterpret_cast<const float*>(bytes.data()),
                                      bytes.size() / sizeof(float));
  // Checked and applied a block at a time, so the apply reads each block from L1 right after
  // the check brought it there: one pass over the received bytes, not two.
  if (m.offset == 0) core_.optimizer->begin_gradient_step();
  const std::size_t base = m.offset / sizeof(float);
  for (std::size_t at = 0; at < values.size(); at += kApplyBlock) {
    const auto block = values.subspan(at, std::min(kApplyBlock, values.size() - at));
    if (!kernels::all_finite(block)) {
      streaming_.erase(it);
      if (!m.complete) rejected_transfers_.insert(key);  // drop the rest of this transfer
      core_.reply_ack(m, false, "gradient has non-finite values");
      return;
    }
    core_.optimizer->apply_gradient_range(
        base + at, core_.writable_params().subspan(base + at, block.size()), block);
  }
  m.payload = PooledBuffer{};  // the frame goes back now, while it is warm
  if (!m.complete) return;
  streaming_.erase(it);
  ++clocks_[m.sender];
  ++core_.version;
  core_.reply_ack(m, true, "");
  serve_pending_pulls();
}

std::string DataParallelMode::check_samples(const NodeId& w, const transport::Push& p) const {
  if (p.num_samples == 0) {
    return "gradient over 0 samples (server.batch_policy = speed weighs each by its samples)";
  }
  if (balancer_ && p.num_samples != balancer_->batch(w, p.clock)) {
    return "gradient over " + std::to_string(p.num_samples) + " samples, but the batch for clock " +
           std::to_string(p.clock) + " is " + std::to_string(balancer_->batch(w, p.clock));
  }
  return "";
}

void DataParallelMode::note_samples(const Message& m, std::uint64_t clock) {
  if (const auto* p = std::get_if<transport::Push>(&m.envelope.body)) {
    step_samples_[clock] += p->num_samples;
  }
  if (!balancer_ || clock != open_step_) return;
  balancer_->measured(m.sender, clock,
                      std::chrono::duration<double>(clock_.now() - open_since_).count());
}

// (3.4) with Cohort's BSP scale: the equal policy steps with the sum of the n workers' mean
// gradients, n times the mean over the global batch, so the sum of the gradient sums is scaled by
// n / B; with equal batches the two policies take the same step.
void DataParallelMode::scale_step(std::uint64_t clock) {
  const auto it = step_samples_.find(clock);
  const std::uint64_t samples = it == step_samples_.end() ? 0 : it->second;
  if (it != step_samples_.end()) step_samples_.erase(it);
  if (samples == 0) return;  // check_samples() refuses a gradient over no samples
  const float scale = static_cast<float>(static_cast<double>(workers_) / double(samples));
  for (std::size_t i = 0; i < step_sum_.size(); ++i) step_sum_[i] *= scale;
}

void DataParallelMode::step_done(std::uint64_t clock) {
  if (!balancer_) return;
  open_step_ = clock + 1;
  open_since_ = clock_.now();
  if (!balancer_->step_closed(clock)) return;
  if (core_.metrics == nullptr) return;
  for (const auto& [w, b] : balancer_->batches()) {
    const auto s = balancer_->speeds().find(w);
    core_.metrics->write("dp_rebalance",
                         {{"step", clock + 1},
                          {"worker", w},
                          {"batch", b},
                          {"speed", s == balancer_->speeds().end() ? 0.0 : s->second}});
  }
}

}  // namespace

std::unique_ptr<ShardMode> make_dataparallel_mode(ShardCore& core, Consistency consistency,
                                                  const DataParallelOptions& options,
                                                  const Clock& clock) {
  return std::make_unique<DataParallelMode>(core, consistency, options, clock);
}

}  // namespace cohort::server
