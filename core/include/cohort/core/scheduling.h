// How Linux schedules the I/O threads Cohort starts (ZeroMQ's, one per transport::Context).
//
// An I/O thread wakes up several times per 1 MiB chunk of a bulk transfer (socket readiness,
// ZeroMQ's mailboxes) and works a few microseconds each time. Under the default policy each wake-up
// preempts the thread running on that core, most often the one sealing, opening or applying
// chunks, and evicts its cache. Under SCHED_BATCH a woken I/O thread takes an idle core at once,
// or waits for the running thread's slice (milliseconds; heartbeats and deadlines are in seconds).
// bench/ps measures the gain (docs/PERFORMANCE.md 3.5); making every thread SCHED_BATCH gained no
// more, so compute threads keep the default.
#pragma once

#include <string>
#include <string_view>

namespace cohort {

enum class Scheduling {
  kBatch,  // I/O threads under SCHED_BATCH, where their creator runs under SCHED_OTHER
  kKeep,   // I/O threads under their creator's policy
};

// "batch" or "keep"; ConfigError otherwise.
Scheduling parse_scheduling(std::string_view name);
std::string to_string(Scheduling s);

// The process-wide choice (default kBatch), set from --sched and read by transport::Context when
// it starts its I/O threads: set it before creating a Context.
void set_io_scheduling(Scheduling s);
Scheduling io_scheduling();

// The policy (SCHED_*) an I/O thread started now by the calling thread gets under `s`: SCHED_BATCH
// where `s` is kBatch and the caller runs under SCHED_OTHER, else the caller's own, so a policy
// the launcher chose (chrt: SCHED_IDLE, real-time) is kept. Where the system refuses SCHED_BATCH
// (tried once per process), the caller's own, with one warning.
int io_thread_policy(Scheduling s);

}  // namespace cohort
