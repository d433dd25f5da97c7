// FedNova's a_i (local_work.h) against eq. 1.20's closed forms, worked by hand, and against a
// direct run of the optimizer on a scalar where no closed form is given.
#include "cohort/client/local_work.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cohort/kernels/optimizer.h"

namespace cohort::client {
namespace {

TrainerOptions sgd(float lr, float momentum = 0, double mu = 0, bool nesterov = false) {
  TrainerOptions o;
  o.optimizer.learning_rate = lr;
  o.optimizer.momentum = momentum;
  o.optimizer.nesterov = nesterov;
  o.prox_mu = mu;
  return o;
}

// The final displacement, divided by -lr, of `steps` steps of kernels::sgd_step on one parameter
// whose loss gradient is 1 everywhere, with FedProx's mu (w - w_start) added as the trainer does.
double measured(const TrainerOptions& o, std::size_t steps) {
  std::vector<float> w{0.0f}, g{0.0f}, v{0.0f};
  for (std::size_t k = 0; k < steps; ++k) {
    g[0] = 1.0f + static_cast<float>(o.prox_mu) * (w[0] - 0.0f);
    kernels::sgd_step(o.optimizer, w, g,
                      o.optimizer.momentum > 0 ? std::span<float>(v) : std::span<float>());
  }
  return -static_cast<double>(w[0]) / o.optimizer.learning_rate;
}

TEST_CASE("FedNova's a_i: tau for plain SGD, eq. 1.20's closed forms for momentum and FedProx") {
  CHECK(fednova_local_work(sgd(0.1f), 7) == 7.0);
  CHECK(fednova_local_work(sgd(0.1f), 0) == 0.0);
  // Heavy ball, rho = 0.5, tau = 3: velocities 1, 1.5, 1.75 sum to 4.25;
  // [3 - 0.5 (1 - 0.125) / 0.5] / 0.5 = (3 - 0.875) / 0.5 = 4.25.
  CHECK(fednova_local_work(sgd(0.1f, 0.5f), 3) == doctest::Approx(4.25));
  // FedProx, eta mu = 0.1 * 1 = 0.1, tau = 2: steps 1 and 0.9 sum to 1.9 = (1 - 0.81) / 0.1.
  CHECK(fednova_local_work(sgd(0.1f, 0, 1.0), 2) == doctest::Approx(1.9));
  // Large tau: momentum's a tends to tau / (1 - rho) minus a constant; FedProx's to 1 / (eta mu).
  CHECK(fednova_local_work(sgd(0.1f, 0.9f), 1000) ==
        doctest::Approx((1000 - 0.9 * (1 - std::pow(0.9, 1000)) / 0.1) / 0.1));
  CHECK(fednova_local_work(sgd(0.1f, 0, 0.5), 10000) == doctest::Approx(1 / 0.05));
  // Adam has no scalar coefficient: a = tau.
  TrainerOptions adam = sgd(0.001f, 0.9f);
  adam.optimizer.kind = kernels::OptimizerKind::kAdam;
  CHECK(fednova_local_work(adam, 12) == 12.0);
}

TEST_CASE("FedNova's a_i equals the optimizer's own displacement, combinations included") {
  for (const auto& o : {sgd(0.1f), sgd(0.1f, 0.9f), sgd(0.05f, 0, 0.5), sgd(0.05f, 0.9f, 0.5),
                        sgd(0.1f, 0.9f, 0, true), sgd(0.05f, 0.5f, 0.2, true)}) {
    for (const std::size_t tau : {1u, 2u, 5u, 40u}) {
      CAPTURE(o.optimizer.momentum);
      CAPTURE(o.prox_mu);
      CAPTURE(o.optimizer.nesterov);
      CAPTURE(tau);
      CHECK(fednova_local_work(o, tau) == doctest::Approx(measured(o, tau)).epsilon(1e-4));
    }
  }
  // Momentum and FedProx together, tau = 2, rho = 0.5, eta mu = 0.1: step 1 moves 1; step 2's
  // gradient 1 + 0.1 * (-1) = 0.9 and velocity 0.5 + 0.9 = 1.4: a = 2.4.
  CHECK(fednova_local_work(sgd(0.1f, 0.5f, 1.0), 2) == doctest::Approx(2.4));
}

}  // namespace
}  // namespace cohort::client
