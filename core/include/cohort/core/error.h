// Cohort's one error policy (docs/STYLE.md section 3).
//
// A failure that stops the current operation throws a subclass of cohort::Error. An outcome the
// caller handles routinely (a rejected update, a missing quorum, a lookup miss) is a return value.
// Foreign errors (ZeroMQ, OpenSSL, Cap'n Proto, CUDA) are converted at the seam that calls them.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace cohort {

// Base of every exception Cohort throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration key or value, a missing file named by the configuration, a bad flag.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A malformed, oversized, out-of-range or incompatible message from a peer.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// A socket, connection or security failure (ZeroMQ or OpenSSL).
class TransportError : public Error {
 public:
  using Error::Error;
};

// A transport operation ran past its deadline.
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
};

// A compute kernel failed (CUDA errors, impossible shapes).
class KernelError : public Error {
 public:
  using Error::Error;
};

// A broken invariant inside Cohort: a bug, never bad input. Thrown by COHORT_CHECK.
class InternalError : public Error {
 public:
  using Error::Error;
};

// A data file (dataset, checkpoint) is missing, truncated or corrupt.
class DataError : public Error {
 public:
  using Error::Error;
};

// Training cannot go on (every round fails to commit, e.g. the clients' updates diverged to
// non-finite values): stop with this rather than retry forever.
class TrainingError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_check_failure(const char* expr, const char* file, int line,
                                      const std::string& message);
}  // namespace detail

}  // namespace cohort

// COHORT_CHECK(cond) << "context"; throws InternalError naming the condition, file and line.
#define COHORT_CHECK(cond) \
  if (cond) {              \
  } else                   \
    ::cohort::detail::CheckMessage(#cond, __FILE__, __LINE__)

namespace cohort::detail {
// Collects the streamed context of a failed COHORT_CHECK and throws from its destructor.
class CheckMessage {
 public:
  CheckMessage(const char* expr, const char* file, int line)
      : expr_(expr), file_(file), line_(line) {}
  CheckMessage(const CheckMessage&) = delete;
  CheckMessage& operator=(const CheckMessage&) = delete;
  [[noreturn]] ~CheckMessage() noexcept(false) {
    throw_check_failure(expr_, file_, line_, stream_.str());
  }
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  const char* expr_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
}  // namespace cohort::detail
