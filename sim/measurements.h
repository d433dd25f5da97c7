// What a virtual client of cohort-sim tells the coordinator about its device, as a real client
// does (issue 23's device profiles): the throughput and per-shard link times of its report, all on
// the virtual clock, so the coordinator's profiles describe the simulated devices, not the host.
// Its push's a_i (docs/ALGORITHMS.md 1.7) comes from client::fednova_local_work, as a real
// client's does. Pure functions. Private to sim/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cohort/transport/messages.h"
#include "sim_clock.h"

namespace cohort::sim {

// One shard's share of a client's transfers: payload bytes each way.
struct ShardBytes {
  std::uint32_t shard = 0;
  std::uint64_t down = 0;
  std::uint64_t up = 0;
};

// The LinkSample a client on `profile` measures to each shard: every shard's pull (then push)
// sent at once over its link (shared_link_seconds), so the slowest shard's answer comes at
// ClientTime::download_s (upload_s). A direction with no bytes has 0 seconds (not measured).
std::vector<transport::LinkSample> virtual_links(const DeviceProfile& profile,
                                                 std::span<const ShardBytes> shards);

// Training throughput on the virtual clock: `samples` over the compute time the profile gives
// them, times `slowdown` (ClientWork::slowdown: micro-batches under a memory budget); 0 without
// samples.
double virtual_samples_per_second(const DeviceProfile& profile, std::uint64_t parameters,
                                  std::uint64_t samples, double slowdown = 1.0);

}  // namespace cohort::sim
