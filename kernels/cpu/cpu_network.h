// The CPU implementation of Network (network.h), built on the kernels in layers.h and
// nhwc_conv.h (stride-1 convolutions run channels-last; the network converts layouts).
#pragma once

#include <memory>

#include "cohort/kernels/network.h"

namespace cohort {
class ThreadPool;
}  // namespace cohort

namespace cohort::kernels::cpu {

// pool: the device's worker threads, or nullptr to run on the calling thread. Not owned; must
// outlive the network.
std::unique_ptr<Network> make_cpu_network(const NetworkSpec& spec, ThreadPool* pool);

}  // namespace cohort::kernels::cpu
