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

std::uint32_t plan_local_steps(const ClientProfile* profile, const WorkBounds& b) {
  const std::uint32_t lo = b.min_steps, hi = std::max(b.max_steps, b.min_steps);
  if (profile == nullptr || profile->samples_per_s <= 0 || b.batch_size == 0) return lo;
  const double transfer = expected_transfer_seconds(*profile);
  if (transfer < 0) return lo;
  const double budget = b.deadline_s - transfer - b.margin * b.deadline_s;
  if (!(budget > 0)) return lo;
  const double steps =
      std::floor(budget * profile->samples_per_s / static_cast<double>(b.batch_size));
  // Compared as doubles first: a fast client's count may not fit the integer type.
  if (!(steps > lo)) return lo;
  if (steps >= hi) return hi;
  return static_cast<std::uint32_t>(steps);
}

std::uint32_t derived_max_steps(std::uint32_t train_steps, std::uint32_t train_epochs,
                                std::uint64_t batch_size, std::uint64_t samples,
                                std::uint32_t min_steps) {
  std::uint64_t steps = train_steps;
  if (steps == 0 && batch_size > 0) {
    steps = std::uint64_t{train_epochs} * ((samples + batch_size - 1) / batch_size);
  }
  steps = std::min<std::uint64_t>(steps, std::numeric_limits<std::uint32_t>::max());
  return std::max(static_cast<std::uint32_t>(steps), min_steps);
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
                             {"participations", r.participations}};
  for (std::size_t k = 0; k < r.profile.links.size(); ++k) {
    f.push_back({"down_bytes_per_s_" + std::to_string(k), r.profile.links[k].down_rate});
    f.push_back({"up_bytes_per_s_" + std::to_string(k), r.profile.links[k].up_rate});
  }
  return f;
}

}  // namespace cohort::server
