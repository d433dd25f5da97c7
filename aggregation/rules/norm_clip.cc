#include "cohort/aggregation/norm_clip.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "builtins.h"
#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {

NormClip::NormClip(double bound, double noise_stddev, std::uint64_t seed)
    : bound_(bound), noise_stddev_(noise_stddev), seed_(seed) {
  if (!(bound > 0) || !std::isfinite(bound)) {
    throw ConfigError("aggregator.bound must be a positive number, got " + std::to_string(bound));
  }
  if (!(noise_stddev >= 0) || !std::isfinite(noise_stddev)) {
    throw ConfigError("aggregator.noise_stddev must be >= 0");
  }
}

void NormClip::begin_round(std::uint64_t round, std::size_t size) {
  for (auto& [id, c] : clients_) {
    if (!c.values.empty()) spare_.push_back(std::move(c.values));
  }
  clients_.clear();
  if (size != size_) spare_.clear();
  round_ = round;
  size_ = size;
  sum_.assign(size, 0.0);
  total_weight_ = 0;
  completed_ = 0;
}

Verdict NormClip::accept(const UpdateChunk& chunk) {
  if (chunk.offset > size_ || chunk.values.size() > size_ - chunk.offset) return Verdict::kRejected;
  if (!(chunk.weight > 0) || !std::isfinite(chunk.weight)) return Verdict::kRejected;
  auto [it, fresh] = clients_.try_emplace(chunk.client);
  InFlight& c = it->second;
  if (fresh) c.weight = chunk.weight;
  if (c.ended || c.weight != chunk.weight || chunk.offset != c.prefix_end)
    return Verdict::kRejected;
  for (float v : chunk.values) {
    if (!std::isfinite(v)) return Verdict::kRejected;
  }
  if (c.values.empty()) {
    if (!spare_.empty()) {
      c.values = std::move(spare_.back());
      spare_.pop_back();
    } else {
      c.values = FloatBuffer(size_);
    }
  }
  std::copy(chunk.values.begin(), chunk.values.end(), c.values.begin() + chunk.offset);
  c.prefix_end += chunk.values.size();
  return Verdict::kAccepted;
}

void NormClip::end_update(ClientId client, bool complete) {
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.ended) return;
  InFlight& c = it->second;
  c.ended = true;
  if (complete && c.prefix_end == size_) {
    double norm2 = 0;
    for (float v : c.values) norm2 += static_cast<double>(v) * v;
    const double norm = std::sqrt(norm2);
    const double factor = norm > bound_ ? bound_ / norm : 1.0;
    const double w = c.weight * factor;
    for (std::size_t i = 0; i < size_; ++i) sum_[i] += w * static_cast<double>(c.values[i]);
    total_weight_ += c.weight;
    ++completed_;
  }
  if (!c.values.empty()) spare_.push_back(std::move(c.values));
  c.values = FloatBuffer();
}

bool NormClip::finish_round(std::span<float> out) {
  COHORT_CHECK(out.size() == size_) << "out has " << out.size() << " elements, range " << size_;
  if (completed_ == 0) return false;
  const double inv = 1.0 / total_weight_;
  SplitMixRng rng(derive_seed(seed_, round_));
  for (std::size_t i = 0; i < size_; ++i) {
    double v = sum_[i] * inv;
    if (noise_stddev_ > 0) v += noise_stddev_ * rng.normal();
    out[i] = static_cast<float>(v);
  }
  return true;
}

void detail::add_norm_clip_aggregator(AggregatorRegistry& registry) {
  registry.add("norm_clip", [](const ConfigSection& options) {
    const std::string_view known[] = {"name", "bound", "noise_stddev", "seed"};
    options.require_known(known);
    if (!options.has("bound")) throw ConfigError("aggregator: norm_clip needs aggregator.bound");
    return std::make_unique<NormClip>(options.get_double("bound", 0.0),
                                      options.get_double("noise_stddev", 0.0),
                                      static_cast<std::uint64_t>(options.get_int("seed", 0)));
  });
}

}  // namespace cohort::aggregation
