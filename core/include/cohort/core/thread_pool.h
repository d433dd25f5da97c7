// A fixed pool of worker threads for compute: training, sealing, aggregation, compression.
// Thread-safe: submit() and parallel_for() may be called from any thread. The destructor finishes
// queued work and joins. A task's exception reaches the caller through its future.
//
// parallel_for() is a fork-join on the hot path of CPU training (a few dozen per step, each tens
// of microseconds), so it does not go through the job queue: the caller publishes the region,
// claims pieces itself, and workers that are awake claim the rest. Worker wake-up through a
// futex costs tens of microseconds on a VM, so after a region the workers that take part in
// regions spin for a short while (kSpinMicros) before they sleep; a pool that never runs
// parallel_for never spins. When the machine looks oversubscribed (a spin preempted, or a piece
// keeping the caller waiting past its spin) workers sleep between regions for a few
// milliseconds: woken by a region, a sleeper preempts the other load, a spinner waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace cohort {

class ThreadPool {
 public:
  // threads == 0 means one per hardware thread.
  explicit ThreadPool(std::size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] std::size_t size() const { return workers_.size(); }

  template <typename F>
  auto submit(F&& fn) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(fn));
    auto future = task->get_future();
    enqueue([task] { (*task)(); });
    return future;
  }

  // Runs fn(begin, end) over [0, count) split into at most size() contiguous pieces of at least
  // min_grain items; the calling thread takes one piece (or more, when no worker is free yet).
  // Rethrows the first exception, after every piece has finished.
  void parallel_for(std::size_t count, std::size_t min_grain,
                    const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  // How long a region worker spins for the next region before it sleeps.
  static constexpr std::int64_t kSpinMicros = 200;

  using RangeFn = std::function<void(std::size_t, std::size_t)>;

  void enqueue(std::function<void()> job);
  void work(std::stop_token stop, bool joins_regions);
  // Fork-join fast path; false when another region is running (the caller then queues pieces).
  bool run_region(std::size_t count, std::size_t pieces, const RangeFn& fn);
  void queue_pieces(std::size_t count, std::size_t pieces, const RangeFn& fn);
  // Claims and runs pieces of the open region until none is left; seen: its epoch.
  void join_region(std::uint64_t& seen);
  enum class Spin { kRegion, kTimeout, kPreempted };
  // Spins until a region other than `seen` opens (kRegion), a job is queued or kSpinMicros pass
  // (kTimeout), or the thread loses its core for a while (kPreempted).
  Spin spin_for_region(std::uint64_t seen, std::stop_token stop) const;
  [[nodiscard]] bool region_news(std::uint64_t seen) const { return claim_.load() >> 32 != seen; }

  std::mutex mu_;  // guards jobs_
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> jobs_;
  std::atomic<std::size_t> queued_{0};  // jobs_.size(), read without the lock

  // The open region. claim_ = epoch << 32 | next unclaimed piece; the fields below are written
  // by the region's caller before it publishes a new epoch and read by workers between loading
  // claim_ and claiming a piece with a compare-exchange on it (which fails if they changed).
  std::atomic<bool> region_busy_{false};
  std::atomic<std::uint64_t> claim_{0};
  std::atomic<const RangeFn*> region_fn_{nullptr};
  std::atomic<std::size_t> region_count_{0};
  std::atomic<std::size_t> region_pieces_{0};
  std::atomic<std::uint32_t> region_done_{0};
  std::atomic<int> region_sleepers_{0};  // region workers waiting on cv_
  // Steady-clock microseconds until which region workers sleep instead of spinning.
  std::atomic<std::int64_t> contended_until_{0};
  std::mutex error_mu_;  // guards region_error_
  std::exception_ptr region_error_;

  std::vector<std::jthread> workers_;
};

}  // namespace cohort
