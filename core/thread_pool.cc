#include "cohort/core/thread_pool.h"

#include <algorithm>

namespace cohort {

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) {
    workers_.emplace_back([this](std::stop_token stop) { work(stop); });
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
  }
  cv_.notify_one();
}

void ThreadPool::work(std::stop_token stop) {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, stop, [this] { return !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop requested and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();  // packaged_task stores exceptions in its future
  }
}

void ThreadPool::parallel_for(std::size_t count, std::size_t min_grain,
                              const std::function<void(std::size_t, std::size_t)>& fn) {
  if (count == 0) return;
  min_grain = std::max<std::size_t>(min_grain, 1);
  const std::size_t pieces =
      std::clamp<std::size_t>(count / min_grain, 1, std::max<std::size_t>(size(), 1));
  if (pieces == 1) {
    fn(0, count);
    return;
  }
  const std::size_t step = (count + pieces - 1) / pieces;
  std::vector<std::future<void>> futures;
  futures.reserve(pieces - 1);
  for (std::size_t begin = step; begin < count; begin += step) {
    const std::size_t end = std::min(count, begin + step);
    futures.push_back(submit([&fn, begin, end] { fn(begin, end); }));
  }
  std::exception_ptr first;
  try {
    fn(0, std::min(count, step));
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

}  // namespace cohort
