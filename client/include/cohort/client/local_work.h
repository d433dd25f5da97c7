// FedNova's a_i (docs/ALGORITHMS.md 1.7, eq. 1.20): the length of a client's local "aggregation
// vector", which the shard divides its update by so that clients that ran different numbers of
// local steps count alike. Pure; the client puts it into every Push (Push.local_work).
#pragma once

#include <cstddef>

#include "cohort/client/trainer.h"

namespace cohort::client {

// a_i for `steps` local steps under `options` (its optimizer, base learning rate and FedProx mu):
//   plain SGD:                      a = tau
//   heavy-ball momentum rho:        a = [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)
//   FedProx mu (lr eta):            a = [1 - (1 - eta mu)^tau] / (eta mu)
//   momentum and FedProx together, or Nesterov momentum: the same quantity (the sum of the
//   coefficients every step's gradient carries into the final displacement, in units of eta)
//   computed by running the optimizer's scalar recursion with a unit gradient.
// Adam and AdamW scale each coordinate by its own second moment, which has no such scalar
// coefficient: a = tau (the step count, the normalisation FedNova's paper uses for them too).
// Weight decay, the learning-rate schedule and momentum carried across rounds
// (reset_optimizer_state = false) are not modelled: the base rate is used and the velocity is
// taken to start at zero. steps == 0 gives 0 (no work).
double fednova_local_work(const TrainerOptions& options, std::size_t steps);

}  // namespace cohort::client
