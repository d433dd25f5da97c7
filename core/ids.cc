#include "cohort/core/ids.h"

#include "cohort/core/error.h"

namespace cohort {

bool is_valid_node_id(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void validate_node_id(std::string_view id) {
  if (!is_valid_node_id(id)) {
    throw ConfigError("invalid node id '" + std::string(id.substr(0, 80)) +
                      "': use 1-64 characters from A-Z a-z 0-9 . _ -");
  }
}

}  // namespace cohort
