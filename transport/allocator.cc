#include "cohort/transport/allocator.h"

#include <cstdlib>  // first: defines __GLIBC__ (through <features.h>) on glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace cohort::transport {

void tune_allocator_for_large_messages() {
#if defined(__GLIBC__)
  constexpr int kRetainedFreeBytes = 64 << 20;
  constexpr int kMmapThresholdBytes = 32 << 20;
  (void)mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  (void)mallopt(M_TRIM_THRESHOLD, kRetainedFreeBytes);
#endif
}

}  // namespace cohort::transport
