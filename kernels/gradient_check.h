// Test helpers shared by the kernels' tests: random inputs and a finite-difference check of a
// network's parameter gradients.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cohort/kernels/loss.h"
#include "cohort/kernels/network.h"

namespace cohort::kernels::testing {

inline std::vector<float> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Loss of one training forward with the dropout mask pinned by set_seed.
inline double pinned_loss(Network& net, const std::vector<float>& x,
                          const std::vector<std::int32_t>& y) {
  net.set_seed(3);
  const auto logits = net.forward(x, y.size(), /*training=*/true);
  return softmax_cross_entropy(logits, y, net.output_size());
}

// Central differences of pinned_loss against backward()'s gradients, every `stride`-th
// parameter: the count of those off by more than abs_tol + rel_tol * |g| (the first five are
// reported). `checked` receives how many were compared.
inline std::size_t gradient_mismatches(Network& net, const std::vector<float>& x,
                                       const std::vector<std::int32_t>& y, float h, double abs_tol,
                                       double rel_tol, std::size_t stride, std::size_t& checked) {
  std::vector<float> dlogits(y.size() * net.output_size());
  net.set_seed(3);
  const auto logits = net.forward(x, y.size(), true);
  softmax_cross_entropy(logits, y, net.output_size(), dlogits);
  net.backward(dlogits);
  const std::vector<float> grads(net.gradients().begin(), net.gradients().end());
  auto params = net.parameters();
  std::size_t bad = 0;
  checked = 0;
  for (std::size_t j = 0; j < params.size(); j += stride) {
    const float saved = params[j];
    params[j] = saved + h;
    const double up = pinned_loss(net, x, y);
    params[j] = saved - h;
    const double down = pinned_loss(net, x, y);
    params[j] = saved;
    const double numeric = (up - down) / (2 * h);
    ++checked;
    if (std::abs(numeric - grads[j]) > abs_tol + rel_tol * std::abs(grads[j])) {
      if (++bad <= 5) MESSAGE("param " << j << " numeric " << numeric << " analytic " << grads[j]);
    }
  }
  return bad;
}

}  // namespace cohort::kernels::testing
