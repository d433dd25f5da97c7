#include "cohort/client/trainer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <numeric>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/random.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/regression.h"

namespace cohort::client {
namespace {

constexpr std::string_view kScheduleForms =
    "valid: constant, step:STEP_SIZE:GAMMA, cosine[:TOTAL_STEPS[:MIN_LR]]";

[[noreturn]] void bad_schedule(std::string_view spec, const std::string& why) {
  throw ConfigError("lr schedule '" + std::string(spec) + "': " + why + "; " +
                    std::string(kScheduleForms));
}

double schedule_number(std::string_view spec, std::string_view text) {
  double v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() || !std::isfinite(v)) {
    bad_schedule(spec, std::string("'").append(text).append("' is not a number"));
  }
  return v;
}

std::size_t schedule_count(std::string_view spec, std::string_view text, bool allow_zero) {
  const double v = schedule_number(spec, text);
  if (v < (allow_zero ? 0 : 1) || v != std::floor(v) || v > 1e15) {
    bad_schedule(spec, std::string("'")
                           .append(text)
                           .append("' must be an integer >= ")
                           .append(allow_zero ? "0" : "1"));
  }
  return static_cast<std::size_t>(v);
}

std::size_t non_negative(const ConfigSection& section, std::string_view key, std::size_t fallback) {
  const std::int64_t v = section.get_int(key, static_cast<std::int64_t>(fallback));
  if (v < 0) {
    throw ConfigError("config key '" + section.prefix() + "." + std::string(key) +
                      "' must be >= 0, got " + std::to_string(v));
  }
  return static_cast<std::size_t>(v);
}

}  // namespace

double LrSchedule::rate(double base_lr, std::size_t t, std::size_t horizon) const {
  switch (kind) {
    case ScheduleKind::kConstant: return base_lr;
    case ScheduleKind::kStep: return base_lr * std::pow(gamma, static_cast<double>(t / step_size));
    case ScheduleKind::kCosine: {
      const std::size_t total = total_steps > 0 ? total_steps : horizon;
      COHORT_CHECK(total > 0) << "cosine schedule without a horizon";
      const double progress = static_cast<double>(std::min(t, total)) / static_cast<double>(total);
      return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr;
}

std::string LrSchedule::to_string() const {
  std::ostringstream out;
  switch (kind) {
    case ScheduleKind::kConstant: out << "constant"; break;
    case ScheduleKind::kStep: out << "step:" << step_size << ':' << gamma; break;
    case ScheduleKind::kCosine: out << "cosine:" << total_steps << ':' << min_lr; break;
  }
  return out.str();
}

LrSchedule parse_lr_schedule(std::string_view spec) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == spec.npos ? spec.npos : colon - start));
    if (colon == spec.npos) break;
    start = colon + 1;
  }
  LrSchedule out;
  if (parts[0] == "constant") {
    if (parts.size() != 1) bad_schedule(spec, "constant takes no parameters");
    out.kind = ScheduleKind::kConstant;
  } else if (parts[0] == "step") {
    if (parts.size() != 3) bad_schedule(spec, "step needs STEP_SIZE and GAMMA");
    out.kind = ScheduleKind::kStep;
    out.step_size = schedule_count(spec, parts[1], false);
    out.gamma = schedule_number(spec, parts[2]);
    if (!(out.gamma > 0)) bad_schedule(spec, "GAMMA must be > 0");
  } else if (parts[0] == "cosine") {
    if (parts.size() > 3) bad_schedule(spec, "too many parameters");
    out.kind = ScheduleKind::kCosine;
    if (parts.size() > 1) out.total_steps = schedule_count(spec, parts[1], true);
    if (parts.size() > 2) out.min_lr = schedule_number(spec, parts[2]);
    if (out.min_lr < 0) bad_schedule(spec, "MIN_LR must be >= 0");
  } else {
    bad_schedule(spec, "unknown schedule '" + std::string(parts[0]) + "'");
  }
  return out;
}

LossKind parse_loss_kind(std::string_view text) {
  if (text == "cross_entropy") return LossKind::kCrossEntropy;
  if (text == "mse") return LossKind::kMse;
  throw ConfigError("train.loss must be cross_entropy or mse, got '" + std::string(text) + "'");
}

