// FedAvg (docs/ALGORITHMS.md 1.1): the sample-weighted mean of the clients' deltas, streamed.
//
// Memory is O(range) plus O(clients): one fp64 running sum of w_k * Delta_k and, per client, its
// weight and how far its update got. Chunks of one client must arrive in order and contiguous,
// so what a client contributed is always a prefix of the range; an update abandoned half-way
// (a later chunk rejected, the client gone) keeps its finite prefix, and every coordinate is
// divided by the weight of exactly the clients that contributed to it. A coordinate no client
// reached gets a zero delta.
#pragma once

#include <unordered_map>
#include <vector>

#include "cohort/aggregation/aggregator.h"

namespace cohort::aggregation {

class FedAvg final : public Aggregator {
 public:
  [[nodiscard]] bool is_streaming() const override { return true; }
  void begin_round(std::uint64_t round, std::size_t size) override;
  [[nodiscard]] Verdict accept(const UpdateChunk& chunk) override;
  void end_update(ClientId client, bool complete) override;
  [[nodiscard]] std::size_t completed_updates() const override { return completed_; }
  [[nodiscard]] bool finish_round(std::span<float> out) override;

 private:
  struct Contribution {
    double weight = 0;
    std::size_t prefix_end = 0;  // coordinates [0, prefix_end) are summed in
    bool ended = false;
  };
  std::size_t size_ = 0;
  std::vector<double> sum_;  // sized once, reused across rounds
  std::unordered_map<ClientId, Contribution> clients_;
  std::size_t completed_ = 0;
};

}  // namespace cohort::aggregation
