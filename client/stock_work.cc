// cohort-client's ClientWork: the files of data.*, this client's part of the partition, a network
// of the coordinator's model on client.device and train.rule (client_work.h).
#include <algorithm>
#include <utility>

#include "cohort/client/client_work.h"
#include "cohort/client/data_source.h"
#include "cohort/client/participant.h"
#include "cohort/client/partition.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/regression.h"

namespace cohort::client {

std::pair<std::size_t, double> ClientWork::gradient(const GradientStep&) {
  throw ConfigError("server.mode = dataparallel: this client (" + device() +
                    ") trains federated rounds only");
}

namespace {

class StockWork final : public ClientWork {
 public:
  // The device is made here, before joining: "cuda:0" without a GPU or "gpu7" stops the client
  // before it registers; so do files that cannot be read.
  StockWork(const ParticipantOptions& options, const LocalTrainingRegistry& rules)
      : options_(options), rules_(rules) {
    device_ = kernels::make_device(options_.device, {.threads = options_.threads});
    load_data();
  }

  [[nodiscard]] std::size_t num_samples() const override { return indices_.size(); }
  [[nodiscard]] std::string describe() const override { return partition_text_; }
  [[nodiscard]] std::string device() const override { return options_.device; }
  [[nodiscard]] std::string trainer_name() const override {
    return "train.rule '" + options_train_.rule + "'";
  }

  void on_welcome(const WorkModel& model, bool same_model) override {
    if (net_ && same_model) return;
    spec_ = kernels::make_network_spec(model.spec);
    if (spec_.parameter_count() != model.parameter_count) {
      throw ProtocolError("the coordinator's model has " + std::to_string(model.parameter_count) +
                          " parameters, " + model.spec + " has " +
                          std::to_string(spec_.parameter_count()));
    }
    options_train_ = model.train;
    match_data_to_loss();
    // A model that cannot take this client's examples stops it at once, saying both.
    check_model_input(spec_, model.spec, train_, options_.data.describe());
    check_model_output(spec_, model.spec, train_, options_.data.describe());
    net_ = device_->make_network(spec_);
    net_->init(options_.data_seed);
    plan_memory(model.spec);
    trainer_.emplace(*net_, options_train_);  // evaluation
    // The coordinator's train.rule: a rule this client does not have stops it here, naming it.
    rule_ = rules_.make(options_train_.rule, *net_, options_train_);
  }

  std::span<float> parameters() override { return net_->parameters(); }

  WorkResult train(const WorkRound& round) override {
    WorkResult r;
    r.trained = rule_->train({.data = train_,
                              .rows = indices_,
                              .seed = round.seed,
                              .steps = round.local_steps,
                              .round = round.round});
    return r;
  }

  std::optional<EvalResult> evaluate() override { return trainer_->evaluate(test_); }

  std::pair<std::size_t, double> gradient(const GradientStep& s) override {
    const auto rows = s.assigned > 0 ? dataparallel_rows(indices_, s.cursor, s.assigned, s.seed)
                                     : dataparallel_batch(indices_, s.step, s.batch, s.seed);
    x_.resize(rows.size() * train_.feature_dim());
    y_.resize(train_.is_regression() ? 0 : rows.size());
    targets_.resize(rows.size() * train_.target_dim());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const auto row = train_.row(rows[r]);
      std::copy(row.begin(), row.end(), x_.begin() + static_cast<std::ptrdiff_t>(r * row.size()));
      if (train_.is_regression()) {
        const auto t = train_.target_row(rows[r]);
        std::copy(t.begin(), t.end(), targets_.begin() + static_cast<std::ptrdiff_t>(r * t.size()));
      } else {
        y_[r] = train_.labels()[rows[r]];
      }
    }
    const double loss = train_.is_regression() ? kernels::regression_gradients(
                                                     *net_, x_, targets_, rows.size(), &regression_)
                                               : net_->compute_gradients(x_, y_, rows.size());
    if (s.assigned > 0) {  // d(sum of losses) = b x d(mean loss): the gradient becomes a sum
      const auto b = static_cast<float>(rows.size());
      for (float& g : net_->gradients()) g *= b;
    }
    return {rows.size(), loss};
  }

  std::span<const float> gradients() override { return net_->gradients(); }

 private:
  const std::string& name() const { return options_.name; }

