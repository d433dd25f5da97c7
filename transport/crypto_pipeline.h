// The crypto pipeline (private to transport/): one seal, open or plaintext copy of a bulk frame as
// a job that a pool worker or the socket thread runs, whichever claims it first. The endpoint keeps
// up to kSealWindow such jobs ahead of the socket when sending and kOpenWindow when receiving.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <span>

#include "cohort/core/thread_pool.h"
#include "cohort/transport/security/frame_cipher.h"

namespace cohort::transport::detail {

// Chunks sealed ahead of the socket: enough to keep both cores busy, small enough to bound memory.
constexpr std::size_t kSealWindow = 8;
// Received bulk frames being opened at once (on the pool) before the oldest must be committed:
// at most one per worker plus one for the socket thread, and never more than this. Each holds its
// frame and, streaming, its chunk (2 MiB at 1 MiB chunks): a shard's peak RSS counts them.
constexpr std::size_t kOpenWindow = 8;
// Smaller bulk frames are opened on the socket thread: below this size a pool round trip costs
// about as much as the open itself (docs/PERFORMANCE.md 3.2).
constexpr std::size_t kMinPoolCryptoBytes = 64 << 10;

// Copies into memory that will not be read again soon (a reassembly buffer far larger than the
// caches) with non-temporal stores, which skip reading each destination line first: about twice
// memcpy's speed into a cold buffer, where memcpy was a large share of a plaintext transfer's CPU
// time (docs/PERFORMANCE.md 3.1).
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n);

// One seal, open or plaintext copy of a bulk frame, run by a pool worker or, if none has started
// it by the time its result is needed, by the socket thread: whoever claims it first runs it. So
// the socket thread never waits behind other work queued on a busy pool (training, aggregation),
// and cannot deadlock when it is itself a pool worker. The pool task may run (and find it claimed,
// or gone) after the record is done with; the spans are only touched by the claimant.
struct CryptoJob {
  // kOpenInPlace opens `out` (the whole sealed frame) where it lies; it runs only when its record
  // is the oldest pending one (finish_job), so a failed record before it can still send it down
  // the serial path with its ciphertext intact.
  enum class Op { kSeal, kOpen, kOpenInPlace, kCopy };
  Op op = Op::kCopy;
  const security::FrameCipher* cipher = nullptr;
  std::uint64_t counter = 0;
  std::span<const std::byte> aad;
  std::span<const std::byte> in;
  std::span<std::byte> out;
  bool streaming = false;  // kCopy into a reassembly buffer: see copy_streaming()
  std::atomic<bool> claimed{false};
  bool ok = false;         // written by the claimant; read after finish()
  std::future<void> done;  // valid when submitted to the pool

  // Runs the job; called by its claimant only. A failure (or an exception) leaves ok false.
  void run() noexcept;
  bool claim() { return !claimed.exchange(true, std::memory_order_acq_rel); }
};

// Runs `job` now, or hands it to the pool if there is one and it is worth it. Plaintext copies
// run here: at memcpy speed, a hand-off costs more than it saves (measured).
void start_job(const std::shared_ptr<CryptoJob>& job, ThreadPool* pool);

// Waits for `job`, running it here if no worker has claimed it yet. Returns its result.
bool finish_job(CryptoJob& job);

}  // namespace cohort::transport::detail
