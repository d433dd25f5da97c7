#include "cohort/aggregation/buffered_aggregator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cohort/core/error.h"

namespace cohort::aggregation {

void BufferedAggregator::begin_round(std::uint64_t round, std::size_t size) {
  for (auto& slot : slots_) release(slot);
  slots_.clear();
  if (size != size_) spare_.clear();  // a new range: old buffers have the wrong size
  round_ = round;
  size_ = size;
  completed_ = 0;
}

void BufferedAggregator::release(Slot& slot) {
  if (!slot.values.empty()) spare_.push_back(std::move(slot.values));
  slot.values = FloatBuffer();
}

Verdict BufferedAggregator::accept(const UpdateChunk& chunk) {
  // Non-streaming contract: one call per client, the whole range at offset 0.
  if (chunk.offset != 0 || chunk.values.size() != size_) return Verdict::kRejected;
  if (!(chunk.weight > 0) || !std::isfinite(chunk.weight)) return Verdict::kRejected;
  for (const auto& slot : slots_) {
    if (slot.client == chunk.client) return Verdict::kRejected;  // second update, or after end
  }
  for (float v : chunk.values) {
    if (!std::isfinite(v)) return Verdict::kRejected;
  }
  Slot slot;
  slot.client = chunk.client;
  slot.weight = chunk.weight;
  if (!spare_.empty()) {
    slot.values = std::move(spare_.back());
    spare_.pop_back();
  } else {
    slot.values = FloatBuffer(size_);
  }
  std::copy(chunk.values.begin(), chunk.values.end(), slot.values.begin());
  slots_.push_back(std::move(slot));
  return Verdict::kAccepted;
}

void BufferedAggregator::end_update(ClientId client, bool complete) {
  for (auto& slot : slots_) {
    if (slot.client != client || slot.ended) continue;
    slot.ended = true;
    slot.complete = complete;
    if (complete) {
      ++completed_;
    } else {
      release(slot);
    }
    return;
  }
}

bool BufferedAggregator::finish_round(std::span<float> out) {
  COHORT_CHECK(out.size() == size_) << "out has " << out.size() << " elements, range " << size_;
  if (completed_ == 0 || completed_ < min_updates()) return false;
  std::vector<const Slot*> done;
  for (const auto& slot : slots_) {
    if (slot.complete) done.push_back(&slot);
  }
  std::sort(done.begin(), done.end(),
            [](const Slot* a, const Slot* b) { return a->client < b->client; });
  std::vector<std::span<const float>> updates;
  std::vector<ClientId> clients;
  std::vector<double> weights;
  for (const Slot* s : done) {
    updates.push_back(s->values.span());
    clients.push_back(s->client);
    weights.push_back(s->weight);
  }
  // combine() may refuse after writing: compute into scratch, copy on success only.
  std::vector<float> scratch(size_);
  if (!combine(updates, clients, weights, scratch)) return false;
  std::copy(scratch.begin(), scratch.end(), out.begin());
  return true;
}

}  // namespace cohort::aggregation
