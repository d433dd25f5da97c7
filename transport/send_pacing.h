// Send pacing (private to transport/): keeps a DEALER's sender a few bulk frames ahead of its
// socket, counting the frames ZeroMQ lets go of through their free callbacks, so that a large
// message is sealed into a few buffers that recycle warm in cache instead of queuing in ZeroMQ.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace cohort::transport::detail {

// Bulk frames of one message allowed inside ZeroMQ (queued, not yet written to the socket) before
// the sender waits: pacing keeps the buffers recycling while warm in cache, faster and steadier
// than unpaced sends in plaintext and under TLS (docs/PERFORMANCE.md 3.3).
constexpr std::uint32_t kSendAhead = 4;
// A sender that saw no frame leave for this long stops pacing that message (a stalled peer must
// not stall it; its frames queue in ZeroMQ as before).
constexpr auto kSendPatience = std::chrono::milliseconds(50);

// How many bulk frames of one message ZeroMQ has let go of (written to the socket, or dropped):
// counted by the frames' free callbacks, on ZeroMQ's I/O thread.
class SendProgress {
 public:
  void release() noexcept {
    {
      std::lock_guard lock(mu_);
      ++released_;
    }
    cv_.notify_one();
  }
  // Waits until at least `n` frames were let go of; false after `patience` without that.
  bool wait_released(std::uint32_t n, std::chrono::milliseconds patience) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, patience, [&] { return released_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint32_t released_ = 0;
};

// What a bulk frame's free callback releases: a pooled buffer or the caller's memory, then counts.
struct BulkHint {
  void* pooled = nullptr;                  // a detached PooledBuffer
  std::shared_ptr<const void> owner;       // or the caller's payload
  std::shared_ptr<SendProgress> progress;  // may be null
  // The endpoint's count of bulk bytes inside ZeroMQ, which this frame's `bytes` leave.
  std::shared_ptr<std::atomic<std::uint64_t>> unsent;
  std::uint64_t bytes = 0;
};

// ZeroMQ's free callback of a bulk frame; `hint` is a BulkHint it deletes.
void free_bulk(void* data, void* hint) noexcept;

// Keeps a message's sender at most kSendAhead bulk frames ahead of the socket.
class SendPacer {
 public:
  explicit SendPacer(bool on) : progress_(on ? std::make_shared<SendProgress>() : nullptr) {}
  const std::shared_ptr<SendProgress>& progress() const { return progress_; }
  // Before handing bulk frame `i` (0-based) to ZeroMQ.
  void before(std::uint32_t i);

 private:
  std::shared_ptr<SendProgress> progress_;
};

}  // namespace cohort::transport::detail
