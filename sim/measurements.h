// What a virtual client of cohort-sim tells the coordinator about its device and its work, as a
// real client does (issue 23's device profiles, docs/ALGORITHMS.md 1.7): FedNova's a_i for its
// push, and the throughput and per-shard link times of its report, all on the virtual clock, so
// the coordinator's profiles describe the simulated devices, not the host. Pure functions.
// Private to sim/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cohort/transport/messages.h"
#include "sim_clock.h"

namespace cohort::sim {

// FedNova's a_i (docs/ALGORITHMS.md (1.20)) for `steps` local steps of the fleet's trainer: the
// sum of the coefficients its updates put on the step's gradients.
//   plain SGD:                    a = τ
//   heavy-ball momentum ρ:        a = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ)
//   Nesterov momentum ρ:          a = τ + ρ · (the heavy-ball a)   (the optimizer of
//                                 kernels/optimizer.h steps by g + ρv, v = ρv + g)
//   FedProx μ, rate η, no momentum: a = [1 − (1 − ημ)^τ] / (ημ)   (ημ >= 1, no contraction: τ)
// With momentum and FedProx together (1.20 gives no combined form) the momentum form is used;
// `momentum` is 0 for Adam and AdamW, whose local work FedNova does not define, so they get τ.
// REQUIRES: 0 <= momentum < 1, learning_rate >= 0, prox_mu >= 0.
double sim_fednova_local_work(std::uint64_t steps, double momentum, bool nesterov,
                              double learning_rate, double prox_mu);

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
// them; 0 without samples.
double virtual_samples_per_second(const DeviceProfile& profile, std::uint64_t parameters,
                                  std::uint64_t samples);

}  // namespace cohort::sim
