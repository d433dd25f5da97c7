// Norm clipping / norm bounding (docs/ALGORITHMS.md section 2, Sun et al. 2019): every update is
// scaled to L2 norm at most `bound`, u <- u min(1, bound/||u||), then the sample-weighted mean is
// taken, optionally plus N(0, noise_stddev^2 I). Registry name norm_clip; options bound (required,
// > 0), noise_stddev = 0, seed = 0.
//
// Chunks: the clipping factor of an update is known only once its last chunk is in, so each
// update in flight is staged in a buffer of its own and folded into the fp64 weighted sum at
// end_update(client, true), then its buffer goes back to a free list. is_streaming() is true (the
// shard need not reassemble): memory is O(range) plus one range per client *in flight*, not per
// client of the round. The result is exactly the clipped mean whatever the chunking or the
// interleaving. An abandoned update (end_update(client, false)) contributes nothing, unlike
// FedAvg's kept prefix: without its last chunk its norm is unknown.
//
// Sharding: a shard clips the norm of its own slice. With bound M_s on each of S shards the whole
// update's norm is at most sqrt(sum_s M_s^2) (the per-layer rule of docs/ALGORITHMS.md 8.3): use
// M_s = M / sqrt(S) for a global bound M. Noise: each round draws from seed and the round number;
// give every shard a different seed, or their noise repeats. Not thread-safe.
#pragma once

#include <unordered_map>
#include <vector>

#include "cohort/aggregation/aggregator.h"
#include "cohort/core/buffer.h"

namespace cohort::aggregation {

class NormClip final : public Aggregator {
 public:
  // Throws ConfigError unless bound > 0 and noise_stddev >= 0 (both finite).
  NormClip(double bound, double noise_stddev = 0.0, std::uint64_t seed = 0);
  [[nodiscard]] bool is_streaming() const override { return true; }
  void begin_round(std::uint64_t round, std::size_t size) override;
  [[nodiscard]] Verdict accept(const UpdateChunk& chunk) override;
  void end_update(ClientId client, bool complete) override;
  [[nodiscard]] std::size_t completed_updates() const override { return completed_; }
  [[nodiscard]] bool finish_round(std::span<float> out) override;

 private:
  struct InFlight {
    double weight = 0;
    std::size_t prefix_end = 0;
    bool ended = false;
    FloatBuffer values;
  };
  double bound_, noise_stddev_;
  std::uint64_t seed_, round_ = 0;
  std::size_t size_ = 0;
  std::vector<double> sum_;
  double total_weight_ = 0;
  std::unordered_map<ClientId, InFlight> clients_;
  std::vector<FloatBuffer> spare_;
  std::size_t completed_ = 0;
};

}  // namespace cohort::aggregation
