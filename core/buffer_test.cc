#include "cohort/core/buffer.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <new>
#include <thread>
#include <vector>

TEST_CASE("FloatBuffer is aligned, zeroed and resizes keeping its prefix") {
  cohort::FloatBuffer b(1000);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % cohort::kBufferAlignment == 0);
  for (float v : b) CHECK(v == 0.0f);
  b[3] = 7.0f;
  b.resize(2000);
  CHECK(b.size() == 2000);
  CHECK(b[3] == 7.0f);
  CHECK(b[1999] == 0.0f);
  auto c = b.clone();
  c[3] = 1.0f;
  CHECK(b[3] == 7.0f);
}

TEST_CASE("a moved-from FloatBuffer is empty, so code that recycles it never sees a dead buffer") {
  cohort::FloatBuffer a(64);
  a[5] = 2.0f;
  cohort::FloatBuffer b(std::move(a));
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the state after a move is the contract
  CHECK(a.data() == nullptr);
  CHECK(b.size() == 64);
  CHECK(b[5] == 2.0f);
  cohort::FloatBuffer c(8);
  c = std::move(b);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  CHECK(c.size() == 64);
  CHECK(c[5] == 2.0f);
}

TEST_CASE("a MemoryTracker counts what its buffers hold and the most they held at once") {
  cohort::MemoryTracker tracker;
  {
    cohort::FloatBuffer a(100, &tracker);  // 400 bytes, rounded up to 448
    CHECK(tracker.current() == 448);
    cohort::FloatBuffer b(16, &tracker);
    CHECK(tracker.current() == 448 + 64);
    a.resize(1000);  // the new block is counted before the old one goes
    CHECK(tracker.current() == 4032 + 64);
    CHECK(tracker.peak() == 4032 + 448 + 64);
    cohort::FloatBuffer moved = std::move(a);
    CHECK(tracker.current() == 4032 + 64);
    cohort::FloatBuffer untracked = moved.clone();
    CHECK(tracker.current() == 4032 + 64);
    tracker.reset_peak();
    CHECK(tracker.peak() == 4032 + 64);
  }
  CHECK(tracker.current() == 0);
  CHECK(tracker.peak() == 4032 + 64);
  cohort::FloatBuffer empty(0, &tracker);
  empty.resize(16);  // an empty tracked buffer stays tracked
  CHECK(tracker.current() == 64);
}

TEST_CASE("a MemoryTracker's limit refuses the buffer that would pass it, counting nothing") {
  cohort::MemoryTracker total;
  cohort::MemoryTracker part(&total);
  total.set_limit(1024);
  cohort::FloatBuffer a(128, &part);                                 // 512 bytes
  CHECK_THROWS_AS(cohort::FloatBuffer(200, &part), std::bad_alloc);  // 800 more: past 1024
  CHECK(part.current() == 512);
  CHECK(total.current() == 512);
  CHECK(total.peak() == 512);
  cohort::FloatBuffer b(128, &part);  // exactly the limit
  CHECK(total.current() == 1024);
  total.set_limit(0);
  cohort::FloatBuffer c(1 << 20, &part);  // no limit; 4 MiB: mapped pages, zeroed
  CHECK(c[0] == 0.0f);
  CHECK(c[(1 << 20) - 1] == 0.0f);
  CHECK(total.current() == 1024 + (4 << 20));
}

TEST_CASE("BufferPool reuses blocks instead of allocating per request") {
  auto pool = cohort::BufferPool::create();
  const std::byte* first = nullptr;
  {
    auto a = pool->acquire(1 << 20);
    CHECK(a.size() == (1u << 20));
    CHECK(a.capacity() >= (1u << 20));
    first = a.data();
  }
  auto b = pool->acquire((1 << 20) - 100);  // same size class
  CHECK(b.data() == first);
  CHECK(pool->stats().hits == 1);
  CHECK(pool->stats().misses == 1);
}

TEST_CASE("a detached buffer returns to its pool from another thread, or frees without it") {
  auto pool = cohort::BufferPool::create();
  auto a = pool->acquire(5000);
  void* handle = a.detach();
  std::thread([handle] { cohort::PooledBuffer::release_detached(handle); }).join();
  CHECK(pool->stats().cached_bytes == 8192);

  auto b = pool->acquire(100);
  void* orphan = b.detach();
  pool.reset();  // the pool is gone before the buffer comes back
  cohort::PooledBuffer::release_detached(orphan);
}

TEST_CASE("BufferPool caches at most its limit") {
  auto pool = cohort::BufferPool::create(8192);
  {
    auto a = pool->acquire(8192);
    auto b = pool->acquire(8192);
  }
  CHECK(pool->stats().cached_bytes == 8192);
}

TEST_CASE("a wrapped buffer lends foreign memory and releases it exactly once, on any path") {
  static int released = 0;
  released = 0;
  std::vector<std::byte> memory(100, std::byte{7});
  auto release = [](void* owner) noexcept {
    ++released;
    static_cast<std::vector<std::byte>*>(owner)->clear();
  };
  {
    auto w = cohort::PooledBuffer::wrap(memory.data(), memory.size(), release, &memory);
    CHECK(w.size() == 100);
    CHECK(w.capacity() == 100);
    CHECK(w.data() == memory.data());
    cohort::PooledBuffer moved = std::move(w);
    CHECK(w.empty());
    CHECK(released == 0);
  }
  CHECK(released == 1);
  CHECK(memory.empty());

  // Detached (a zero-copy send) and released from another thread: back to its owner, not a pool.
  memory.assign(64, std::byte{1});
  auto pool = cohort::BufferPool::create();
  auto d = cohort::PooledBuffer::wrap(memory.data(), memory.size(), release, &memory);
  void* handle = d.detach();
  std::thread([handle] { cohort::PooledBuffer::release_detached(handle); }).join();
  CHECK(released == 2);
  CHECK(pool->stats().cached_bytes == 0);
}