std::string_view to_string(LossKind kind) {
  return kind == LossKind::kMse ? "mse" : "cross_entropy";
}

void validate(const TrainerOptions& options) {
  if (options.batch_size == 0) throw ConfigError("trainer: batch_size must be >= 1");
  if (options.eval_batch_size == 0) throw ConfigError("trainer: eval_batch_size must be >= 1");
  if (options.rule.empty() || options.rule.front() == ':') {
    throw ConfigError("trainer: rule must name a local training rule (e.g. stock), got '" +
                      options.rule + "'");
  }
  if (options.epochs == 0 && options.steps == 0) {
    throw ConfigError("trainer: set epochs >= 1 or steps >= 1");
  }
  if (options.loss == LossKind::kMse && options.rule != "stock") {
    // A plug-in's rule is handed the options, but rules written for class labels would read
    // the labels a regression dataset does not have: refused rather than trained wrong.
    throw ConfigError("train.loss = mse is trained by the stock rule only, not train.rule = '" +
                      options.rule + "'");
  }
  if (!(options.prox_mu >= 0) || !std::isfinite(options.prox_mu)) {
    throw ConfigError("trainer: prox_mu must be a finite number >= 0, got " +
                      std::to_string(options.prox_mu));
  }
  if (options.schedule.kind == ScheduleKind::kStep && options.schedule.step_size == 0) {
    throw ConfigError("trainer: lr schedule step size must be >= 1");
  }
  kernels::validate(options.optimizer);
}

TrainerOptions trainer_options_from(const ConfigSection& section) {
  static constexpr std::string_view kKnown[] = {
      "batch_size",      "epochs",    "steps",
      "drop_last",       "optimizer", "lr",
      "momentum",        "nesterov",  "weight_decay",
      "beta1",           "beta2",     "epsilon",
      "lr_schedule",     "prox_mu",   "reset_optimizer_state",
      "eval_batch_size", "device",    "threads",
      "memory_budget",   "rule",      "loss"};
  section.require_known(kKnown);
  TrainerOptions o;
  o.batch_size = non_negative(section, "batch_size", o.batch_size);
  o.epochs = non_negative(section, "epochs", o.epochs);
  o.steps = non_negative(section, "steps", o.steps);
  o.drop_last = section.get_bool("drop_last", o.drop_last);
  o.eval_batch_size = non_negative(section, "eval_batch_size", o.eval_batch_size);
  o.memory_budget = non_negative(section, "memory_budget", o.memory_budget);
  auto& opt = o.optimizer;
  opt.kind = kernels::parse_optimizer_kind(
      section.get_string("optimizer", std::string(kernels::to_string(opt.kind))));
  opt.learning_rate = static_cast<float>(section.get_double("lr", opt.learning_rate));
  opt.momentum = static_cast<float>(section.get_double("momentum", opt.momentum));
  opt.nesterov = section.get_bool("nesterov", opt.nesterov);
  opt.weight_decay = static_cast<float>(section.get_double("weight_decay", opt.weight_decay));
  opt.beta1 = static_cast<float>(section.get_double("beta1", opt.beta1));
  opt.beta2 = static_cast<float>(section.get_double("beta2", opt.beta2));
  opt.epsilon = static_cast<float>(section.get_double("epsilon", opt.epsilon));
  o.schedule = parse_lr_schedule(section.get_string("lr_schedule", "constant"));
  o.prox_mu = section.get_double("prox_mu", o.prox_mu);
  o.reset_optimizer_state = section.get_bool("reset_optimizer_state", o.reset_optimizer_state);
  o.rule = section.get_string("rule", o.rule);
  o.loss = parse_loss_kind(section.get_string("loss", std::string(to_string(o.loss))));
  validate(o);
  return o;
}

