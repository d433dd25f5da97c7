// A virtual client's measurements and FedNova's local work (measurements.h).
#include "measurements.h"

#include <cmath>

namespace cohort::sim {

std::vector<transport::LinkSample> virtual_links(const DeviceProfile& profile,
                                                 std::span<const ShardBytes> shards) {
  std::vector<std::uint64_t> down, up;
  for (const auto& s : shards) {
    down.push_back(s.down);
    up.push_back(s.up);
  }
  const double latency = profile.latency_ms / 1e3;
  const auto down_s = shared_link_seconds(latency, profile.downlink_mbps, down);
  const auto up_s = shared_link_seconds(latency, profile.uplink_mbps, up);
  std::vector<transport::LinkSample> out(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    out[i] = {.shard = shards[i].shard,
              .down_bytes = shards[i].down,
              .down_seconds = static_cast<float>(down_s[i]),
              .up_bytes = shards[i].up,
              .up_seconds = static_cast<float>(up_s[i])};
  }
  return out;
}

double virtual_samples_per_second(const DeviceProfile& profile, std::uint64_t parameters,
                                  std::uint64_t samples, double slowdown) {
  if (samples == 0 || parameters == 0) return 0.0;
  // client_time()'s compute_s, to the bit.
  const double compute_s = training_flops(parameters, samples) / (profile.gflops * 1e9) * slowdown;
  return static_cast<double>(samples) / compute_s;
}

}  // namespace cohort::sim
