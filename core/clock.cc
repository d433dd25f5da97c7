#include "cohort/core/clock.h"

namespace cohort {

const Clock& steady_clock() {
  static const SteadyClock clock;
  return clock;
}

double seconds_since(TimePoint start, const Clock& clock) {
  return std::chrono::duration<double>(clock.now() - start).count();
}

}  // namespace cohort