void declare_trainer_options(ConfigSchema& schema, std::string_view prefix) {
  const TrainerOptions d;
  const std::string p = std::string(prefix) + ".";
  auto i64 = [](std::size_t v) { return static_cast<std::int64_t>(v); };
  schema.add(p + "device", std::string("cpu"), "where to train: cpu, cuda, cuda:N")
      .add(p + "threads", std::int64_t{1}, "CPU kernel threads per network (0: one per core)")
      .add(p + "batch_size", i64(d.batch_size), "minibatch size")
      .add(p + "epochs", i64(d.epochs), "local epochs (when steps = 0)")
      .add(p + "steps", i64(d.steps), "local steps; > 0 overrides epochs")
      .add(p + "drop_last", d.drop_last, "drop each epoch's final partial batch")
      .add(p + "optimizer", std::string(kernels::to_string(d.optimizer.kind)), "sgd, adam or adamw")
      .add(p + "lr", static_cast<double>(d.optimizer.learning_rate), "base learning rate")
      .add(p + "momentum", static_cast<double>(d.optimizer.momentum), "SGD momentum")
      .add(p + "nesterov", d.optimizer.nesterov, "SGD Nesterov momentum")
      .add(p + "weight_decay", static_cast<double>(d.optimizer.weight_decay),
           "L2 weight decay (decoupled for adamw)")
      .add(p + "beta1", static_cast<double>(d.optimizer.beta1), "Adam beta1")
      .add(p + "beta2", static_cast<double>(d.optimizer.beta2), "Adam beta2")
      .add(p + "epsilon", static_cast<double>(d.optimizer.epsilon), "Adam epsilon")
      .add(p + "lr_schedule", d.schedule.to_string(),
           "constant, step:STEP_SIZE:GAMMA or cosine[:TOTAL_STEPS[:MIN_LR]]")
      .add(p + "prox_mu", d.prox_mu, "FedProx proximal coefficient mu (0: off)")
      .add(p + "reset_optimizer_state", d.reset_optimizer_state,
           "zero optimizer state at the start of each local training")
      .add(p + "eval_batch_size", i64(d.eval_batch_size), "batch size for evaluation")
      .add(p + "rule", d.rule,
           "local training rule: stock, or NAME[:ARGUMENT] of one a plug-in adds (--plugin; "
           "cohort/client/local_training.h)")
      .add(p + "loss", std::string(to_string(d.loss)),
           "cross_entropy (class labels; test loss and accuracy) or mse (float targets, the "
           "mean squared error; test loss only)")
      .add(p + "memory_budget", i64(d.memory_budget),
           "training memory budget in bytes (0: none): micro-batches with accumulation keep "
           "batch_size the effective batch; refused with the minimum when nothing fits");
}

kernels::MemoryPlan apply_memory_budget(kernels::Network& network, const kernels::Device& device,
                                        const TrainerOptions& options, std::size_t budget,
                                        std::string_view model_name) {
  if (budget == 0) {
    network.set_micro_batch(0);
    network.set_recompute(false);
    kernels::MemoryPlan whole;
    whole.batch = whole.micro_batch = options.batch_size;
    return whole;
  }
  kernels::MemoryPlan plan = kernels::plan_memory(network.spec(), device, options.optimizer,
                                                  options.batch_size, budget, model_name);
  network.set_micro_batch(plan.network_micro_batch());
  network.set_recompute(plan.recompute);
  return plan;
}

DeviceChoice device_choice_from(const ConfigSection& section) {
  DeviceChoice out;
  out.device = section.get_string("device", out.device);
  out.threads = non_negative(section, "threads", out.threads);
  return out;
}

LocalTrainer::LocalTrainer(kernels::Network& network, TrainerOptions options)
    : network_(network), options_(std::move(options)) {
  validate(options_);
  network_.set_optimizer(options_.optimizer);
  current_lr_ = options_.optimizer.learning_rate;
}

void LocalTrainer::check_fits(const Dataset& data) const {
  const auto& spec = network_.spec();
  if (data.feature_dim() != spec.input_shape().size()) {
    throw DataError("dataset examples have " + std::to_string(data.feature_dim()) + " features (" +
                    kernels::to_string(data.shape()) + ") but the model takes " +
                    std::to_string(spec.input_shape().size()) + " (" +
                    kernels::to_string(spec.input_shape()) + ")");
  }
  if (data.is_regression() != regression()) {
    throw DataError(regression() ? "train.loss = mse needs float targets (a regression dataset), "
                                   "but the dataset holds class labels"
                                 : "train.loss = cross_entropy needs class labels, but the "
                                   "dataset holds regression targets (train.loss = mse)");
  }
  if (data.is_regression() && data.target_dim() != network_.output_size()) {
    throw DataError("dataset has " + std::to_string(data.target_dim()) +
                    " targets per example but the model outputs " +
                    std::to_string(network_.output_size()));
  }
  if (data.num_classes() > network_.output_size()) {
    throw DataError("dataset has " + std::to_string(data.num_classes()) +
                    " classes but the model outputs " + std::to_string(network_.output_size()));
  }
}

