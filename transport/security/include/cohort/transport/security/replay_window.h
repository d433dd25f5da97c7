// Anti-replay for sealed frames: a sliding window over 64-bit counters (as in IPsec and DTLS).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace cohort::transport::security {

// Remembers which of the last kWindowSize counters below the highest one accepted were seen.
// The first counter accepted may be any value. Not thread-safe; never throws.
class ReplayWindow {
 public:
  static constexpr std::size_t kWindowSize = 1024;

  // True if `counter` was not seen and is within kWindowSize of the highest accepted counter (or
  // above it, which slides the window); marks it seen. False for a replay or a counter too old.
  // Call ONLY after the frame authenticated, so forged counters cannot move the window.
  [[nodiscard]] bool accept(std::uint64_t counter);

  // Highest counter accepted so far; 0 before the first accept.
  std::uint64_t highest() const { return highest_; }

 private:
  static constexpr std::size_t kWords = kWindowSize / 64;
  // Bit (c % kWindowSize) is set iff counter c, highest_ - kWindowSize < c <= highest_, was seen.
  std::array<std::uint64_t, kWords> seen_{};
  std::uint64_t highest_ = 0;
  bool started_ = false;
};

}  // namespace cohort::transport::security
