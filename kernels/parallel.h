// Splitting loops over an optional ThreadPool (nullptr: run on the calling thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>

#include "cohort/core/thread_pool.h"

namespace cohort::kernels::detail {

// Number of parts parallel_parts() uses for count items of at least grain each.
inline std::size_t part_count(const ThreadPool* pool, std::size_t count, std::size_t grain) {
  if (pool == nullptr || count == 0) return 1;
  grain = std::max<std::size_t>(grain, 1);
  return std::clamp<std::size_t>(count / grain, 1, std::max<std::size_t>(pool->size(), 1));
}

// Runs fn(part, begin, end) for parts = part_count(...) contiguous, near-equal ranges of
// [0, count); part 0 runs on the calling thread. fn must not throw for a well-formed call (a
// throw still reaches the caller, after all parts finish).
inline void parallel_parts(ThreadPool* pool, std::size_t count, std::size_t grain,
                           const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) {
  const std::size_t parts = part_count(pool, count, grain);
  if (parts <= 1) {
    fn(0, 0, count);
    return;
  }
  pool->parallel_for(parts, 1, [&](std::size_t first, std::size_t last) {
    for (std::size_t p = first; p < last; ++p) {
      fn(p, count * p / parts, count * (p + 1) / parts);
    }
  });
}

// fn(begin, end) over [0, count) in parts of at least grain items.
inline void parallel_ranges(ThreadPool* pool, std::size_t count, std::size_t grain,
                            const std::function<void(std::size_t, std::size_t)>& fn) {
  parallel_parts(pool, count, grain,
                 [&](std::size_t, std::size_t begin, std::size_t end) { fn(begin, end); });
}

}  // namespace cohort::kernels::detail
