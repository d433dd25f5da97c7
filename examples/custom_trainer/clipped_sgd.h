// A local training rule Cohort does not have: SGD whose every step's gradient is clipped to an L2
// norm of at most max_norm (the whole model's gradient, after the batch's mean), as clients do to
// bound their contribution or to keep a diverging model stable. With a max_norm no gradient
// reaches, it trains exactly as the stock rule's SGD would on the same batches.
//
// It keeps the stock trainer's work (cohort-sim's virtual clock charges it): epochs of the
// client's rows, shuffled per epoch from the round's seed, in batches of train.batch_size (the last
// partial unless train.drop_last), or exactly round.steps / train.steps steps across epochs. It
// uses train.lr, train.momentum (and the rest of train.optimizer) and resets the optimizer state
// each round; the learning-rate schedule and FedProx's prox_mu are the stock rule's and are
// refused here.
#pragma once

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "cohort/client/local_training.h"

namespace example {

class ClippedSgd final : public cohort::client::LocalTraining {
 public:
  // REQUIRES max_norm > 0 (ConfigError otherwise, as for the options it refuses).
  ClippedSgd(cohort::kernels::Network& network, const cohort::client::TrainerOptions& options,
             double max_norm);

  cohort::client::TrainResult train(const cohort::client::LocalRound& round) override;

  // Steps whose gradient was scaled down, over this rule's life (tests read it).
  [[nodiscard]] std::uint64_t clipped_steps() const { return clipped_; }

 private:
  cohort::kernels::Network& network_;
  cohort::client::TrainerOptions options_;
  double max_norm_;
  std::vector<std::uint32_t> order_;
  std::vector<float> batch_x_;
  std::vector<std::int32_t> batch_y_;
  std::uint64_t clipped_ = 0;
};

// train.rule = "clipped_sgd:MAX_NORM" (the plug-in's factory): MAX_NORM a positive number.
double parse_max_norm(std::string_view argument);

}  // namespace example
