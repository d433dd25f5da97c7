// Flat float buffers and a pool of reusable byte buffers.
//
// Every model lives in one contiguous float buffer (FloatBuffer); layers and shards hold spans into
// it. Bulk bytes that cross the network (chunks, reassembly buffers, accumulators) come from a
// BufferPool and go back to it: the first touch of a fresh page is a page fault, so a large message
// allocated per transfer runs far slower than one written into warm memory (figures in
// docs/PERFORMANCE.md 3.1).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace cohort {

// Alignment of every buffer: one cache line, and enough for AVX-512 loads.
inline constexpr std::size_t kBufferAlignment = 64;
// Tracked FloatBuffers from this size on are mapped pages of their own (see FloatBuffer).
inline constexpr std::size_t kMappedBufferBytes = std::size_t{1} << 20;

// Counts the bytes held by the buffers made with it (FloatBuffer's tracked constructor): what is
// held now and the most held at once since construction or the last reset_peak(). Bytes are the
// allocation's, rounded up to kBufferAlignment. Thread-safe: buffers of one tracker may be made
// and freed on several threads. Must outlive every buffer made with it. A tracker made with a
// parent also counts everything into the parent (e.g. one tracker per kind of memory, and one
// for their sum, whose peak is the peak of the sum, not the sum of the peaks).
class MemoryTracker {
 public:
  MemoryTracker() = default;
  explicit MemoryTracker(MemoryTracker* parent) : parent_(parent) {}
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Counts bytes, in this tracker and its parents. Throws std::bad_alloc, counting nothing, when
  // that would take this tracker or a parent past its limit.
  void allocated(std::size_t bytes);
  void released(std::size_t bytes) noexcept;
  // A hard cap on current() (0: none): a buffer that would pass it is not made (std::bad_alloc).
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t current() const noexcept {
    return current_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  // Starts a new high-water mark at what is held now (e.g. at the start of a round).
  void reset_peak() noexcept { peak_.store(current(), std::memory_order_relaxed); }

 private:
  MemoryTracker* parent_ = nullptr;
  std::atomic<std::size_t> limit_{0};
  std::atomic<std::size_t> current_{0};
  std::atomic<std::size_t> peak_{0};
};

// An owning, 64-byte aligned, zero-initialised float array. Move-only; a moved-from buffer is
// empty. Not thread-safe. A buffer made with a MemoryTracker reports its bytes to it while it
// lives (resize() keeps the tracker; clone() makes an untracked copy); a large one (at least
// kMappedBufferBytes) gets pages of its own, which go back to the system when it is freed, so
// that the process's resident memory follows what the tracker counts instead of what the heap
// once held.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(std::size_t size);
  FloatBuffer(std::size_t size, MemoryTracker* tracker);
  FloatBuffer(std::span<const float> values);  // NOLINT: copies
  FloatBuffer(FloatBuffer&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  FloatBuffer& operator=(FloatBuffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;

  [[nodiscard]] FloatBuffer clone() const;
  // Resizes, keeping the common prefix; new elements are zero.
  void resize(std::size_t size);
  void fill(float value);

  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::size_t bytes() const { return size_ * sizeof(float); }
  [[nodiscard]] bool empty() const { return size_ == 0; }
  // The tracker this buffer reports to (nullptr: untracked).
  [[nodiscard]] MemoryTracker* tracker() const { return data_.get_deleter().tracker; }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float& operator[](std::size_t i) { return data_[i]; }
  float operator[](std::size_t i) const { return data_[i]; }
  float* begin() { return data(); }
  float* end() { return data() + size_; }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size_; }
  std::span<float> span() { return {data(), size_}; }
  std::span<const float> span() const { return {data(), size_}; }
  operator std::span<float>() { return span(); }              // NOLINT
  operator std::span<const float>() const { return span(); }  // NOLINT

 private:
  struct Free {
    Free() noexcept : tracker(nullptr), bytes(0), mapped(false) {}
    Free(MemoryTracker* t, std::size_t b, bool m) noexcept : tracker(t), bytes(b), mapped(m) {}
    MemoryTracker* tracker;
    std::size_t bytes;  // the allocation's size (counted in tracker)
    bool mapped;        // its own pages (mmap), returned to the system when freed
    void operator()(float* p) const noexcept;
  };
  std::unique_ptr<float[], Free> data_;
  std::size_t size_ = 0;
};

class BufferPool;

// A byte buffer borrowed from a BufferPool; returns itself on destruction. Move-only.
// Its size is what the user asked for; its capacity is the pool's size class (a power of two).
class PooledBuffer {
 public:
  PooledBuffer();
  PooledBuffer(PooledBuffer&& other) noexcept;
  PooledBuffer& operator=(PooledBuffer&& other) noexcept;
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer();

  [[nodiscard]] std::byte* data();
  [[nodiscard]] const std::byte* data() const;
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::size_t capacity() const;
  [[nodiscard]] bool empty() const { return size_ == 0; }
  // REQUIRES: size <= capacity().
  void resize(std::size_t size);
  std::span<std::byte> span() { return {data(), size_}; }
  std::span<const std::byte> span() const { return {data(), size_}; }

  // Hands the storage to C code (ZeroMQ's zero-copy send). Give the returned handle back to
  // release_detached() exactly once, from any thread; the pool may already be gone by then.
  [[nodiscard]] void* detach();
  static void release_detached(void* handle) noexcept;

  // Lends memory owned by someone else (a received ZeroMQ frame) as a PooledBuffer, so that it
  // can be delivered without a copy: `release(owner)` runs exactly once, from whichever thread
  // drops the buffer, and the memory never enters a pool. capacity() == size.
  using ReleaseFn = void (*)(void* owner) noexcept;
  [[nodiscard]] static PooledBuffer wrap(std::byte* data, std::size_t size, ReleaseFn release,
                                         void* owner);

  struct Block;

 private:
  friend class BufferPool;
  explicit PooledBuffer(std::unique_ptr<Block> block, std::size_t size);
  std::unique_ptr<Block> block_;
  std::size_t size_ = 0;
};

// A thread-safe cache of byte buffers in power-of-two size classes (4 KiB minimum). New blocks
// are touched once when made, so a buffer from the pool never page-faults on first use. At most
// max_cached_bytes stay cached; beyond that, returned blocks are freed.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create(std::size_t max_cached_bytes = std::size_t{2} << 30);
  ~BufferPool();
  PooledBuffer acquire(std::size_t bytes);

  struct Stats {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::size_t cached_bytes = 0;
  };
  [[nodiscard]] Stats stats() const;

  // Frees every cached block.
  void trim();

 private:
  explicit BufferPool(std::size_t max_cached_bytes);
  friend class PooledBuffer;
  void give_back(std::unique_ptr<PooledBuffer::Block> block) noexcept;

  std::size_t max_cached_bytes_;
  mutable std::mutex mu_;                                                // guards free_ and stats_
  std::vector<std::vector<std::unique_ptr<PooledBuffer::Block>>> free_;  // by size class
  Stats stats_;
};

}  // namespace cohort
