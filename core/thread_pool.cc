#include "cohort/core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cohort {
namespace {

constexpr std::uint64_t kPieceMask = 0xffffffffu;
// A spin that lost the core for this long was preempted: the machine is oversubscribed.
constexpr std::int64_t kPreemptedMicros = 50;
// How long workers sleep between regions instead of spinning after a sign of an oversubscribed
// machine: a spin preempted, or a piece kSpinMicros later than the caller's.
constexpr std::int64_t kBackoffMicros = 5000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

std::int64_t now_micros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) {
    // The caller runs one piece of every region, so at most threads - 1 workers take part.
    const bool joins_regions = i + 1 < threads;
    workers_.emplace_back(
        [this, joins_regions](std::stop_token stop) { work(stop, joins_regions); });
  }
}

ThreadPool::~ThreadPool() {
  for (auto& w : workers_) w.request_stop();
  cv_.notify_all();
  workers_.clear();  // joins; workers drain the queue first
}

void ThreadPool::enqueue(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    queued_.fetch_add(1);
  }
  cv_.notify_one();
}

ThreadPool::Spin ThreadPool::spin_for_region(std::uint64_t seen, std::stop_token stop) const {
  std::int64_t last = now_micros();
  const std::int64_t deadline = last + kSpinMicros;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (region_news(seen)) return Spin::kRegion;
      if (queued_.load(std::memory_order_relaxed) > 0) return Spin::kTimeout;
      cpu_relax();
    }
    const std::int64_t now = now_micros();
    if (now - last > kPreemptedMicros) return Spin::kPreempted;
    if (stop.stop_requested() || now > deadline) return Spin::kTimeout;
    last = now;
  }
}

void ThreadPool::work(std::stop_token stop, bool joins_regions) {
  std::uint64_t seen = claim_.load() >> 32;
  bool spin = false;  // a region ran recently: the next one is likely close
  for (;;) {
    if (spin && now_micros() >= contended_until_.load(std::memory_order_relaxed)) {
      const Spin result = spin_for_region(seen, stop);
      if (result == Spin::kRegion) {
        join_region(seen);
        continue;
      }
      // Other threads want this core: a sleeping worker, woken by the region, preempts them;
      // a spinning one waits for its time slice while the region waits for it.
      if (result == Spin::kPreempted) contended_until_.store(now_micros() + kBackoffMicros);
    }
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      // Counted before the predicate reads claim_; run_region publishes claim_ before it reads
      // the count, so either this sees the region or the region notifies (under mu_).
      if (joins_regions) region_sleepers_.fetch_add(1);
      cv_.wait(lock, stop, [&] { return !jobs_.empty() || (joins_regions && region_news(seen)); });
      if (joins_regions) region_sleepers_.fetch_sub(1);
      if (jobs_.empty()) {
        if (!joins_regions || !region_news(seen)) return;  // stop requested and nothing left
        lock.unlock();
        join_region(seen);
        spin = true;
        continue;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_.fetch_sub(1);
    }
    job();  // packaged_task stores exceptions in its future
    spin = false;
  }
}

void ThreadPool::join_region(std::uint64_t& seen) {
  for (;;) {
    std::uint64_t claim = claim_.load(std::memory_order_acquire);
    seen = claim >> 32;
    const std::size_t piece = claim & kPieceMask;
    const std::size_t pieces = region_pieces_.load(std::memory_order_relaxed);
    const std::size_t count = region_count_.load(std::memory_order_relaxed);
    const RangeFn* fn = region_fn_.load(std::memory_order_relaxed);
    if (piece >= pieces) return;
    // Succeeds only while the region read above is open and this piece unclaimed.
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    try {
      (*fn)(count * piece / pieces, count * (piece + 1) / pieces);
    } catch (...) {
      std::lock_guard lock(error_mu_);
      if (!region_error_) region_error_ = std::current_exception();
    }
    region_done_.fetch_add(1, std::memory_order_release);
    region_done_.notify_one();  // no system call unless the caller sleeps
  }
}

bool ThreadPool::run_region(std::size_t count, std::size_t pieces, const RangeFn& fn) {
  if (region_busy_.exchange(true, std::memory_order_acquire)) return false;
  region_fn_.store(&fn, std::memory_order_relaxed);
  region_count_.store(count, std::memory_order_relaxed);
  region_pieces_.store(pieces, std::memory_order_relaxed);
  region_done_.store(0, std::memory_order_relaxed);
  const std::uint64_t epoch = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
  claim_.store(epoch << 32);  // publishes the fields above
  if (region_sleepers_.load() > 0) {
    { std::lock_guard lock(mu_); }
    cv_.notify_all();
  }
  std::uint64_t seen = epoch;
  const std::int64_t start = now_micros();
  join_region(seen);  // the caller's share: every piece no worker has claimed yet
  // The pieces still running are on workers that are awake: spin for them (waking from a futex
  // costs tens of microseconds on a VM, as much as the usual imbalance of short pieces; long
  // pieces are allowed half their time), then sleep (a worker preempted by another process
  // needs this core more than the spin does).
  const std::int64_t done_own = now_micros();
  const std::int64_t deadline = done_own + std::max(kSpinMicros, (done_own - start) / 2);
  while (region_done_.load(std::memory_order_acquire) < pieces && now_micros() < deadline) {
    for (int i = 0; i < 16; ++i) cpu_relax();
  }
  if (region_done_.load(std::memory_order_acquire) < pieces) {
    // A piece this late means a worker lost its core: let the workers sleep for a while, so
    // that a region's wake-up preempts whatever took it.
    contended_until_.store(now_micros() + kBackoffMicros, std::memory_order_relaxed);
    for (std::uint32_t done; (done = region_done_.load(std::memory_order_acquire)) < pieces;) {
      region_done_.wait(done, std::memory_order_acquire);
    }
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mu_);
    std::swap(error, region_error_);
  }
  region_busy_.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
  return true;
}

void ThreadPool::queue_pieces(std::size_t count, std::size_t pieces, const RangeFn& fn) {
  std::vector<std::future<void>> futures;
  futures.reserve(pieces - 1);
  for (std::size_t p = 1; p < pieces; ++p) {
    const std::size_t begin = count * p / pieces, end = count * (p + 1) / pieces;
    futures.push_back(submit([&fn, begin, end] { fn(begin, end); }));
  }
  std::exception_ptr first;
  try {
    fn(0, count / pieces);
  } catch (...) {
    first = std::current_exception();
  }
  for (auto& f : futures) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void ThreadPool::parallel_for(std::size_t count, std::size_t min_grain, const RangeFn& fn) {
  if (count == 0) return;
  min_grain = std::max<std::size_t>(min_grain, 1);
  const std::size_t pieces =
      std::clamp<std::size_t>(count / min_grain, 1, std::max<std::size_t>(size(), 1));
  if (pieces == 1) {
    fn(0, count);
    return;
  }
  // Another region is running (a concurrent caller, or a nested parallel_for): queue the pieces.
  if (!run_region(count, pieces, fn)) queue_pieces(count, pieces, fn);
}

}  // namespace cohort