void LocalTrainer::gather(const Dataset& data, std::span<const std::uint32_t> rows) {
  const std::size_t d = data.feature_dim();
  const std::size_t t = data.target_dim();
  if (batch_x_.size() < rows.size() * d) batch_x_.resize(rows.size() * d);
  if (data.is_regression()) {
    if (batch_t_.size() < rows.size() * t) batch_t_.resize(rows.size() * t);
  } else if (batch_y_.size() < rows.size()) {
    batch_y_.resize(rows.size());
  }
  const float* src = data.features().data();
  const auto labels = data.labels();
  const auto targets = data.targets();
  float* dst = batch_x_.data();
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::size_t i = rows[k];
    std::copy_n(src + i * d, d, dst + k * d);
    if (data.is_regression()) {
      std::copy_n(targets.data() + i * t, t, batch_t_.data() + k * t);
    } else {
      batch_y_[k] = labels[i];
    }
  }
}

void LocalTrainer::add_proximal_term() {
  const auto params = std::as_const(network_).parameters();
  const auto grads = network_.gradients();
  const auto mu = static_cast<float>(options_.prox_mu);
  const float* start = start_params_.data();
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += mu * (params[i] - start[i]);
}

float LocalTrainer::step_batch(std::size_t batch) {
  const auto input =
      std::span<const float>(batch_x_.data(), batch * network_.spec().input_shape().size());
  const auto labels = std::span<const std::int32_t>(batch_y_.data(), regression() ? 0 : batch);
  if (!regression() && options_.prox_mu == 0) return network_.train_step(input, labels, batch);
  const float loss =
      regression() ? kernels::regression_gradients(
                         network_, input,
                         std::span<const float>(batch_t_.data(), batch * network_.output_size()),
                         batch, &regression_buffers_)
                   : network_.compute_gradients(input, labels, batch);
  if (options_.prox_mu > 0) add_proximal_term();
  network_.step();
  return loss;
}

TrainResult LocalTrainer::train(const Dataset& data, std::span<const std::uint32_t> indices,
                                std::uint64_t seed, std::size_t first_step, std::size_t steps) {
  return train_rows(data, indices, /*all=*/false, seed, first_step, steps);
}

TrainResult LocalTrainer::train(const Dataset& data, std::uint64_t seed, std::size_t first_step) {
  return train_rows(data, {}, /*all=*/true, seed, first_step, /*steps=*/0);
}

EvalResult LocalTrainer::evaluate(const Dataset& data, std::span<const std::uint32_t> indices) {
  return evaluate_rows(data, indices, /*all=*/false);
}

EvalResult LocalTrainer::evaluate(const Dataset& data) {
  return evaluate_rows(data, {}, /*all=*/true);
}

