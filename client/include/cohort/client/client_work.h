// What a federated client brings to a round, apart from the protocol: its examples and its local
// training. The participant (participant.h) registers, pulls, makes the delta (DP clip, attack,
// compression), pushes and reports; a ClientWork says how many samples it holds, takes the
// coordinator's model and [train] options, and trains the parameters it exposes in place.
//
// cohort-client's work is the stock one (make_stock_work: the files of data.*, a network of the
// coordinator's model.spec, train.rule); the Python module's is the user's function
// (python/client.cc). Not thread-safe: the participant calls it from its one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "cohort/client/local_training.h"
#include "cohort/client/trainer.h"

namespace cohort::client {

struct ParticipantOptions;

// The coordinator's model, from its Welcome.
struct WorkModel {
  std::string spec;                 // model.spec, e.g. "mlp:784-256-128-10"
  std::size_t parameter_count = 0;  // the length of the global model vector
  std::string training_toml;        // its [train] section as sent (keys as in TrainerOptions)
  TrainerOptions train;             // the same, read and checked
};

// One federated round.
struct WorkRound {
  std::uint64_t round = 0;
  std::uint64_t model_version = 0;  // of the global model in parameters()
  // > 0: exactly this many optimizer steps (server.work sizes each client's work); 0: as
  // train.epochs / train.steps configure.
  std::uint32_t local_steps = 0;
  std::uint64_t seed = 0;  // this round's shuffles: from the model version and the client
};

// What train() did. `trained` in the base is what TrainResult says (samples, steps, mean loss,
// memory); num_samples weighs the update (0: the registered num_samples()).
struct WorkResult {
  TrainResult trained;
  std::uint64_t num_samples = 0;
  // Seconds of the call spent training (0: all of it). A work that converts parameters in and out
  // of its own framework leaves that conversion out, so the report's train_seconds is training
  // and the rest of the round counts as framework time.
  double train_seconds = 0;
};

// A data-parallel step (server.mode = dataparallel): the rows to take, as the participant's
// dataparallel_batch / dataparallel_rows choose them.
struct GradientStep {
  std::uint64_t step = 0;
  std::size_t batch = 0;       // RoundStart.batch_size (a mean over the rows)
  std::uint32_t assigned = 0;  // > 0: speed batches, this many rows summed (ALGORITHMS.md 3.4)
  std::uint64_t cursor = 0;    // speed batches: rows taken so far from the stream of epochs
  std::uint64_t seed = 0;
};

class ClientWork {
 public:
  virtual ~ClientWork() = default;

  // Registered with the coordinator (its weight in selection and the default update weight).
  [[nodiscard]] virtual std::size_t num_samples() const = 0;
  // Register.partition: how the examples were chosen, for the coordinator's log.
  [[nodiscard]] virtual std::string describe() const = 0;
  // The device it trains on, for the coordinator's pool ("cpu", "cuda:0", "python").
  [[nodiscard]] virtual std::string device() const = 0;
  // What trains, for messages: "train.rule 'stock'", "the train function".
  [[nodiscard]] virtual std::string trainer_name() const = 0;

  // The coordinator's model: make what training needs. Called at every Welcome (again after a
  // reconnect: `same_model` when the spec did not change). Throws cohort::Error subclasses for a
  // model the work cannot train, which stops the client with that message.
  virtual void on_welcome(const WorkModel& model, bool same_model) = 0;

  // The parameters pulls land in and training leaves its result in (parameter_count floats).
  virtual std::span<float> parameters() = 0;

  // Trains parameters() in place from the round's global model.
  virtual WorkResult train(const WorkRound& round) = 0;

  // The model in parameters() on the work's test examples; nullopt when it has none.
  virtual std::optional<EvalResult> evaluate() = 0;

  // Data-parallel: the gradient at parameters() of one step's rows into gradients(); returns the
  // rows taken and the mean loss. The default refuses (ConfigError): the work trains federated
  // rounds only.
  virtual std::pair<std::size_t, double> gradient(const GradientStep& step);
  virtual std::span<const float> gradients() { return {}; }

  // False when evaluate() has nothing to evaluate on: the coordinator is told at registration and
  // asks other clients to evaluate the global model.
  [[nodiscard]] virtual bool evaluates() const { return true; }

  // Polled between messages: true stops the client (returns as if `stop` were set).
  virtual bool should_stop() { return false; }
};

// cohort-client's work: the files of options.data, options.partition's part, a network of the
// coordinator's model on options.device, trained with train.rule made from `rules` (which must
// outlive it). Reads the data here (DataError / ConfigError for bad files or options).
std::unique_ptr<ClientWork> make_stock_work(const ParticipantOptions& options,
                                            const LocalTrainingRegistry& rules);

}  // namespace cohort::client
