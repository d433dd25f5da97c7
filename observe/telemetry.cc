#include "cohort/observe/telemetry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace cohort::observe {
namespace {

// A sample value as the exposition format writes it: integers without a fraction, NaN, +Inf.
void append_value(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else if (v == std::floor(v) && std::fabs(v) < 1e15) {
    out += std::to_string(static_cast<long long>(v));
  } else {
    char buf[32];  // the shortest text that reads back as v
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  }
}

void append_sample(std::string& out, std::string_view name, std::string_view labels, double v) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  append_value(out, v);
  out += '\n';
}

// HELP text escapes backslash and newline.
std::string escape_help(std::string_view s) {
  std::string r;
  for (char c : s) {
    if (c == '\\') {
      r += "\\\\";
    } else if (c == '\n') {
      r += "\\n";
    } else {
      r += c;
    }
  }
  return r;
}

const char* type_name(Kind k) {
  switch (k) {
    case Kind::kCounter: return "counter";
    case Kind::kHistogram: return "histogram";
    case Kind::kGauge: break;
  }
  return "gauge";
}

}  // namespace

std::string label(std::string_view key, std::string_view value) {
  std::string r(key);
  r += "=\"";
  for (char c : value) {
    if (c == '\\') {
      r += "\\\\";
    } else if (c == '"') {
      r += "\\\"";
    } else if (c == '\n') {
      r += "\\n";
    } else {
      r += c;
    }
  }
  r += '"';
  return r;
}

std::string labels(std::string_view k1, std::string_view v1, std::string_view k2,
                   std::string_view v2) {
  return label(k1, v1) + "," + label(k2, v2);
}

void Telemetry::describe(const std::string& name, Kind kind, std::string help,
                         std::vector<double> buckets) {
  std::lock_guard lock(mu_);
  if (families_.contains(name)) throw std::logic_error("metric family described twice: " + name);
  Family f;
  f.kind = kind;
  f.help = std::move(help);
  if (kind == Kind::kHistogram) {
    std::sort(buckets.begin(), buckets.end());
    f.buckets = std::move(buckets);
    f.counts.assign(f.buckets.size() + 1, 0);
  }
  families_.emplace(name, std::move(f));
  order_.push_back(name);
}

Telemetry::Family& Telemetry::family(const std::string& name, bool histogram) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::logic_error("undescribed metric family: " + name);
  if ((it->second.kind == Kind::kHistogram) != histogram) {
    throw std::logic_error("metric family used as the wrong type: " + name);
  }
  return it->second;
}

void Telemetry::set(const std::string& name, const std::string& labels, double value) {
  std::lock_guard lock(mu_);
  family(name, false).values[labels] = value;
}

void Telemetry::add(const std::string& name, const std::string& labels, double delta) {
  std::lock_guard lock(mu_);
  family(name, false).values[labels] += delta;
}

void Telemetry::observe(const std::string& name, double value) {
  std::lock_guard lock(mu_);
  Family& f = family(name, true);
  const auto b = std::lower_bound(f.buckets.begin(), f.buckets.end(), value) - f.buckets.begin();
  ++f.counts[static_cast<std::size_t>(b)];
  f.sum += value;
  ++f.count;
}

std::vector<Sample> Telemetry::samples() const {
  std::lock_guard lock(mu_);
  std::vector<Sample> out;
  for (const auto& name : order_) {
    const Family& f = families_.at(name);
    for (const auto& [l, v] : f.values) out.push_back({name, l, v});
  }
  return out;
}

void Telemetry::set_remote(std::uint32_t shard, std::vector<Sample> samples) {
  std::lock_guard lock(mu_);
  std::erase_if(samples, [&](const Sample& s) {
    auto it = families_.find(s.name);
    return it == families_.end() || it->second.kind == Kind::kHistogram;
  });
  remote_[shard] = std::move(samples);
}

std::string Telemetry::prometheus() const {
  std::lock_guard lock(mu_);
  std::string out;
  out.reserve(4096);
  for (const auto& name : order_) {
    const Family& f = families_.at(name);
    out += "# HELP " + name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + name + " " + type_name(f.kind) + "\n";
    if (f.kind == Kind::kHistogram) {
      std::uint64_t cumulative = 0;
      for (std::size_t b = 0; b <= f.buckets.size(); ++b) {
        cumulative += f.counts[b];
        std::string le;
        if (b < f.buckets.size()) {
          append_value(le, f.buckets[b]);
        } else {
          le = "+Inf";
        }
        append_sample(out, name + "_bucket", label("le", le), static_cast<double>(cumulative));
      }
      append_sample(out, name + "_sum", "", f.sum);
      append_sample(out, name + "_count", "", static_cast<double>(f.count));
      continue;
    }
    for (const auto& [l, v] : f.values) append_sample(out, name, l, v);
    for (const auto& [shard, samples] : remote_) {
      for (const auto& s : samples) {
        if (s.name == name) append_sample(out, name, s.labels, s.value);
      }
    }
  }
  return out;
}

void Telemetry::add_round(nlohmann::json record) {
  std::lock_guard lock(mu_);
  rounds_.push_back(std::move(record));
}

nlohmann::json Telemetry::rounds_since(std::uint64_t since, std::size_t max) const {
  std::lock_guard lock(mu_);
  auto first = std::partition_point(rounds_.begin(), rounds_.end(), [&](const nlohmann::json& r) {
    return r.value("round", std::uint64_t{0}) <= since;
  });
  nlohmann::json out = nlohmann::json::object();
  out["rounds"] = nlohmann::json::array();
  std::uint64_t next = since;
  for (auto it = first; it != rounds_.end() && out["rounds"].size() < max; ++it) {
    out["rounds"].push_back(*it);
    next = it->value("round", next);
  }
  out["next"] = next;
  return out;
}

void Telemetry::set_status(const std::string& key, nlohmann::json value) {
  std::lock_guard lock(mu_);
  status_[key] = std::move(value);
}

nlohmann::json Telemetry::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

}  // namespace cohort::observe
