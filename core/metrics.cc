#include "cohort/core/metrics.h"

#include <nlohmann/json.hpp>

#include "cohort/core/error.h"

namespace cohort {

const MetricValue* find_field(const std::vector<MetricField>& fields, std::string_view name) {
  for (const auto& [k, v] : fields) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::optional<double> numeric(const MetricValue& value) {
  return std::visit(
      [](const auto& x) -> std::optional<double> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return std::nullopt;
        } else {
          return static_cast<double>(x);
        }
      },
      value);
}

MetricsSink::MetricsSink(const std::filesystem::path& path) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | std::ios::trunc);
  if (!out_) throw ConfigError("cannot write metrics file " + path.string());
  enabled_ = true;
}

std::string MetricsSink::encode(std::string_view event, const std::vector<MetricField>& fields) {
  nlohmann::ordered_json j;
  j["event"] = event;
  for (const auto& [k, v] : fields) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    std::visit([&](const auto& x) { j[key] = x; }, v);
  }
  return j.dump();
}

void MetricsSink::write(std::string_view event, std::initializer_list<MetricField> fields) {
  write(event, std::vector<MetricField>(fields));
}

void MetricsSink::observe(MetricsObserver observer) {
  std::lock_guard lock(mu_);
  observers_.push_back(std::move(observer));
}

void MetricsSink::write(std::string_view event, const std::vector<MetricField>& fields) {
  if (!enabled_ && observers_.empty()) return;
  std::string line;
  if (enabled_) line = encode(event, fields);
  std::lock_guard lock(mu_);
  if (enabled_) {
    out_ << line << '\n';
    out_.flush();
  }
  for (const auto& o : observers_) o(event, fields);
}

}  // namespace cohort