  // The loss comes with the coordinator's Welcome, after registering (which says the data's
  // size): the files are read as class labels, or, when their labels are not classes (3.25,
  // shape (N, 2), ...), as regression targets for train.loss = mse. on_welcome() then reads
  // integer targets again as such, or stops with the class-label error.
  void load_data() {
    TrainTest data;
    try {
      data = client::load_data(options_.data);
    } catch (const DataError& e) {
      const auto kind = options_.partition.kind;
      if (options_.data.format == DataFormat::kIdx || kind == PartitionKind::kShards ||
          kind == PartitionKind::kDirichlet) {
        throw;  // no regression reading to fall back on (shards and dirichlet split by class)
      }
      auto as_targets = options_.data;
      as_targets.targets = true;
      try {
        data = client::load_data(as_targets);
      } catch (const Error&) {
        throw e;  // neither: the class-label reading's error, as before
      }
      label_error_ = e.what();
      COHORT_LOG(Info) << name() << ": not class labels (" << label_error_
                       << "): read as regression targets, for train.loss = mse";
    }
    take_data(std::move(data));
  }

  void take_data(TrainTest data) {
    train_ = std::move(data.train);
    test_ = std::move(data.test);
    auto partition =
        make_partition(options_.partition, train_, options_.part_count, options_.data_seed);
    indices_ = std::move(partition[options_.part_index]);
    partition_text_ = options_.partition.to_string() + " " + std::to_string(options_.part_index) +
                      "/" + std::to_string(options_.part_count);
    COHORT_LOG(Info) << name() << ": " << indices_.size() << " training samples ("
                     << partition_text_ << ") of " << options_.data.describe();
  }

  // The data as the coordinator's train.loss reads it (load_data()): class labels, or float
  // targets for mse, each client's rows unchanged (iid and quantity split by size only).
  void match_data_to_loss() {
    const bool mse = options_train_.loss == LossKind::kMse;
    if (mse == train_.is_regression()) return;
    if (!mse) throw DataError(label_error_);  // the coordinator trains classes
    const std::size_t rows = train_.size();
    auto as_targets = options_.data;
    as_targets.targets = true;
    take_data(client::load_data(as_targets));  // IDX: ConfigError
    COHORT_CHECK(train_.size() == rows) << "the training file changed while the client ran";
  }

  // The tighter of client.memory_budget and the coordinator's train.memory_budget; a model that
  // cannot fit throws ConfigError, which stops the client with a fatal report (the coordinator
  // drops it from selection).
  void plan_memory(const std::string& model_name) {
    std::size_t budget = options_.memory_budget;
    if (options_train_.memory_budget > 0 &&
        (budget == 0 || options_train_.memory_budget < budget)) {
      budget = options_train_.memory_budget;
    }
    if (budget == 0) return;
    const auto plan = apply_memory_budget(*net_, *device_, options_train_, budget, model_name);
    COHORT_LOG(Info) << name() << ": memory budget " << budget << " bytes: batch " << plan.batch
                     << " as " << plan.accumulation << " x " << plan.micro_batch
                     << (plan.recompute ? ", recomputing activations" : "") << " (measured peak "
                     << plan.peak_bytes << " bytes, minimum " << plan.minimum_bytes << ")";
  }

  const ParticipantOptions& options_;
  const LocalTrainingRegistry& rules_;
  std::unique_ptr<kernels::Device> device_;
  Dataset train_, test_;
  std::string label_error_;  // why the files were read as regression targets (load_data())
  std::vector<std::uint32_t> indices_;
  std::string partition_text_;
  TrainerOptions options_train_;
  kernels::NetworkSpec spec_;  // outlives net_, which refers to it
  std::unique_ptr<kernels::Network> net_;
  std::optional<LocalTrainer> trainer_;  // evaluates
  std::unique_ptr<LocalTraining> rule_;  // trains: train.rule
  // Data-parallel steps' buffers, reused.
  std::vector<float> x_, targets_;
  std::vector<std::int32_t> y_;
  kernels::RegressionBuffers regression_;
};

}  // namespace

std::unique_ptr<ClientWork> make_stock_work(const ParticipantOptions& options,
                                            const LocalTrainingRegistry& rules) {
  return std::make_unique<StockWork>(options, rules);
}

}  // namespace cohort::client
