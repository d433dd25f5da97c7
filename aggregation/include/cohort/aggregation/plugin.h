// Plug-ins: a shared object that the stock binaries load (cohort-server --plugin FILE) to add
// rules to the registries without rebuilding Cohort. This is the only dlopen seam (docs/STYLE.md,
// section 2).
//
// A plug-in is a shared library (CMake: add_library(my_rule MODULE my_rule.cc) linking
// Cohort::aggregation) that defines exactly these two functions, declared below:
//
//   #include "cohort/aggregation/plugin.h"
//   extern "C" int cohort_plugin_abi() { return cohort::kPluginAbi; }
//   extern "C" void cohort_register(cohort::Registries& registries) {
//     registries.aggregators.add("my_rule", [](const cohort::ConfigSection& options) {
//       return std::make_unique<MyRule>(options);
//     });
//   }
//
// cohort_plugin_abi() must return the kPluginAbi of the headers the plug-in was compiled against;
// the loader refuses any other value, because the registries and the interface classes cross the
// boundary as C++ objects. cohort_register() may add to any registry; adding a name that is
// already taken throws ConfigError, which the loader reports with the file's name. A config then
// selects the rule by name (--aggregator.name=my_rule) like a built-in.
//
// A plug-in must be built with the same compiler family and standard library as the binary that
// loads it (g++ / libstdc++ on Debian 12), against the installed package of the same version.
// cohort-server loads cohort_register(); cohort-client and cohort-sim load a plug-in's
// cohort_register_client() (local training rules, cohort/client/local_training.h). A compressor
// a plug-in adds is known to the server side only, so clients need a program of their own that
// registers it too.
#pragma once

#include <filesystem>

#include "cohort/aggregation/registries.h"

namespace cohort {

// The plug-in ABI: bumped whenever a class reachable from Registries (the registries, the
// Aggregator, ServerOptimizer, Compressor and ClientSelector interfaces, ConfigSection) changes
// its layout or virtual functions, and whenever one reachable from a client plug-in's
// LocalTrainingRegistry does (LocalTraining, TrainerOptions, Dataset, kernels::Network).
// 2: ServerOptimizer's piecewise stepping.
inline constexpr int kPluginAbi = 2;

// Loads the shared object `file`, checks cohort_plugin_abi() == kPluginAbi and calls
// cohort_register(registries). `file` is a path (relative to the working directory), never a
// library search name. Throws ConfigError "plug-in FILE: ..." when the file is missing or not
// loadable (with the loader's dlerror() text), an entry symbol is missing, the ABI differs, or
// cohort_register() throws (e.g. a rule name that is already registered). The library stays
// loaded until the process exits: the factories it added are code inside it.
// Not thread-safe with respect to `registries`.
void load_plugin(const std::filesystem::path& file, Registries& registries);

// What every loader shares: loads `file` as load_plugin() does, checks its ABI, and returns the
// address of its extern "C" symbol `entry`; ConfigError "plug-in FILE: no entry symbol ENTRY
// (HOW)" when it has none.
void* plugin_entry(const std::filesystem::path& file, const char* entry, const char* how);

}  // namespace cohort

// The entry points a plug-in defines (declared here so that a wrong signature fails to compile).
extern "C" {
__attribute__((visibility("default"))) int cohort_plugin_abi();
__attribute__((visibility("default"))) void cohort_register(cohort::Registries& registries);
}
