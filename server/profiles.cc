#include "profiles.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cohort::server {

double ema(double previous, double sample, double alpha) {
  if (previous <= 0) return sample;
  return alpha * sample + (1 - alpha) * previous;
}

void update_profile(ClientProfile& profile, const transport::ClientReport& report,
                    std::size_t shards, double alpha) {
  if (profile.links.size() != shards) profile.links.resize(shards);
  bool measured = false;
  const double sps = report.samples_per_second;
  if (std::isfinite(sps) && sps > 0) {
    profile.samples_per_s = ema(profile.samples_per_s, sps, alpha);
    measured = true;
  }
  for (const auto& s : report.links) {
    if (s.shard >= shards) continue;  // a layout the coordinator does not have: not its links
    auto& link = profile.links[s.shard];
    if (s.down_bytes > 0 && s.down_seconds > 0 && std::isfinite(s.down_seconds)) {
      link.down_rate =
          ema(link.down_rate, static_cast<double>(s.down_bytes) / s.down_seconds, alpha);
      link.down_bytes = s.down_bytes;
      measured = true;
    }
    if (s.up_bytes > 0 && s.up_seconds > 0 && std::isfinite(s.up_seconds)) {
      link.up_rate = ema(link.up_rate, static_cast<double>(s.up_bytes) / s.up_seconds, alpha);
      link.up_bytes = s.up_bytes;
      measured = true;
    }
  }
  if (measured) ++profile.reports;
}

double expected_transfer_seconds(const ClientProfile& profile) {
  if (profile.links.empty()) return -1;
  double down = 0, up = 0;
  for (const auto& l : profile.links) {
    if (l.down_rate <= 0 || l.up_rate <= 0) return -1;
    down = std::max(down, static_cast<double>(l.down_bytes) / l.down_rate);
    up = std::max(up, static_cast<double>(l.up_bytes) / l.up_rate);
  }
  return down + up;
}

double expected_work_seconds(const ClientProfile& profile, std::uint64_t steps,
                             std::uint64_t batch_size) {
  const double transfer = expected_transfer_seconds(profile);
  if (transfer < 0 || !(profile.samples_per_s > 0)) return -1;
  return transfer +
         static_cast<double>(steps) * static_cast<double>(batch_size) / profile.samples_per_s;
}

double planned_round_seconds(std::span<const double> fixed_finish_s, double deadline_s,
                             double margin) {
  const double longest = (1 - margin) * deadline_s;
  double latest = -1;
  for (double t : fixed_finish_s) {
    if (!(t >= 0) || !std::isfinite(t)) continue;
    latest = std::max(latest, t);
  }
  return latest < 0 ? longest : std::min(latest, longest);
}

bool usable_profile(const ClientProfile& p, std::size_t shards) {
  if (!(p.samples_per_s > 0) || p.links.size() != shards) return false;
  for (const auto& l : p.links) {
    if (!(l.down_rate > 0) || !(l.up_rate > 0)) return false;
  }
  return true;
}

ClientProfile fleet_prior(std::span<const ClientProfile* const> fleet, std::size_t shards) {
  std::vector<const ClientProfile*> usable;
  for (const ClientProfile* p : fleet) {
    if (p != nullptr && usable_profile(*p, shards)) usable.push_back(p);
  }
  ClientProfile prior;
  if (usable.empty()) return prior;
  std::vector<double> values(usable.size());
  const auto quantile = [&](auto field) {
    for (std::size_t i = 0; i < usable.size(); ++i) values[i] = field(*usable[i]);
    const auto k =
        static_cast<std::size_t>(kPriorQuantile * static_cast<double>(values.size() - 1));
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
    return values[k];
  };
  prior.samples_per_s = quantile([](const ClientProfile& p) { return p.samples_per_s; });
  prior.links.resize(shards);
  for (std::size_t k = 0; k < shards; ++k) {
    auto& l = prior.links[k];
    l.down_rate = quantile([k](const ClientProfile& p) { return p.links[k].down_rate; });
    l.up_rate = quantile([k](const ClientProfile& p) { return p.links[k].up_rate; });
    for (const ClientProfile* p : usable) {
      l.down_bytes = std::max(l.down_bytes, p->links[k].down_bytes);
      l.up_bytes = std::max(l.up_bytes, p->links[k].up_bytes);
    }
  }
  return prior;
}

