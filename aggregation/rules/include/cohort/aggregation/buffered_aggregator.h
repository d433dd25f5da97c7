// Base class for aggregation rules that need every update of the round at once (median, trimmed
// mean, Krum, Bulyan; docs/ALGORITHMS.md section 2). Also meant for users' own non-streaming rules.
//
// is_streaming() is false, so the shard hands each client's whole update in one accept() call
// with offset 0. The base validates it (whole range, finite values, finite positive weight, first
// update of this client in the round), copies it, and on end_update(client, true) counts it; an
// abandoned update (end_update(client, false)) is dropped. finish_round() hands the complete
// updates to combine(), ordered by client id so that the result does not depend on arrival
// order. Memory: O(clients x range); update buffers are reused from round to round (fresh pages
// cost a page fault each, docs/PERFORMANCE.md 3.1). Not thread-safe.
#pragma once

#include <vector>

#include "cohort/aggregation/aggregator.h"
#include "cohort/core/buffer.h"

namespace cohort::aggregation {

class BufferedAggregator : public Aggregator {
 public:
  [[nodiscard]] bool is_streaming() const final { return false; }
  void begin_round(std::uint64_t round, std::size_t size) override;
  [[nodiscard]] Verdict accept(const UpdateChunk& chunk) final;
  void end_update(ClientId client, bool complete) final;
  [[nodiscard]] std::size_t completed_updates() const final { return completed_; }
  // False (out untouched) with fewer than min_updates() complete updates or when combine() refuses.
  [[nodiscard]] bool finish_round(std::span<float> out) final;

 protected:
  // The rule itself. `updates[i]` (size() floats) came from `clients[i]` with `weights[i]`;
  // clients are in increasing id order and there are at least min_updates() of them. Writes out
  // and returns true, or returns false (out unspecified) to refuse the round.
  [[nodiscard]] virtual bool combine(std::span<const std::span<const float>> updates,
                                     std::span<const ClientId> clients,
                                     std::span<const double> weights, std::span<float> out) = 0;
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::uint64_t round() const { return round_; }

 private:
  struct Slot {
    ClientId client = 0;
    double weight = 0;
    bool ended = false;
    bool complete = false;
    FloatBuffer values;
  };
  void release(Slot& slot);

  std::uint64_t round_ = 0;
  std::size_t size_ = 0;
  std::vector<Slot> slots_;         // this round's clients, in arrival order
  std::vector<FloatBuffer> spare_;  // buffers of earlier rounds, reused
  std::size_t completed_ = 0;
};

}  // namespace cohort::aggregation
