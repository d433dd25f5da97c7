// Size checks shared by the kernels: a mismatch is bad input, reported as KernelError.
#pragma once

#include <cstddef>
#include <sstream>
#include <string>

#include "cohort/core/error.h"

namespace cohort::kernels::detail {

[[noreturn]] inline void throw_size_mismatch(const char* what, std::size_t got, std::size_t want) {
  std::ostringstream out;
  out << what << ": size " << got << " does not match " << want;
  throw KernelError(out.str());
}

inline void check_size(const char* what, std::size_t got, std::size_t want) {
  if (got != want) throw_size_mismatch(what, got, want);
}

}  // namespace cohort::kernels::detail
