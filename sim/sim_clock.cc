#include "sim_clock.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <numeric>
#include <sstream>

#include "cohort/core/error.h"

namespace cohort::sim {

using cohort::Rng;

namespace {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const auto pos = text.find(sep, start);
    out.emplace_back(
        text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

bool parse_number(const std::string& text, double& out) {
  try {
    std::size_t used = 0;
    out = std::stod(text, &used);
    return used == text.size() && std::isfinite(out);
  } catch (const std::exception&) {
    return false;
  }
}

// A uniform draw that depends only on (seed, client, round, salt).
double hashed_uniform(std::uint64_t seed, std::uint64_t client, std::uint64_t round,
                      std::uint64_t salt) {
  return Rng::for_stream(seed ^ (salt * 0x9e3779b97f4a7c15ULL), client * 0x100000001b3ULL + round)
      .uniform();
}

}  // namespace

double Distribution::sample(Rng& rng) const {
  switch (kind) {
    case Kind::kConst: return a;
    case Kind::kUniform: return a + (b - a) * rng.uniform();
    case Kind::kLogNormal: return a * std::exp(b * rng.normal());
  }
  return a;
}

Distribution parse_distribution(std::string_view spec, std::string_view key) {
  const auto fail = [&](const std::string& why) -> ConfigError {
    return ConfigError(
        std::string(key) + " = \"" + std::string(spec) + "\": " + why +
        "; use X, const:X, uniform:A:B or lognormal:MEDIAN:SIGMA with positive numbers");
  };
  const auto parts = split(spec, ':');
  std::vector<double> v;
  for (std::size_t i = parts.size() == 1 ? 0 : 1; i < parts.size(); ++i) {
    double x = 0;
    if (!parse_number(trim(parts[i]), x)) throw fail("'" + parts[i] + "' is not a number");
    v.push_back(x);
  }
  Distribution d;
  const std::string kind = parts.size() == 1 ? "const" : trim(parts[0]);
  if (kind == "const" && v.size() == 1) {
    d = {Distribution::Kind::kConst, v[0], 0};
    if (!(v[0] > 0)) throw fail("the value must be positive");
  } else if (kind == "uniform" && v.size() == 2) {
    d = {Distribution::Kind::kUniform, v[0], v[1]};
    if (!(v[0] > 0 && v[1] >= v[0])) throw fail("need 0 < A <= B");
  } else if (kind == "lognormal" && v.size() == 2) {
    d = {Distribution::Kind::kLogNormal, v[0], v[1]};
    if (!(v[0] > 0 && v[1] >= 0)) throw fail("need MEDIAN > 0 and SIGMA >= 0");
  } else {
    throw fail("unknown form");
  }
  return d;
}

void parse_availability(std::string_view text, ProfileSpec& spec) {
  if (text == "always") {
    spec.online_min = spec.online_max = 1.0;
    return;
  }
  const auto parts = split(text, ':');
  double lo = 0, hi = 0;
  if (parts.size() != 3 || parts[0] != "diurnal" || !parse_number(trim(parts[1]), lo) ||
      !parse_number(trim(parts[2]), hi) || !(lo >= 0 && lo <= hi && hi <= 1)) {
    throw ConfigError("profile.availability = \"" + std::string(text) +
                      "\": use always or diurnal:MIN:MAX with 0 <= MIN <= MAX <= 1");
  }
  spec.online_min = lo;
  spec.online_max = hi;
}

DeviceProfile draw_profile(const ProfileSpec& spec, std::uint64_t seed, std::uint64_t client) {
  Rng rng = Rng::for_stream(seed, client);
  DeviceProfile p;
  p.gflops = spec.gflops.sample(rng);
  p.uplink_mbps = spec.uplink_mbps.sample(rng);
  p.downlink_mbps = spec.downlink_mbps.sample(rng);
  p.latency_ms = spec.latency_ms.sample(rng);
  p.online_min = spec.online_min;
  p.online_max = spec.online_max;
  p.phase = rng.uniform();
  p.dropout = spec.dropout;
  // Drawn last: adding it left every earlier draw of a client as it was.
  p.memory_bytes = spec.memory_bytes.sample(rng);
  return p;
}

std::vector<DeviceProfile> parse_profile_trace(std::string_view text, std::string_view origin) {
  const auto lines = split(text, '\n');
  const auto where = [&](std::size_t line) {
    return std::string(origin) + ":" + std::to_string(line + 1);
  };
  std::size_t first = 0;
  while (first < lines.size() && trim(lines[first]).empty()) ++first;
  if (first == lines.size()) throw DataError(std::string(origin) + ": empty device trace");
  const auto header = split(lines[first], ',');
  const char* names[] = {"gflops",     "uplink_mbps", "downlink_mbps", "latency_ms", "online_min",
                         "online_max", "phase",       "dropout",       "memory"};
  constexpr std::size_t kRequired = 4;
  std::vector<int> column(std::size(names), -1);
  for (std::size_t c = 0; c < header.size(); ++c) {
    const std::string name = trim(header[c]);
    const auto it = std::find(std::begin(names), std::end(names), name);
    if (it == std::end(names)) {
      throw DataError(where(first) + ": unknown column '" + name +
                      "' (known: gflops, uplink_mbps, downlink_mbps, latency_ms, online_min, "
                      "online_max, phase, dropout, memory)");
    }
    column[static_cast<std::size_t>(it - std::begin(names))] = static_cast<int>(c);
  }
  for (std::size_t k = 0; k < kRequired; ++k) {
    if (column[k] < 0)
      throw DataError(where(first) + ": the header has no '" + names[k] + "' column");
  }
  std::vector<DeviceProfile> out;
  for (std::size_t l = first + 1; l < lines.size(); ++l) {
    if (trim(lines[l]).empty()) continue;
    const auto cells = split(lines[l], ',');
    if (cells.size() != header.size()) {
      throw DataError(where(l) + ": " + std::to_string(cells.size()) + " cells, the header has " +
                      std::to_string(header.size()));
    }
    double v[std::size(names)] = {0, 0, 0, 0, 1, 1, 0, 0, 0};
    for (std::size_t k = 0; k < std::size(names); ++k) {
      if (column[k] < 0) continue;
      const std::string cell = trim(cells[static_cast<std::size_t>(column[k])]);
      if (!parse_number(cell, v[k]))
        throw DataError(where(l) + ": " + names[k] + " '" + cell + "' is not a number");
    }
    DeviceProfile p{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
    if (!(p.gflops > 0 && p.uplink_mbps > 0 && p.downlink_mbps > 0 && p.latency_ms >= 0)) {
      throw DataError(where(l) + ": gflops and bandwidths must be positive, latency non-negative");
    }
    if (!(p.online_min >= 0 && p.online_min <= p.online_max && p.online_max <= 1 &&
          p.dropout >= 0 && p.dropout <= 1 && p.phase >= 0 && p.phase < 1 && p.memory_bytes >= 0)) {
      throw DataError(where(l) +
                      ": need 0 <= online_min <= online_max <= 1, 0 <= dropout <= 1, 0 <= phase "
                      "< 1, memory >= 0");
    }
    out.push_back(p);
  }
  if (out.empty())
    throw DataError(std::string(origin) + ": the device trace has a header but no rows");
  return out;
}

std::vector<DeviceProfile> read_profile_trace(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in)
    throw DataError("cannot read the device trace " + path.string() + " (sim.profile_trace)");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_profile_trace(text.str(), path.string());
}

ClientTime client_time(const DeviceProfile& profile, const ClientWork& work) {
  ClientTime t;
  const double latency = profile.latency_ms / 1e3;
  t.download_s =
      latency + static_cast<double>(work.bytes_down) * 8.0 / (profile.downlink_mbps * 1e6);
  t.compute_s = work.flops / (profile.gflops * 1e9) * work.slowdown;  // exact when slowdown is 1
  t.upload_s = latency + static_cast<double>(work.bytes_up) * 8.0 / (profile.uplink_mbps * 1e6);
  return t;
}

double training_flops(std::uint64_t parameters, std::uint64_t samples) {
  return 6.0 * static_cast<double>(parameters) * static_cast<double>(samples);
}

std::uint64_t samples_per_round(std::size_t rows, std::size_t batch, std::size_t epochs,
                                std::size_t steps, bool drop_last) {
  if (rows == 0 || batch == 0) return 0;
  // One epoch: full batches, then (without drop_last) the remainder as a last, smaller batch.
  const std::uint64_t batches = drop_last ? rows / batch : (rows + batch - 1) / batch;
  const std::uint64_t per_epoch = drop_last ? batches * batch : rows;
  if (batches == 0) return 0;  // the trainer refuses this (no full batch with drop_last)
  if (steps == 0) return std::uint64_t{epochs} * per_epoch;
  // `steps` batches run through whole epochs, then the first steps % batches batches of the next
  // one (all full: only an epoch's last batch can be short).
  return (steps / batches) * per_epoch + (steps % batches) * batch;
}

std::vector<double> shared_link_seconds(double latency_s, double mbps,
                                        std::span<const std::uint64_t> bytes) {
  // Processor sharing: while k transfers are unfinished each gets 1/k of the link, so transfers
  // end in the order of their sizes; the i-th smallest ends when the bytes sent so far by all of
  // them reach sum(smaller) + (remaining count) * its size.
  std::vector<std::size_t> order(bytes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return bytes[a] < bytes[b]; });
  std::vector<double> out(bytes.size(), 0.0);
  double done = 0;  // bytes of the transfers that already ended
  for (std::size_t r = 0; r < order.size(); ++r) {
    const std::uint64_t b = bytes[order[r]];
    if (b == 0) continue;
    const double sent = done + static_cast<double>(order.size() - r) * static_cast<double>(b);
    out[order[r]] = latency_s + sent * 8.0 / (mbps * 1e6);
    done += static_cast<double>(b);
  }
  return out;
}

double online_probability(const DeviceProfile& profile, double t) {
  // Peak at the client's local noon: phase shifts the day, sin peaks a quarter-day in.
  const double day = t / kSecondsPerDay + profile.phase;
  const double wave = (1.0 + std::sin(2.0 * std::numbers::pi * (day - 0.25))) / 2.0;
  return profile.online_min + (profile.online_max - profile.online_min) * wave;
}

bool is_online(const DeviceProfile& profile, std::uint64_t seed, std::uint64_t client,
               std::uint64_t round, double t) {
  if (profile.online_min >= 1.0) return true;
  return hashed_uniform(seed, client, round, 1) < online_probability(profile, t);
}

bool drops_out(const DeviceProfile& profile, std::uint64_t seed, std::uint64_t client,
               std::uint64_t round) {
  if (profile.dropout <= 0.0) return false;
  return hashed_uniform(seed, client, round, 2) < profile.dropout;
}

RoundPlan plan_round(std::span<const Selected> selected, std::size_t k, double deadline_s) {
  COHORT_CHECK(k >= 1 && deadline_s > 0);
  RoundPlan plan;
  plan.fate.assign(selected.size(), Fate::kSilent);
  std::vector<std::size_t> in_time;
  bool someone_late = false;
  for (std::size_t i = 0; i < selected.size(); ++i) {
    if (selected[i].silent) {
      someone_late = true;
    } else if (selected[i].finish_s > deadline_s) {
      plan.fate[i] = Fate::kStraggler;
      someone_late = true;
    } else {
      in_time.push_back(i);
    }
  }
  std::stable_sort(in_time.begin(), in_time.end(), [&](std::size_t a, std::size_t b) {
    return selected[a].finish_s < selected[b].finish_s;
  });
  for (std::size_t j = 0; j < in_time.size(); ++j) {
    plan.fate[in_time[j]] = j < k ? Fate::kCompletes : Fate::kCut;
  }
  plan.completes = std::min(k, in_time.size());
  if (in_time.size() >= k) {
    plan.close_s = selected[in_time[k - 1]].finish_s;
  } else if (someone_late) {
    plan.close_s = deadline_s;
  } else {
    plan.close_s = in_time.empty() ? 0.0 : selected[in_time.back()].finish_s;
  }
  return plan;
}

}  // namespace cohort::sim
