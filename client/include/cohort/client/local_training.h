// Local training as a plug-in point: what a client does with the global model and its own data in
// a round. cohort-client (federated mode) and cohort-sim both run the rule that train.rule names;
// the stock one ("stock") is LocalTrainer (trainer.h): epochs or steps of minibatch training with
// the configured optimizer, schedule and FedProx term.
//
// A rule of your own (another optimizer, a proximal or correction term, your own network code)
// derives from LocalTraining, is registered under a name in a LocalTrainingRegistry, and is chosen
// with train.rule = "NAME" or "NAME:ARGUMENT" (the text after the first colon reaches its factory
// as is). Programs load rules from a plug-in (cohort-client --plugin FILE.so, cohort-sim --plugin
// FILE.so) that defines, besides cohort_plugin_abi() (cohort/aggregation/plugin.h):
//
//   extern "C" void cohort_register_client(cohort::client::LocalTrainingRegistry& registry) {
//     registry.add("my_rule", [](cohort::kernels::Network& net,
//                                const cohort::client::TrainerOptions& options,
//                                std::string_view argument) {
//       return std::make_unique<MyRule>(net, options, argument);
//     });
//   }
//
// examples/custom_trainer/ builds one against the installed package. The client computes its
// update from what the rule leaves in the network (trained parameters minus the round's global
// model), so compression, DP clipping and aggregation work unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/client/dataset.h"
#include "cohort/client/trainer.h"
#include "cohort/kernels/network.h"

namespace cohort::client {

// What one round asks of local training.
struct LocalRound {
  const Dataset& data;                  // the client's training examples
  std::span<const std::uint32_t> rows;  // the rows of `data` this client trains on
  // Seeds the round's shuffles (and dropout): derived from the model version and the client, so
  // the same training happens under every server mode and runner.
  std::uint64_t seed = 0;
  // > 0: exactly this many optimizer steps (server.work = deadline sizes each client's work and
  // the virtual clock charges them); 0: as train.epochs / train.steps configure.
  std::size_t steps = 0;
  std::uint64_t round = 0;  // the round id (0 in the simulator's evaluation-only calls)
};

class LocalTraining {
 public:
  virtual ~LocalTraining() = default;
  // Trains the network the factory was given, which holds the round's global model on entry, on
  // round.rows of round.data, and leaves the trained parameters in it. Returns at least the samples
  // processed, the optimizer steps taken (round.steps when it is > 0: the caller checks) and the
  // mean training loss; the memory fields may stay zero. Throws cohort::Error subclasses for bad
  // data (DataError) or kernels failures (KernelError); the client then stops with that message.
  virtual TrainResult train(const LocalRound& round) = 0;
};

// Makes a rule for `network` (not owned; it outlives the rule) with the [train] options the
// coordinator sent (or the simulator's), and `argument`, the text after "NAME:" in train.rule
// (empty without one). Throws ConfigError for a bad argument.
using LocalTrainingFactory = std::function<std::unique_ptr<LocalTraining>(
    kernels::Network& network, const TrainerOptions& options, std::string_view argument)>;

class LocalTrainingRegistry {
 public:
  // ConfigError "local training rule 'NAME' is registered twice" when the name is taken, or when
  // it is empty or holds a colon.
  void add(std::string name, LocalTrainingFactory factory);
  // `rule` is "NAME" or "NAME:ARGUMENT". ConfigError naming the known rules when NAME is not one.
  [[nodiscard]] std::unique_ptr<LocalTraining> make(std::string_view rule,
                                                    kernels::Network& network,
                                                    const TrainerOptions& options) const;
  // ConfigError unless `rule`'s NAME is registered (checked at start-up, before any round).
  void check(std::string_view rule) const;
  [[nodiscard]] std::vector<std::string> names() const;

 private:
  std::map<std::string, LocalTrainingFactory, std::less<>> factories_;
};

// A registry holding "stock" (LocalTrainer; it takes no argument).
LocalTrainingRegistry builtin_local_training();

// Loads the plug-in `file` (a path, as cohort/aggregation/plugin.h's load_plugin), checks its
// cohort_plugin_abi() and calls its cohort_register_client(registry). Throws ConfigError
// "plug-in FILE: ..." when the file cannot be loaded, has no cohort_register_client, was built for
// another ABI, or its registration throws.
void load_client_plugin(const std::filesystem::path& file, LocalTrainingRegistry& registry);

}  // namespace cohort::client

// The client plug-in's entry point (declared here so that a wrong signature fails to compile).
extern "C" {
__attribute__((visibility("default"))) void cohort_register_client(
    cohort::client::LocalTrainingRegistry& registry);
}
