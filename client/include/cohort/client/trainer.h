// Local training and evaluation of a kernels::Network over a client's rows of a Dataset.
//
// LocalTrainer runs E epochs (or exactly S steps) of minibatch training over an index list, with a
// fresh shuffle per epoch drawn from the caller's seed, a learning-rate schedule, the configured
// optimizer, and optionally FedProx's proximal term (docs/ALGORITHMS.md section 1.4): with mu > 0
// the gradient of every step gets mu * (w - w_start) added, where w_start is the model at the start
// of train() (the global model x_t the round began from).
//
// It works through the device-neutral kernels interface, so the same code trains on "cpu" or
// "cuda:N". Batches are gathered into buffers that grow to the largest batch and are then reused:
// the steady training loop allocates nothing. With mu = 0 each step is one fused
// Network::train_step; with mu > 0 it is forward, host loss, backward, a host edit of the
// gradients and step, so on CUDA each FedProx step moves parameters and gradients across the bus.
//
// train.loss = mse trains a regression instead (kernels/regression.h): the dataset's float
// targets (Dataset::regression), the mean squared error as the loss, and evaluation reporting it
// with no accuracy. Each step is forward, host loss, backward and step, as with FedProx.
//
// One LocalTrainer drives one Network; it holds only batch buffers, so a simulator keeps one per
// worker thread and passes each client's indices, seed and schedule position in. Not thread-safe.
// Throws ConfigError for bad options, DataError when the data does not fit the network (feature
// size, label range, an index out of range), KernelError from the kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/client/dataset.h"
#include "cohort/core/buffer.h"
#include "cohort/core/config.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/network.h"
#include "cohort/kernels/optimizer.h"
#include "cohort/kernels/regression.h"

namespace cohort::client {

enum class ScheduleKind { kConstant, kStep, kCosine };

// Learning rate as a function of the step index t (0-based, counted across train() calls by the
// caller's `first_step`):
//   constant: lr
//   step:     lr * gamma^floor(t / step_size)
//   cosine:   min_lr + (lr - min_lr) * (1 + cos(pi * min(t, T) / T)) / 2, T = total_steps, or the
//             number of steps of the current train() call when total_steps == 0
struct LrSchedule {
  ScheduleKind kind = ScheduleKind::kConstant;
  std::size_t step_size = 1000;
  double gamma = 0.1;
  std::size_t total_steps = 0;
  double min_lr = 0.0;

  // REQUIRES: horizon > 0 for cosine (use total_steps or the call's step count).
  [[nodiscard]] double rate(double base_lr, std::size_t t, std::size_t horizon) const;
  // "constant", "step:STEP_SIZE:GAMMA", "cosine[:TOTAL_STEPS[:MIN_LR]]".
  [[nodiscard]] std::string to_string() const;
};

// Parses the forms to_string() writes. Throws ConfigError naming the spec and the valid forms.
LrSchedule parse_lr_schedule(std::string_view spec);

// train.loss: what local training minimises and evaluation reports. kCrossEntropy: softmax
// cross-entropy over integer class labels (test loss and accuracy); kMse: the mean squared error
// over float targets, averaged over every output of every example as PyTorch's MSELoss (test
// loss only: a regression has no accuracy).
enum class LossKind { kCrossEntropy, kMse };

// "cross_entropy" or "mse"; ConfigError listing both otherwise.
LossKind parse_loss_kind(std::string_view text);
std::string_view to_string(LossKind kind);

struct TrainerOptions {
  std::size_t batch_size = 64;
  std::size_t epochs = 1;  // used when steps == 0
  std::size_t steps = 0;   // > 0: exactly this many steps, reshuffling at each epoch boundary
  bool drop_last = false;  // drop each epoch's final partial batch
  kernels::OptimizerOptions optimizer;  // its learning_rate is the schedule's base rate
  LrSchedule schedule;
  double prox_mu = 0.0;  // FedProx mu; 0 is plain local SGD (FedAvg)
  // Zero momentum / Adam moments at the start of each train(): FedAvg clients are stateless.
  bool reset_optimizer_state = true;
  std::size_t eval_batch_size = 1000;
  // Training memory budget in bytes (ALGORITHMS.md 3.5); 0: none. Applied where the network is
  // made (apply_memory_budget): micro-batches with accumulation keep batch_size the effective
  // batch, and evaluation runs in batches of at most batch_size.
  std::size_t memory_budget = 0;
  // train.rule: the local training rule the client and the simulator run, "NAME" or
  // "NAME:ARGUMENT" (cohort/client/local_training.h); "stock" is this LocalTrainer.
  std::string rule = "stock";
  // train.loss. kMse needs regression data (Dataset::regression) and the stock rule.
  LossKind loss = LossKind::kCrossEntropy;
};

// Throws ConfigError naming the field (batch_size 0, no epochs or steps, negative mu, loss = mse
// with a rule other than stock, ...).
void validate(const TrainerOptions& options);

// Reads a config section (e.g. config.section("train")). Keys, all optional (defaults as in
// TrainerOptions): batch_size, epochs, steps, drop_last, optimizer (sgd|adam|adamw), lr,
// momentum, nesterov, weight_decay, beta1, beta2, epsilon, lr_schedule, prox_mu,
// reset_optimizer_state, eval_batch_size, memory_budget, rule, loss; `device` and `threads` are
// accepted and read by device_choice_from(). Throws ConfigError for any other key or a bad value,
// and validates.
TrainerOptions trainer_options_from(const ConfigSection& section);

// Declares the keys above (plus `device` = "cpu" and `threads` = 1) under `prefix` with
// TrainerOptions{}'s defaults, so that --train.lr=0.1 style flags and --help work.
void declare_trainer_options(ConfigSchema& schema, std::string_view prefix = "train");

// The device named by the section: `device` ("cpu", "cuda", "cuda:N"; default "cpu") and
// `threads` (CPU kernel threads; default 1).
struct DeviceChoice {
  std::string device = "cpu";
  std::size_t threads = 1;
};
DeviceChoice device_choice_from(const ConfigSection& section);

struct TrainResult {
  std::size_t samples = 0;  // examples processed (with repeats across epochs)
  std::size_t steps = 0;    // optimizer steps taken
  double mean_loss = 0.0;   // sample-weighted mean of the minibatch training losses
  // Training memory high-water mark of this call, measured: the network's tracked peak (all
  // kinds; 0 on devices that do not track) plus the trainer's batch buffer.
  std::size_t peak_bytes = 0;
  std::size_t micro_batch = 0;   // samples per forward/backward (batch_size when not split)
  std::size_t accumulation = 1;  // micro-batches per step
  bool recompute = false;        // activations recomputed by segment (Network::set_recompute)
};

struct EvalResult {
  std::size_t count = 0;
  double loss = 0.0;         // mean cross-entropy, or (train.loss = mse) the mean squared error
  double accuracy = 0.0;     // fraction correct; 0 when has_accuracy is false
  bool has_accuracy = true;  // false for train.loss = mse: a regression has no accuracy
};

// Plans training of `network` (made by `device`, named model_name in messages) under
// `budget` bytes at options.batch_size (kernels::plan_memory) and sets the network's
// micro-batch. budget 0: no plan is measured and the network trains whole batches (the result
// has micro_batch = batch_size). Throws ConfigError (one line, naming the minimum budget) when
// the model cannot train under the budget, KernelError on a device that cannot micro-batch.
kernels::MemoryPlan apply_memory_budget(kernels::Network& network, const kernels::Device& device,
                                        const TrainerOptions& options, std::size_t budget,
                                        std::string_view model_name);

class LocalTrainer {
 public:
  // `network` is not owned and must outlive the trainer. Sets the network's optimizer.
  LocalTrainer(kernels::Network& network, TrainerOptions options);

