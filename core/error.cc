#include "cohort/core/error.h"

#include <cstring>

namespace cohort::detail {

void throw_check_failure(const char* expr, const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  std::string text = std::string("check failed: ") + expr + " at " + (base ? base + 1 : file) +
                     ":" + std::to_string(line);
  if (!message.empty()) text += ": " + message;
  throw InternalError(text);
}

}  // namespace cohort::detail
