#include "cohort/core/scheduling.h"

#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort {
namespace {

std::atomic<Scheduling> g_io_scheduling{Scheduling::kBatch};

// Whether this system lets a thread switch itself to SCHED_BATCH. A seccomp filter may refuse,
// and ZeroMQ aborts when it cannot apply the policy it was given: so try once, on a throwaway
// thread, before handing it over.
bool batch_allowed() {
  static const bool allowed = [] {
    int err = 0;
    std::thread([&] {
      const sched_param param{};
      if (sched_setscheduler(0, SCHED_BATCH, &param) != 0) err = errno;
    }).join();
    if (err != 0) {
      COHORT_LOG(Warn) << "this system refuses SCHED_BATCH (" << std::strerror(err)
                       << "): I/O threads keep the default policy";
    }
    return err == 0;
  }();
  return allowed;
}

}  // namespace

Scheduling parse_scheduling(std::string_view name) {
  if (name == "batch") return Scheduling::kBatch;
  if (name == "keep") return Scheduling::kKeep;
  throw ConfigError("--sched must be batch or keep, got '" + std::string(name) + "'");
}

std::string to_string(Scheduling s) { return s == Scheduling::kBatch ? "batch" : "keep"; }

void set_io_scheduling(Scheduling s) { g_io_scheduling.store(s); }
Scheduling io_scheduling() { return g_io_scheduling.load(); }

int io_thread_policy(Scheduling s) {
  const int mine = sched_getscheduler(0);
  return s == Scheduling::kBatch && mine == SCHED_OTHER && batch_allowed() ? SCHED_BATCH : mine;
}

}  // namespace cohort
