// A fixed pool of worker threads for compute: training, sealing, aggregation, compression.
// Thread-safe: submit() and parallel_for() may be called from any thread. The destructor finishes
// queued work and joins. A task's exception reaches the caller through its future.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
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
  // min_grain items; the calling thread takes one piece. Rethrows the first exception.
  void parallel_for(std::size_t count, std::size_t min_grain,
                    const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void enqueue(std::function<void()> job);
  void work(std::stop_token stop);

  std::mutex mu_;  // guards jobs_
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::jthread> workers_;
};

}  // namespace cohort
