// The plug-in: cohort-client --plugin libclipped_sgd_plugin.so (and cohort-sim --plugin ...)
// adds "clipped_sgd", which train.rule = "clipped_sgd:MAX_NORM" picks.
#include <memory>

#include "clipped_sgd.h"
#include "cohort/aggregation/plugin.h"
#include "cohort/client/local_training.h"

extern "C" int cohort_plugin_abi() { return cohort::kPluginAbi; }

extern "C" void cohort_register_client(cohort::client::LocalTrainingRegistry& registry) {
  registry.add("clipped_sgd",
               [](cohort::kernels::Network& network, const cohort::client::TrainerOptions& options,
                  std::string_view argument) {
                 return std::make_unique<example::ClippedSgd>(network, options,
                                                              example::parse_max_norm(argument));
               });
}
