// One decentralized node's learning (private to client/): its model on a device, its rows of the
// training set, and a DecentralizedOptimizer that mixes with neighbours through a Gossip. Shared
// by the peer runtime (peer.cc) and the in-process simulation (decentralized_sim_main.cc).
// Not thread-safe: one thread per learner.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cohort/aggregation/decentralized.h"
#include "cohort/client/dataset.h"
#include "cohort/client/trainer.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/network.h"

namespace cohort::client {

class PeerLearner {
 public:
  // `device`, `spec` and `train` must outlive the learner. Every node initialises the model from
  // init_seed (the same on all, so they start in consensus); batches come from
  // dataparallel_batch(indices, t, batch, data_seed).
  PeerLearner(const kernels::Device& device, const kernels::NetworkSpec& spec, const Dataset& train,
              std::vector<std::uint32_t> indices, std::size_t batch, std::uint64_t data_seed,
              std::uint64_t init_seed,
              std::unique_ptr<aggregation::DecentralizedOptimizer> optimizer);

  // Step t: a minibatch gradient at the optimizer's eval point, then its local step and mixing.
  // Returns the minibatch loss.
  float step(std::uint64_t t, float lr, aggregation::Gossip& gossip);
  // Loss and accuracy of the eval point on `data`.
  EvalResult evaluate(const Dataset& data);
  // The model to evaluate or share (push-sum: x / w).
  [[nodiscard]] std::span<const float> model();
  [[nodiscard]] std::span<float> parameters() { return x_.span(); }
  [[nodiscard]] const aggregation::DecentralizedOptimizer& optimizer() const { return *opt_; }
  [[nodiscard]] std::size_t samples() const { return indices_.size(); }

 private:
  const Dataset& train_;
  std::unique_ptr<kernels::Network> net_;
  std::vector<std::uint32_t> indices_;
  std::size_t batch_;
  std::uint64_t data_seed_;
  std::unique_ptr<aggregation::DecentralizedOptimizer> opt_;
  FloatBuffer x_;  // the node's state x_i (the network holds eval points)
  std::vector<float> batch_x_;
  std::vector<std::int32_t> batch_y_;
};

}  // namespace cohort::client
