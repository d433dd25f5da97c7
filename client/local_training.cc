#include "cohort/client/local_training.h"

#include <exception>
#include <utility>

#include "cohort/aggregation/plugin.h"
#include "cohort/core/error.h"

namespace cohort::client {
namespace {

// The stock rule: LocalTrainer, as cohort-client and cohort-sim always ran it.
class StockTraining final : public LocalTraining {
 public:
  StockTraining(kernels::Network& network, const TrainerOptions& options)
      : trainer_(network, options) {}
  TrainResult train(const LocalRound& round) override {
    return trainer_.train(round.data, round.rows, round.seed, 0, round.steps);
  }

 private:
  LocalTrainer trainer_;
};

std::pair<std::string_view, std::string_view> split_rule(std::string_view rule) {
  const auto colon = rule.find(':');
  if (colon == std::string_view::npos) return {rule, {}};
  return {rule.substr(0, colon), rule.substr(colon + 1)};
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

using RegisterClientFn = void (*)(LocalTrainingRegistry&);

}  // namespace

void LocalTrainingRegistry::add(std::string name, LocalTrainingFactory factory) {
  if (name.empty() || name.find(':') != std::string::npos) {
    throw ConfigError("local training rule name '" + name + "' must be non-empty, without ':'");
  }
  if (factories_.contains(name)) {
    throw ConfigError("local training rule '" + name + "' is registered twice");
  }
  factories_.emplace(std::move(name), std::move(factory));
}

void LocalTrainingRegistry::check(std::string_view rule) const {
  const auto name = split_rule(rule).first;
  if (!factories_.contains(name)) {
    throw ConfigError("unknown local training rule '" + std::string(name) +
                      "' in train.rule (known: " + joined(names()) +
                      "; a plug-in adds rules: --plugin FILE.so)");
  }
}

std::unique_ptr<LocalTraining> LocalTrainingRegistry::make(std::string_view rule,
                                                           kernels::Network& network,
                                                           const TrainerOptions& options) const {
  check(rule);
  const auto [name, argument] = split_rule(rule);
  auto made = factories_.find(name)->second(network, options, argument);
  if (!made) throw ConfigError("local training rule '" + std::string(name) + "' made nothing");
  return made;
}

std::vector<std::string> LocalTrainingRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : factories_) out.push_back(name);
  return out;
}

LocalTrainingRegistry builtin_local_training() {
  LocalTrainingRegistry r;
  r.add("stock",
        [](kernels::Network& network, const TrainerOptions& options,
           std::string_view argument) -> std::unique_ptr<LocalTraining> {
          if (!argument.empty()) {
            throw ConfigError("train.rule 'stock' takes no argument, got '" +
                              std::string(argument) + "'");
          }
          return std::make_unique<StockTraining>(network, options);
        });
  return r;
}

void load_client_plugin(const std::filesystem::path& file, LocalTrainingRegistry& registry) {
  auto* register_fn = reinterpret_cast<RegisterClientFn>(
      plugin_entry(file, "cohort_register_client",
                   "a client plug-in defines extern \"C\" void "
                   "cohort_register_client(cohort::client::LocalTrainingRegistry&); see "
                   "cohort/client/local_training.h"));
  try {
    register_fn(registry);
  } catch (const std::exception& e) {
    throw ConfigError("plug-in " + file.string() + ": " + e.what());
  }
}

}  // namespace cohort::client
