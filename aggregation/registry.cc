#include "cohort/aggregation/registries.h"

namespace cohort {

Registries builtin_registries() {
  Registries r;
  aggregation::add_builtin_aggregators(r.aggregators);
  aggregation::add_builtin_server_optimizers(r.server_optimizers);
  aggregation::add_builtin_compressors(r.compressors);
  aggregation::add_builtin_client_selectors(r.client_selectors);
  return r;
}

}  // namespace cohort
