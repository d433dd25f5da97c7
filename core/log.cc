#include "cohort/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>

#include "cohort/core/error.h"

namespace cohort {
namespace {

std::atomic<LogLevel> g_level{LogLevel::Info};

spdlog::logger& sink() {
  // The process-wide sink: stderr, one line per record, safe to call from any thread.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("cohort");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ %v");
    l->set_level(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::Trace: return spdlog::level::trace;
    case LogLevel::Debug: return spdlog::level::debug;
    case LogLevel::Info: return spdlog::level::info;
    case LogLevel::Warn: return spdlog::level::warn;
    case LogLevel::Error: return spdlog::level::err;
    case LogLevel::Off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  if (name == "trace") return LogLevel::Trace;
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  throw ConfigError("unknown log level '" + std::string(name) +
                    "' (expected trace, debug, info, warn, error or off)");
}

void set_log_level(LogLevel level) { g_level.store(level, std::memory_order_relaxed); }
LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }
bool log_enabled(LogLevel level) {
  return level >= g_level.load(std::memory_order_relaxed) && level != LogLevel::Off;
}

namespace detail {
LogLine::~LogLine() {
  const char* base = std::strrchr(file_, '/');
  sink().log(to_spdlog(level_), "{}:{} {}", base ? base + 1 : file_, line_, stream_.str());
}
}  // namespace detail

}  // namespace cohort
