// Process-wide memory allocator tuning for programs that move large messages through Endpoints.
//
// ZeroMQ mallocs each received frame larger than its 8 KiB batch (every bulk chunk) on its I/O
// thread, and we free it on ours. With glibc's defaults the arena's free top goes back to the
// kernel (MADV_DONTNEED) as soon as it exceeds twice the largest recent block, so later frames
// fault their pages in again: on large transfers those faults took about half of the receiver's
// I/O-thread time, and the tuning is a clear gain in plaintext and under TLS (docs/PERFORMANCE.md
// 3.1).
//
// It changes malloc for the whole process, not just the transport, so the library never does it
// on its own: a program opts in, once, at the top of main() (cohort-server, cohort-client,
// cohort-sim, the benchmarks and the demo do).
#pragma once

namespace cohort::transport {

// Keeps up to 64 MiB of free memory at the top of each malloc arena instead of returning it to the
// kernel, and serves blocks up to 32 MiB (glibc's maximum) from the arenas instead of fresh mmaps
// (M_TRIM_THRESHOLD and M_MMAP_THRESHOLD; setting either turns off glibc's dynamic thresholds,
// hence both). Costs up to that much idle memory per arena. Call it before any thread starts;
// calling it again is harmless. Does nothing where the C library is not glibc.
void tune_allocator_for_large_messages();

}  // namespace cohort::transport