  // Trains on data's rows `indices` (an empty list trains nothing). `seed` decides the per-epoch
  // shuffles; `first_step` is the schedule position of the first step (e.g. round * steps). The
  // network's parameters are updated in place. `steps` > 0 runs exactly that many steps instead
  // of the options' epochs or steps (a federated round's RoundStart.local_steps); 0: as configured.
  TrainResult train(const Dataset& data, std::span<const std::uint32_t> indices, std::uint64_t seed,
                    std::size_t first_step = 0, std::size_t steps = 0);
  // The same over every row of `data` (centralized training).
  TrainResult train(const Dataset& data, std::uint64_t seed, std::size_t first_step = 0);

  // Loss and accuracy (train.loss = mse: the mean squared error, no accuracy) over data's rows
  // `indices`, or over every row, in batches of eval_batch_size. Dropout off; touches no gradient
  // or optimizer state.
  EvalResult evaluate(const Dataset& data, std::span<const std::uint32_t> indices);
  EvalResult evaluate(const Dataset& data);

  [[nodiscard]] const TrainerOptions& options() const { return options_; }
  [[nodiscard]] kernels::Network& network() { return network_; }

 private:
  void check_fits(const Dataset& data) const;
  // `all`: every row of data, in which case `indices` is ignored.
  TrainResult train_rows(const Dataset& data, std::span<const std::uint32_t> indices, bool all,
                         std::uint64_t seed, std::size_t first_step, std::size_t steps);
  EvalResult evaluate_rows(const Dataset& data, std::span<const std::uint32_t> indices, bool all);
  // Copies the given rows into batch_x_ and batch_y_ (regression: batch_t_).
  void gather(const Dataset& data, std::span<const std::uint32_t> rows);
  // One optimizer step on the gathered batch; returns its mean loss.
  float step_batch(std::size_t batch);
  // FedProx (1.12): grad += mu * (w - w_start).
  void add_proximal_term();
  [[nodiscard]] bool regression() const { return options_.loss == LossKind::kMse; }

  kernels::Network& network_;
  TrainerOptions options_;
  std::vector<std::uint32_t> order_;
  FloatBuffer batch_x_;
  std::vector<std::int32_t> batch_y_;
  std::vector<float> batch_t_;  // regression targets
  kernels::RegressionBuffers regression_buffers_;
  FloatBuffer start_params_;  // FedProx's w_start
  float current_lr_ = -1.0f;
};

}  // namespace cohort::client
