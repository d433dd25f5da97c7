#include "clipped_sgd.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>

#include "cohort/core/error.h"

namespace example {

using cohort::ConfigError;
using cohort::DataError;

ClippedSgd::ClippedSgd(cohort::kernels::Network& network,
                       const cohort::client::TrainerOptions& options, double max_norm)
    : network_(network), options_(options), max_norm_(max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw ConfigError("clipped_sgd: the maximum norm must be a positive number");
  }
  if (options.prox_mu > 0) throw ConfigError("clipped_sgd: train.prox_mu is not supported");
  if (options.schedule.kind != cohort::client::ScheduleKind::kConstant) {
    throw ConfigError("clipped_sgd: train.lr_schedule must be constant");
  }
  network_.set_optimizer(options.optimizer);
}

cohort::client::TrainResult ClippedSgd::train(const cohort::client::LocalRound& round) {
  const auto& data = round.data;
  const std::size_t n = round.rows.size(), d = data.feature_dim(), B = options_.batch_size;
  cohort::client::TrainResult result;
  if (n == 0) return result;
  const std::size_t per_epoch = options_.drop_last ? n / B : (n + B - 1) / B;
  if (per_epoch == 0) throw DataError("clipped_sgd: no full batch with train.drop_last");
  const std::size_t total = round.steps > 0      ? round.steps
                            : options_.steps > 0 ? options_.steps
                                                 : options_.epochs * per_epoch;
  network_.reset_optimizer_state();
  network_.set_seed(round.seed);
  order_.assign(round.rows.begin(), round.rows.end());
  batch_x_.resize(B * d);
  batch_y_.resize(B);
  double loss_sum = 0;
  for (std::uint64_t epoch = 0; result.steps < total; ++epoch) {
    std::mt19937_64 rng(round.seed * 0x9E3779B97F4A7C15ULL + epoch);
    std::shuffle(order_.begin(), order_.end(), rng);
    for (std::size_t b = 0; b < per_epoch && result.steps < total; ++b) {
      const std::size_t begin = b * B, batch = std::min(B, n - begin);
      for (std::size_t k = 0; k < batch; ++k) {
        const auto row = data.row(order_[begin + k]);
        std::copy(row.begin(), row.end(), batch_x_.begin() + static_cast<std::ptrdiff_t>(k * d));
        batch_y_[k] = data.labels()[order_[begin + k]];
      }
      const float loss =
          network_.compute_gradients(std::span<const float>(batch_x_.data(), batch * d),
                                     std::span<const std::int32_t>(batch_y_.data(), batch), batch);
      auto g = network_.gradients();
      const double norm = std::sqrt(std::transform_reduce(g.begin(), g.end(), 0.0, std::plus<>(),
                                                          [](float v) { return double(v) * v; }));
      if (norm > max_norm_) {
        const auto scale = static_cast<float>(max_norm_ / norm);
        for (float& v : g) v *= scale;
        ++clipped_;
      }
      network_.step();
      loss_sum += static_cast<double>(loss) * static_cast<double>(batch);
      result.samples += batch;
      ++result.steps;
    }
  }
  result.mean_loss = loss_sum / static_cast<double>(result.samples);
  result.micro_batch = B;
  return result;
}

double parse_max_norm(std::string_view argument) {
  const std::string text(argument);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v > 0) || !std::isfinite(v)) {
    throw ConfigError("train.rule 'clipped_sgd:MAX_NORM' needs a positive MAX_NORM, got '" + text +
                      "'");
  }
  return v;
}

}  // namespace example