TrainResult LocalTrainer::train_rows(const Dataset& data, std::span<const std::uint32_t> indices,
                                     bool all, std::uint64_t seed, std::size_t first_step,
                                     std::size_t steps) {
  check_fits(data);
  const std::size_t n = all ? data.size() : indices.size();
  TrainResult result;
  if (n == 0) return result;
  for (const auto i : indices) {
    if (i >= data.size()) {
      throw DataError("trainer: index " + std::to_string(i) + " out of range for " +
                      std::to_string(data.size()) + " examples");
    }
  }
  order_.resize(n);
  const std::size_t B = options_.batch_size;
  const std::size_t full = n / B;
  const std::size_t batches_per_epoch = options_.drop_last ? full : (n + B - 1) / B;
  if (batches_per_epoch == 0) {
    throw DataError("trainer: " + std::to_string(n) + " examples make no full batch of " +
                    std::to_string(B) + " with drop_last");
  }
  const std::size_t total_steps = steps > 0            ? steps
                                  : options_.steps > 0 ? options_.steps
                                                       : options_.epochs * batches_per_epoch;

  if (options_.reset_optimizer_state) network_.reset_optimizer_state();
  network_.reset_memory_peak();
  if (options_.prox_mu > 0) {
    const auto params = std::as_const(network_).parameters();
    if (start_params_.size() != params.size()) start_params_ = FloatBuffer(params.size());
    std::copy(params.begin(), params.end(), start_params_.begin());
  }
  const double base_lr = options_.optimizer.learning_rate;
  double loss_sum = 0.0;
  std::size_t step = 0;
  for (std::uint64_t epoch = 0; step < total_steps; ++epoch) {
    if (all) {
      std::iota(order_.begin(), order_.end(), std::uint32_t{0});
    } else {
      std::copy(indices.begin(), indices.end(), order_.begin());
    }
    Rng rng = Rng::for_stream(seed, epoch);
    rng.shuffle(std::span<std::uint32_t>(order_));
    for (std::size_t b = 0; b < batches_per_epoch && step < total_steps; ++b, ++step) {
      const std::size_t begin = b * B;
      const std::size_t batch = std::min(B, n - begin);
      gather(data, std::span<const std::uint32_t>(order_.data() + begin, batch));
      const auto lr =
          static_cast<float>(options_.schedule.rate(base_lr, first_step + step, total_steps));
      if (lr != current_lr_) {
        network_.set_learning_rate(lr);
        current_lr_ = lr;
      }
      const float loss = step_batch(batch);
      loss_sum += static_cast<double>(loss) * static_cast<double>(batch);
      result.samples += batch;
    }
  }
  result.steps = step;
  result.mean_loss = loss_sum / static_cast<double>(result.samples);
  const kernels::MemoryReport memory = network_.memory();
  if (memory.tracked) {
    result.peak_bytes = memory.peak.total + batch_x_.bytes() + batch_y_.capacity() * 4 +
                        (batch_t_.capacity() + regression_buffers_.dloss.capacity() +
                         regression_buffers_.gradient_sum.capacity()) *
                            4;
  }
  const std::size_t m = network_.micro_batch();
  result.micro_batch = m == 0 || m >= B ? B : m;
  result.accumulation = (B + result.micro_batch - 1) / result.micro_batch;
  result.recompute = network_.recompute();
  return result;
}

EvalResult LocalTrainer::evaluate_rows(const Dataset& data, std::span<const std::uint32_t> indices,
                                       bool all) {
  check_fits(data);
  const std::size_t n = all ? data.size() : indices.size();
  const std::size_t d = data.feature_dim();
  // Under a memory plan the gathered rows stay within a training batch's.
  const std::size_t B = network_.micro_batch() > 0
                            ? std::min(options_.eval_batch_size, options_.batch_size)
                            : options_.eval_batch_size;
  const std::size_t t = data.target_dim();
  double loss_sum = 0.0;
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < n; begin += B) {
    const std::size_t batch = std::min(B, n - begin);
    // Rows are contiguous with `all`: evaluate straight from the dataset, no copy.
    std::span<const float> x;
    if (all) {
      x = data.features().subspan(begin * d, batch * d);
    } else {
      for (std::size_t k = 0; k < batch; ++k) {
        if (indices[begin + k] >= data.size()) {
          throw DataError("trainer: index " + std::to_string(indices[begin + k]) +
                          " out of range for " + std::to_string(data.size()) + " examples");
        }
      }
      gather(data, indices.subspan(begin, batch));
      x = std::span<const float>(batch_x_.data(), batch * d);
    }
    if (regression()) {
      const auto targets = all ? data.targets().subspan(begin * t, batch * t)
                               : std::span<const float>(batch_t_.data(), batch * t);
      loss_sum += kernels::evaluate_regression(network_, x, targets, batch).squared_error_sum;
      continue;
    }
    const auto labels = all ? data.labels().subspan(begin, batch)
                            : std::span<const std::int32_t>(batch_y_.data(), batch);
    const kernels::Evaluation e = network_.evaluate(x, labels, batch);
    loss_sum += e.loss_sum;
    correct += e.correct;
  }
  EvalResult out;
  out.count = n;
  out.has_accuracy = !regression();
  if (n > 0) {
    // mse: the mean over every output of every example, as in training.
    out.loss = loss_sum / static_cast<double>(regression() ? n * t : n);
    out.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  return out;
}

}  // namespace cohort::client
