#include "cohort/client/local_work.h"

#include <cmath>

namespace cohort::client {
namespace {

// The displacement after `steps` steps from a unit gradient, in units of -eta, by running the
// SGD rule of kernels/optimizer.h on one scalar: g = 1 + eta*mu * u (FedProx's pull back towards
// the start), v = rho v + g, d = nesterov ? g + rho v : v, u -= d. a = -u.
double recursion(double rho, bool nesterov, double eta_mu, std::size_t steps) {
  double u = 0, v = 0;
  for (std::size_t k = 0; k < steps; ++k) {
    const double g = 1.0 + eta_mu * u;
    v = rho * v + g;
    u -= nesterov ? g + rho * v : v;
  }
  return -u;
}

}  // namespace

double fednova_local_work(const TrainerOptions& options, std::size_t steps) {
  const double tau = static_cast<double>(steps);
  if (steps == 0 || options.optimizer.kind != kernels::OptimizerKind::kSgd) return tau;
  const double rho = options.optimizer.momentum;
  const bool nesterov = options.optimizer.nesterov && rho > 0;
  const double eta_mu = static_cast<double>(options.optimizer.learning_rate) * options.prox_mu;
  const bool prox = eta_mu > 0;
  if (rho <= 0 && !prox) return tau;    // eq. 1.20, plain SGD
  if (!nesterov && !prox && rho < 1) {  // eq. 1.20, heavy-ball momentum
    return (tau - rho * (1 - std::pow(rho, tau)) / (1 - rho)) / (1 - rho);
  }
  if (rho <= 0) {  // eq. 1.20, FedProx
    return (1 - std::pow(1 - eta_mu, tau)) / eta_mu;
  }
  return recursion(rho, nesterov, eta_mu, steps);
}

}  // namespace cohort::client