ClientProfile filled_from(const ClientProfile& own, const ClientProfile& prior) {
  ClientProfile p = own;
  if (!(p.samples_per_s > 0)) p.samples_per_s = prior.samples_per_s;
  if (p.links.size() != prior.links.size()) p.links.resize(prior.links.size());
  for (std::size_t k = 0; k < p.links.size(); ++k) {
    auto& l = p.links[k];
    const auto& q = prior.links[k];
    if (!(l.down_rate > 0)) {
      l.down_rate = q.down_rate;
      l.down_bytes = q.down_bytes;
    }
    if (!(l.up_rate > 0)) {
      l.up_rate = q.up_rate;
      l.up_bytes = q.up_bytes;
    }
  }
  return p;
}

std::uint32_t plan_local_steps(const ClientProfile* profile, const WorkBounds& b) {
  const std::uint32_t lo = b.min_steps, hi = std::max(b.max_steps, b.min_steps);
  if (profile == nullptr || profile->samples_per_s <= 0 || b.batch_size == 0) return lo;
  const double transfer = expected_transfer_seconds(*profile);
  if (transfer < 0) return lo;
  const double round_s = b.round_s > 0 ? b.round_s : b.deadline_s - b.margin * b.deadline_s;
  const double budget = round_s - transfer;
  if (!(budget > 0)) return lo;
  // The relative 1e-9 keeps the client that set T (its fixed work fills it exactly) from losing a
  // step to rounding.
  const double steps =
      std::floor(budget * profile->samples_per_s / static_cast<double>(b.batch_size) * (1 + 1e-9));
  // Compared as doubles first: a fast client's count may not fit the integer type.
  if (!(steps > lo)) return lo;
  if (steps >= hi) return hi;
  return static_cast<std::uint32_t>(steps);
}

std::uint32_t fixed_work_steps(std::uint32_t train_steps, std::uint32_t train_epochs,
                               std::uint64_t batch_size, std::uint64_t samples,
                               std::uint32_t min_steps) {
  std::uint64_t steps = train_steps;
  if (steps == 0 && batch_size > 0) {
    steps = std::uint64_t{train_epochs} * ((samples + batch_size - 1) / batch_size);
  }
  steps = std::min<std::uint64_t>(steps, std::numeric_limits<std::uint32_t>::max());
  return std::max(static_cast<std::uint32_t>(steps), min_steps);
}

std::uint32_t derived_max_steps(std::uint32_t train_steps, std::uint32_t train_epochs,
                                std::uint64_t batch_size, std::uint64_t samples,
                                std::uint32_t min_steps) {
  const std::uint64_t fixed =
      fixed_work_steps(train_steps, train_epochs, batch_size, samples, min_steps);
  const std::uint64_t bound = std::min<std::uint64_t>(fixed * kDerivedWorkFactor,
                                                      std::numeric_limits<std::uint32_t>::max());
  return std::max(static_cast<std::uint32_t>(bound), min_steps);
}

std::vector<MetricField> client_record_fields(const ClientRoundRecord& r) {
  std::vector<MetricField> f{{"round_id", r.round_id},
                             {"client", r.client},
                             {"trained", r.trained},
                             {"assigned_steps", std::uint64_t{r.assigned_steps}},
                             {"local_steps", std::uint64_t{r.local_steps}},
                             {"measured_samples_per_s", r.measured_samples_per_s},
                             {"samples_per_s", r.profile.samples_per_s},
                             {"profile_reports", r.profile.reports},
                             {"participations", r.participations},
                             {"peak_training_bytes", r.peak_training_bytes},
                             {"micro_batch", std::uint64_t{r.micro_batch}},
                             {"accumulation", std::uint64_t{r.accumulation}},
                             {"recompute", r.recompute},
                             {"train_seconds", r.train_seconds},
                             {"comm_seconds", r.comm_seconds},
                             {"round_seconds", r.round_seconds}};
  for (std::size_t k = 0; k < r.profile.links.size(); ++k) {
    f.push_back({"down_bytes_per_s_" + std::to_string(k), r.profile.links[k].down_rate});
    f.push_back({"up_bytes_per_s_" + std::to_string(k), r.profile.links[k].up_rate});
  }
  return f;
}

}  // namespace cohort::server
