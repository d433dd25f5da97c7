#include "cohort/transport/security/replay_window.h"

namespace cohort::transport::security {

namespace {
constexpr std::uint64_t kBit = 1;
}  // namespace

bool ReplayWindow::accept(std::uint64_t counter) {
  auto word = [&](std::uint64_t c) -> std::uint64_t& { return seen_[(c / 64) % kWords]; };
  auto mask = [](std::uint64_t c) { return kBit << (c % 64); };
  if (!started_) {
    started_ = true;
    highest_ = counter;
    word(counter) |= mask(counter);
    return true;
  }
  if (counter > highest_) {
    // Slide: the slots of counters highest_+1 .. counter held counters that now fall out of the
    // window. In-order traffic clears one bit; a jump of a window or more clears everything.
    const std::uint64_t advance = counter - highest_;
    if (advance >= kWindowSize) {
      seen_.fill(0);
    } else {
      for (std::uint64_t c = highest_ + 1; c <= counter; ++c) word(c) &= ~mask(c);
    }
    highest_ = counter;
    word(counter) |= mask(counter);
    return true;
  }
  if (highest_ - counter >= kWindowSize) return false;  // too old to tell
  std::uint64_t& w = word(counter);
  if (w & mask(counter)) return false;  // replay
  w |= mask(counter);
  return true;
}

}  // namespace cohort::transport::security
