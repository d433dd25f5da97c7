#include "crypto_pipeline.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>

namespace cohort::transport::detail {

void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) {
#if defined(__SSE2__)
  const std::size_t head =
      std::min(n, (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & std::size_t{15});
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the stores are weakly ordered: make them visible before the commit
#else
  std::memcpy(dst, src, n);
#endif
}

void CryptoJob::run() noexcept {
  try {
    switch (op) {
      case Op::kSeal:
        cipher->seal(counter, 1, aad, in, out);
        ok = true;
        break;
      case Op::kOpen: ok = cipher->open(counter, 1, aad, in, out); break;
      case Op::kOpenInPlace: ok = cipher->open_in_place(counter, 1, aad, out); break;
      case Op::kCopy:
        if (streaming) {
          copy_streaming(out.data(), in.data(), in.size());
        } else if (!in.empty()) {
          std::memcpy(out.data(), in.data(), in.size());
        }
        ok = true;
        break;
    }
  } catch (...) {
    ok = false;
  }
}

void start_job(const std::shared_ptr<CryptoJob>& job, ThreadPool* pool) {
  if (job->op == CryptoJob::Op::kOpenInPlace) return;  // left for finish_job, see above
  if (pool == nullptr || job->op == CryptoJob::Op::kCopy || job->in.size() < kMinPoolCryptoBytes) {
    job->claimed.store(true, std::memory_order_relaxed);
    job->run();
    return;
  }
  // A weak reference: the job owns the task's future, so a strong one would be a cycle. A job
  // gone before a worker got to it was claimed and run by its owner.
  job->done = pool->submit([weak = std::weak_ptr<CryptoJob>(job)] {
    if (auto j = weak.lock(); j && j->claim()) j->run();
  });
}

// Waits for `job`, running it here if no worker has claimed it yet. Returns its result.
bool finish_job(CryptoJob& job) {
  if (job.claim()) {
    job.run();
  } else if (job.done.valid()) {
    job.done.wait();
  }
  return job.ok;
}

}  // namespace cohort::transport::detail
