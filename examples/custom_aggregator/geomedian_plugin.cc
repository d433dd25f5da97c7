// The rule as a plug-in for the stock binary:
//   cohort-server --plugin libgeomedian_plugin.so --aggregator.name=geometric_median ...
#include "cohort/aggregation/plugin.h"
#include "geometric_median.h"

extern "C" int cohort_plugin_abi() { return cohort::kPluginAbi; }

extern "C" void cohort_register(cohort::Registries& registries) {
  custom::add_geometric_median(registries.aggregators);
}
