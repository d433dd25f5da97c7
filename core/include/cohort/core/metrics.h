// A metrics sink: one JSON object per line, appended to a file (metrics.jsonl). Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cohort {

using MetricValue = std::variant<bool, std::int64_t, std::uint64_t, double, std::string>;
using MetricField = std::pair<std::string, MetricValue>;

// A record's field by name, or nullptr.
const MetricValue* find_field(const std::vector<MetricField>& fields, std::string_view name);
// A numeric field's value as a double; nullopt for a string.
std::optional<double> numeric(const MetricValue& value);

// Sees every record a sink is given, in order (TensorBoard files, the HTTP endpoint's store).
using MetricsObserver =
    std::function<void(std::string_view event, const std::vector<MetricField>& fields)>;

class MetricsSink {
 public:
  // Opens (truncates) `path`; throws ConfigError if it cannot be written. An empty path discards.
  explicit MetricsSink(const std::filesystem::path& path);
  // Adds an observer that sees every record from now on, whether or not a file is written; it is
  // called under the sink's lock, in the order the records are written. Set up before the sink
  // is shared with other threads.
  void observe(MetricsObserver observer);
  // Writes {"event": event, fields...} as one line and flushes it.
  void write(std::string_view event, std::initializer_list<MetricField> fields);
  void write(std::string_view event, const std::vector<MetricField>& fields);
  // Encodes the record without writing it (also used for JSON lines on stdout).
  static std::string encode(std::string_view event, const std::vector<MetricField>& fields);

 private:
  std::mutex mu_;  // guards out_ and the observers' calls
  std::ofstream out_;
  std::vector<MetricsObserver> observers_;
  bool enabled_ = false;
};

}  // namespace cohort
