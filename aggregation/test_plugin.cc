// Test plug-ins for plugin_test.cc and server/plugin_test.cc, one MODULE library per variant
// (COHORT_TEST_PLUGIN_VARIANT): a good one adding the rule "test_plugin_mean", one reporting a
// wrong ABI, one without cohort_plugin_abi, one without cohort_register, one whose rule name
// clashes with the built-in "median", and one that needs a symbol nobody defines. The good one also
// adds "test_plugin_refuses_odd", which refuses to aggregate a range of odd length: on a model
// whose ranges differ in parity, one shard's rule refuses a round the other's accepts.
#include <memory>
#include <string_view>

#include "cohort/aggregation/buffered_aggregator.h"
#include "cohort/aggregation/plugin.h"

#define COHORT_TEST_PLUGIN_GOOD 1
#define COHORT_TEST_PLUGIN_WRONG_ABI 2
#define COHORT_TEST_PLUGIN_NO_ABI 3
#define COHORT_TEST_PLUGIN_NO_REGISTER 4
#define COHORT_TEST_PLUGIN_CLASH 5
#define COHORT_TEST_PLUGIN_UNRESOLVED 6

namespace {

// Unweighted mean of the complete updates.
class TestPluginMean : public cohort::aggregation::BufferedAggregator {
 protected:
  bool combine(std::span<const std::span<const float>> updates,
               std::span<const cohort::ClientId> /*clients*/, std::span<const double> /*weights*/,
               std::span<float> out) override {
    for (std::size_t j = 0; j < out.size(); ++j) {
      double sum = 0;
      for (const auto& u : updates) sum += u[j];
      out[j] = static_cast<float>(sum / static_cast<double>(updates.size()));
    }
    return true;
  }
};

// The mean, except on a range of odd length, where it refuses every round.
class TestPluginRefusesOdd : public TestPluginMean {
 protected:
  bool combine(std::span<const std::span<const float>> updates, std::span<const cohort::ClientId> clients,
               std::span<const double> weights, std::span<float> out) override {
    if (out.size() % 2 == 1) return false;
    return TestPluginMean::combine(updates, clients, weights, out);
  }
};

}  // namespace

#if COHORT_TEST_PLUGIN_VARIANT == COHORT_TEST_PLUGIN_UNRESOLVED
extern "C" int cohort_test_symbol_nobody_defines();
#endif

#if COHORT_TEST_PLUGIN_VARIANT != COHORT_TEST_PLUGIN_NO_ABI
extern "C" int cohort_plugin_abi() {
#if COHORT_TEST_PLUGIN_VARIANT == COHORT_TEST_PLUGIN_WRONG_ABI
  return cohort::kPluginAbi + 998;
#elif COHORT_TEST_PLUGIN_VARIANT == COHORT_TEST_PLUGIN_UNRESOLVED
  return cohort_test_symbol_nobody_defines();
#else
  return cohort::kPluginAbi;
#endif
}
#endif

#if COHORT_TEST_PLUGIN_VARIANT != COHORT_TEST_PLUGIN_NO_REGISTER
extern "C" void cohort_register(cohort::Registries& registries) {
#if COHORT_TEST_PLUGIN_VARIANT == COHORT_TEST_PLUGIN_CLASH
  const char* name = "median";
#else
  const char* name = "test_plugin_mean";
#endif
  registries.aggregators.add(name, [](const cohort::ConfigSection& options) {
    const std::string_view known[] = {"name"};
    options.require_known(known);
    return std::make_unique<TestPluginMean>();
  });
#if COHORT_TEST_PLUGIN_VARIANT == COHORT_TEST_PLUGIN_GOOD
  registries.aggregators.add("test_plugin_refuses_odd", [](const cohort::ConfigSection& options) {
    const std::string_view known[] = {"name"};
    options.require_known(known);
    return std::make_unique<TestPluginRefusesOdd>();
  });
#endif
}
#endif
