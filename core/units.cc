#include "cohort/core/units.h"

#include <cstdio>

namespace cohort {

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  return buf;
}

}  // namespace cohort
