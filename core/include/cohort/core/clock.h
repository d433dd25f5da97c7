// Monotonic time, injectable so that tests and the simulator can fake it (LevelDB's Env idea).
#pragma once

#include <atomic>
#include <chrono>

namespace cohort {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::steady_clock::time_point;

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  [[nodiscard]] virtual TimePoint now() const = 0;
};

// The real monotonic clock (std::chrono::steady_clock).
class SteadyClock final : public Clock {
 public:
  [[nodiscard]] TimePoint now() const override { return std::chrono::steady_clock::now(); }
};

// The process-wide steady clock, for code that is handed no other.
const Clock& steady_clock();

// A clock that moves only when told; starts at the epoch of steady_clock.
class ManualClock final : public Clock {
 public:
  [[nodiscard]] TimePoint now() const override { return TimePoint(Duration(ns_.load())); }
  void advance(Duration d) { ns_.fetch_add(d.count()); }

 private:
  std::atomic<Duration::rep> ns_{0};
};

// Seconds since an arbitrary start, as a double, for logs and metrics.
double seconds_since(TimePoint start, const Clock& clock = steady_clock());

}  // namespace cohort
