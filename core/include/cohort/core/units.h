// Sizes as people read them, for progress lines and logs (metrics files keep raw numbers).
#pragma once

#include <string>

namespace cohort {

// "1.23 GB", "4.5 MB" or "12 kB" (powers of 1000).
std::string human_bytes(double bytes);

}  // namespace cohort
