// The seeded generator client/ draws from (partitions, shuffles, synthetic data, simulated
// clocks) is cohort::Rng in core (cohort/core/random.h, which documents its algorithms). This
// header keeps the old name cohort::client::Rng for code that still includes it; new code includes
// "cohort/core/random.h".
#pragma once

#include "cohort/core/random.h"

namespace cohort::client {

using Rng = cohort::Rng;

}  // namespace cohort::client
