// What a server process (or the simulator) shows on its HTTP endpoint: metric families in
// Prometheus' text exposition format, the rounds committed so far, and a status object. The
// process's own threads write it (the message loop refreshes it about once a second, the metrics
// sink's observer adds rounds); the HTTP threads only read it, under its lock, so a request never
// waits on the message loop and the loop never waits on a request beyond one copy.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cohort::observe {

enum class Kind { kCounter, kGauge, kHistogram };

// One sample of a counter or gauge family: `labels` is the text between the braces
// (`shard="1",reason="late"`), already escaped (label() builds it), or empty.
struct Sample {
  std::string name;
  std::string labels;
  double value = 0;
};

// `key="value"` with the value escaped as the exposition format wants (\\, \", \n).
std::string label(std::string_view key, std::string_view value);
// Two labels joined: label(a, x) + "," + label(b, y).
std::string labels(std::string_view k1, std::string_view v1, std::string_view k2,
                   std::string_view v2);

class Telemetry {
 public:
  // Declares a family (its name, type and help line). Samples of undeclared families are refused
  // by set()/add() (std::logic_error) and dropped from remote shards.
  void describe(const std::string& name, Kind kind, std::string help,
                std::vector<double> buckets = {});
  // A counter's or gauge's sample, set to `value` / increased by `delta`.
  void set(const std::string& name, const std::string& labels, double value);
  void add(const std::string& name, const std::string& labels, double delta);
  // One observation of a histogram family.
  void observe(const std::string& name, double value);
  // Every counter and gauge sample of this process (what a shard sends to shard 0).
  [[nodiscard]] std::vector<Sample> samples() const;
  // Another shard's samples, shown beside this process's own; replaces what it sent before.
  void set_remote(std::uint32_t shard, std::vector<Sample> samples);

  // The exposition text: every family with its # HELP and # TYPE lines, then its samples (this
  // process's, then the remote shards' in shard order).
  [[nodiscard]] std::string prometheus() const;

  // Rounds: the metrics.jsonl "round" records, with their "round" field rising.
  void add_round(nlohmann::json record);
  // {"rounds": [records with round > since, at most `max`], "next": the last one's round or since}
  [[nodiscard]] nlohmann::json rounds_since(std::uint64_t since, std::size_t max) const;

  // The status object: top-level keys set one at a time.
  void set_status(const std::string& key, nlohmann::json value);
  [[nodiscard]] nlohmann::json status() const;

 private:
  struct Family {
    Kind kind = Kind::kGauge;
    std::string help;
    std::vector<double> buckets;           // histograms: upper bounds, +Inf implied
    std::vector<std::uint64_t> counts;     // histograms: per bucket (not cumulative)
    double sum = 0;                        // histograms
    std::uint64_t count = 0;               // histograms
    std::map<std::string, double> values;  // counters and gauges: by labels
  };

  Family& family(const std::string& name, bool histogram);

  mutable std::mutex mu_;
  std::vector<std::string> order_;  // families in the order described
  std::map<std::string, Family> families_;
  std::map<std::uint32_t, std::vector<Sample>> remote_;
  std::vector<nlohmann::json> rounds_;
  nlohmann::json status_ = nlohmann::json::object();
};

}  // namespace cohort::observe
