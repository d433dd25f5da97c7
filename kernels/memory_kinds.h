// The trackers a network's buffers count into (Network::memory()): one per kind, each counting
// into a total whose high-water mark is the peak of their sum and whose limit refuses the
// allocation that would pass it. Shared by the CPU and CUDA networks. Private to kernels/.
#pragma once

#include <cstddef>

#include "cohort/core/buffer.h"
#include "cohort/kernels/network.h"

namespace cohort::kernels::detail {

struct MemoryKinds {
  MemoryTracker total;
  MemoryTracker parameters{&total};
  MemoryTracker gradients{&total};
  MemoryTracker optimizer{&total};
  MemoryTracker activations{&total};
  MemoryTracker workspace{&total};

  [[nodiscard]] MemoryReport report() const {
    const auto use = [&](auto&& f) {
      return MemoryUse{.parameters = f(parameters),
                       .gradients = f(gradients),
                       .optimizer = f(optimizer),
                       .activations = f(activations),
                       .workspace = f(workspace),
                       .total = f(total)};
    };
    return {.tracked = true,
            .current = use([](const MemoryTracker& t) { return t.current(); }),
            .peak = use([](const MemoryTracker& t) { return t.peak(); })};
  }
  void reset_peak() {
    for (MemoryTracker* t :
         {&parameters, &gradients, &optimizer, &activations, &workspace, &total}) {
      t->reset_peak();
    }
  }
  void set_limit(std::size_t bytes) { total.set_limit(bytes); }
};

}  // namespace cohort::kernels::detail
