#include "cohort/core/thread_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>

TEST_CASE("submit returns results and exceptions through futures") {
  cohort::ThreadPool pool(2);
  auto f = pool.submit([] { return 41 + 1; });
  CHECK(f.get() == 42);
  auto g = pool.submit([]() -> int { throw std::runtime_error("boom"); });
  CHECK_THROWS_AS(g.get(), std::runtime_error);
}

TEST_CASE("parallel_for covers every index exactly once") {
  cohort::ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(10007);
  pool.parallel_for(hits.size(), 10, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) CHECK(h.load() == 1);
  CHECK_THROWS_AS(pool.parallel_for(100, 1,
                                    [](std::size_t b, std::size_t) {
                                      if (b == 0) throw std::runtime_error("x");
                                    }),
                  std::runtime_error);
}
