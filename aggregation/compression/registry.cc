#include <string>

#include "builtins.h"
#include "cohort/aggregation/compressor.h"

namespace cohort::aggregation {

void CompressorRegistry::add(std::string name, CompressorFactory factory) {
  detail::add_factory(factories_, std::move(name), std::move(factory), "compressor");
}
std::unique_ptr<Compressor> CompressorRegistry::create(std::string_view name,
                                                       const ConfigSection& options) const {
  return detail::create_from(factories_, name, options, "compressor");
}
bool CompressorRegistry::contains(std::string_view name) const { return factories_.contains(name); }
std::string CompressorRegistry::names() const { return detail::joined_names(factories_); }

void add_builtin_compressors(CompressorRegistry& registry) {
  detail::add_cast_compressors(registry);
  detail::add_qsgd_compressor(registry);
  detail::add_sparse_compressors(registry);
  detail::add_sign_compressor(registry);
  detail::add_powersgd_compressor(registry);
}

}  // namespace cohort::aggregation
