#include "send_pacing.h"

#include "cohort/core/buffer.h"

namespace cohort::transport::detail {

void free_bulk(void* /*data*/, void* hint) noexcept {
  auto* h = static_cast<BulkHint*>(hint);
  if (h->pooled != nullptr) PooledBuffer::release_detached(h->pooled);
  if (h->unsent) h->unsent->fetch_sub(h->bytes, std::memory_order_relaxed);
  auto progress = std::move(h->progress);
  delete h;
  if (progress) progress->release();
}

void SendPacer::before(std::uint32_t i) {
  if (!progress_ || i < kSendAhead) return;
  if (!progress_->wait_released(i - kSendAhead + 1, kSendPatience)) progress_.reset();
}

}  // namespace cohort::transport::detail
