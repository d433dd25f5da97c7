#include "cohort/server/population.h"

#include <cstdio>

namespace cohort::server {

std::uint32_t VirtualPopulation::width_for(std::uint64_t count) {
  std::uint32_t digits = 1;
  for (std::uint64_t v = count > 0 ? count - 1 : 0; v >= 10; v /= 10) ++digits;
  return digits < 5 ? 5 : digits;
}

std::string VirtualPopulation::name(std::uint32_t index) const {
  char out[32];
  std::snprintf(out, sizeof out, "c%0*u", static_cast<int>(width), static_cast<unsigned>(index));
  return out;
}

std::optional<std::uint32_t> VirtualPopulation::index_of(std::string_view name) const {
  if (name.size() != std::size_t{width} + 1 || name[0] != 'c') return std::nullopt;
  std::uint64_t v = 0;
  for (std::size_t i = 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(name[i] - '0');
  }
  if (v >= count) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

}  // namespace cohort::server
