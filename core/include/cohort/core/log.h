// Logging: COHORT_LOG(Info) << "text " << kv("key", value); writes one stderr line with time,
// level, file:line and the message. The sink is the only process-wide object Cohort allows;
// main() configures it (set_log_level), libraries never do. Never log secrets or model data.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace cohort {

enum class LogLevel { Trace, Debug, Info, Warn, Error, Off };

// Parses "trace|debug|info|warn|error|off"; throws ConfigError otherwise.
LogLevel parse_log_level(std::string_view name);
void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);

namespace detail {
// Streams one log line and emits it from its destructor. Thread-safe (spdlog's stderr sink).
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace cohort

#define COHORT_LOG(level)                                  \
  if (!::cohort::log_enabled(::cohort::LogLevel::level)) { \
  } else                                                   \
    ::cohort::detail::LogLine(::cohort::LogLevel::level, __FILE__, __LINE__)
