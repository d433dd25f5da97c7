#include "cohort/core/buffer.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>
#include <utility>

#include "cohort/core/error.h"

namespace cohort {
namespace {

std::size_t aligned_size(std::size_t bytes) {
  const std::size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  return std::max<std::size_t>(rounded, kBufferAlignment);
}

void* aligned_bytes(std::size_t bytes) {
  void* p = std::aligned_alloc(kBufferAlignment, aligned_size(bytes));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

constexpr std::size_t kMinClassBytes = 4096;
constexpr std::size_t kPageBytes = 4096;

std::size_t size_class(std::size_t bytes) {
  const std::size_t cap = std::bit_ceil(std::max(bytes, kMinClassBytes));
  return static_cast<std::size_t>(std::countr_zero(cap)) - 12;  // 4 KiB is class 0
}

}  // namespace

void MemoryTracker::allocated(std::size_t bytes) {
  const std::size_t now = current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const std::size_t limit = limit_.load(std::memory_order_relaxed);
  if (limit != 0 && now > limit) {
    current_.fetch_sub(bytes, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  if (parent_ != nullptr) {
    try {
      parent_->allocated(bytes);
    } catch (...) {
      current_.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
  }
  std::size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::released(std::size_t bytes) noexcept {
  current_.fetch_sub(bytes, std::memory_order_relaxed);
  if (parent_ != nullptr) parent_->released(bytes);
}

void FloatBuffer::Free::operator()(float* p) const noexcept {
  if (mapped) {
    ::munmap(p, bytes);
  } else {
    std::free(p);
  }
  if (tracker != nullptr) tracker->released(bytes);
}

FloatBuffer::FloatBuffer(std::size_t size) : FloatBuffer(size, nullptr) {}

FloatBuffer::FloatBuffer(std::size_t size, MemoryTracker* tracker)
    : data_(nullptr, Free(tracker, 0, false)), size_(size) {
  if (size == 0) return;
  std::size_t bytes = aligned_size(size * sizeof(float));
  const bool mapped = tracker != nullptr && bytes >= kMappedBufferBytes;
  if (mapped) bytes = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  if (tracker != nullptr) tracker->allocated(bytes);  // first: it may refuse (its limit)
  void* p = nullptr;
  if (mapped) {
    // Fresh anonymous pages are zero: nothing to clear, and none resident until written.
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(kBufferAlignment, bytes);
  }
  if (p == nullptr) {
    if (tracker != nullptr) tracker->released(bytes);
    throw std::bad_alloc();
  }
  data_ = std::unique_ptr<float[], Free>(static_cast<float*>(p), Free(tracker, bytes, mapped));
  if (!mapped) std::memset(data_.get(), 0, size * sizeof(float));
}

FloatBuffer::FloatBuffer(std::span<const float> values) : FloatBuffer(values.size()) {
  if (!values.empty()) std::memcpy(data(), values.data(), values.size_bytes());
}

FloatBuffer FloatBuffer::clone() const { return FloatBuffer(span()); }

void FloatBuffer::resize(std::size_t size) {
  if (size == size_) return;
  FloatBuffer next(size, tracker());
  const std::size_t keep = std::min(size, size_);
  if (keep > 0) std::memcpy(next.data(), data(), keep * sizeof(float));
  *this = std::move(next);
}

void FloatBuffer::fill(float value) { std::fill(begin(), end(), value); }

struct PooledBuffer::Block {
  std::byte* memory = nullptr;
  std::size_t capacity = 0;
  std::weak_ptr<BufferPool> pool;
  ReleaseFn release = nullptr;  // wrapped memory: hands it back to its owner
  void* owner = nullptr;

  Block(std::size_t cap, std::weak_ptr<BufferPool> owner_pool)
      : memory(static_cast<std::byte*>(aligned_bytes(cap))),
        capacity(cap),
        pool(std::move(owner_pool)) {
    std::memset(memory, 0, cap);  // first touch now, not on the hot path
  }
  Block(std::byte* data, std::size_t size, ReleaseFn fn, void* who)
      : memory(data), capacity(size), release(fn), owner(who) {}
  ~Block() {
    if (release != nullptr) {
      release(owner);
    } else {
      std::free(memory);
    }
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

PooledBuffer::PooledBuffer() = default;

PooledBuffer::PooledBuffer(std::unique_ptr<Block> block, std::size_t size)
    : block_(std::move(block)), size_(size) {}

PooledBuffer::PooledBuffer(PooledBuffer&& other) noexcept
    : block_(std::move(other.block_)), size_(std::exchange(other.size_, 0)) {}

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& other) noexcept {
  if (this != &other) {
    if (block_) release_detached(block_.release());
    block_ = std::move(other.block_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PooledBuffer::~PooledBuffer() {
  if (block_) release_detached(block_.release());
}

std::byte* PooledBuffer::data() { return block_ ? block_->memory : nullptr; }
const std::byte* PooledBuffer::data() const { return block_ ? block_->memory : nullptr; }
std::size_t PooledBuffer::capacity() const { return block_ ? block_->capacity : 0; }

void PooledBuffer::resize(std::size_t size) {
  COHORT_CHECK(size <= capacity()) << "resize to " << size << " beyond capacity " << capacity();
  size_ = size;
}

PooledBuffer PooledBuffer::wrap(std::byte* data, std::size_t size, ReleaseFn release, void* owner) {
  COHORT_CHECK(release != nullptr) << "PooledBuffer::wrap needs a release function";
  return PooledBuffer(std::make_unique<Block>(data, size, release, owner), size);
}

void* PooledBuffer::detach() {
  size_ = 0;
  return block_.release();
}

void PooledBuffer::release_detached(void* handle) noexcept {
  std::unique_ptr<Block> block(static_cast<Block*>(handle));
  if (!block || block->release != nullptr) return;  // wrapped memory goes back to its owner
  if (auto pool = block->pool.lock()) pool->give_back(std::move(block));
}

std::shared_ptr<BufferPool> BufferPool::create(std::size_t max_cached_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_cached_bytes));
}

BufferPool::BufferPool(std::size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
BufferPool::~BufferPool() = default;

PooledBuffer BufferPool::acquire(std::size_t bytes) {
  const std::size_t cls = size_class(bytes);
  {
    std::lock_guard lock(mu_);
    if (cls < free_.size() && !free_[cls].empty()) {
      auto block = std::move(free_[cls].back());
      free_[cls].pop_back();
      stats_.cached_bytes -= block->capacity;
      ++stats_.hits;
      return PooledBuffer(std::move(block), bytes);
    }
    ++stats_.misses;
  }
  auto block = std::make_unique<PooledBuffer::Block>(kMinClassBytes << cls, weak_from_this());
  return PooledBuffer(std::move(block), bytes);
}

void BufferPool::give_back(std::unique_ptr<PooledBuffer::Block> block) noexcept {
  const std::size_t cls = size_class(block->capacity);
  std::lock_guard lock(mu_);
  if (stats_.cached_bytes + block->capacity > max_cached_bytes_) return;  // freed here
  try {
    if (free_.size() <= cls) free_.resize(cls + 1);
    stats_.cached_bytes += block->capacity;
    free_[cls].push_back(std::move(block));
  } catch (...) {
    // Out of memory while caching: the block is simply freed.
  }
}

BufferPool::Stats BufferPool::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void BufferPool::trim() {
  std::lock_guard lock(mu_);
  free_.clear();
  stats_.cached_bytes = 0;
}

}  // namespace cohort
