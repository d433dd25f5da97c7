// A metrics sink: one JSON object per line, appended to a file (metrics.jsonl). Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cohort {

using MetricValue = std::variant<bool, std::int64_t, std::uint64_t, double, std::string>;
using MetricField = std::pair<std::string, MetricValue>;

class MetricsSink {
 public:
  // Opens (truncates) `path`; throws ConfigError if it cannot be written. An empty path discards.
  explicit MetricsSink(const std::filesystem::path& path);
  // Writes {"event": event, fields...} as one line and flushes it.
  void write(std::string_view event, std::initializer_list<MetricField> fields);
  void write(std::string_view event, const std::vector<MetricField>& fields);
  // Encodes the record without writing it (also used for JSON lines on stdout).
  static std::string encode(std::string_view event, const std::vector<MetricField>& fields);

 private:
  std::mutex mu_;  // guards out_
  std::ofstream out_;
  bool enabled_ = false;
};

}  // namespace cohort
