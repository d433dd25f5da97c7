// cohort-sim's device profiles and virtual clock: pure functions, no sockets, no threads.
//
// Every virtual client has a DeviceProfile (compute speed, link bandwidths, latency,
// availability). A round's simulated time comes from the bytes the protocol really moves for a
// client (its pull replies and its pushes) and the training work it really does (samples
// processed times the model's FLOPs per sample), never from the host's own timing, so a run is
// reproducible:
//
//   download = latency + 8 * bytes_down / downlink          (the pull of every shard's range)
//   compute  = 6 * parameters * samples / (gflops * 1e9)    (forward 2P + backward 4P per sample)
//              * slowdown                                  (micro-batches under a memory budget)
//   upload   = latency + 8 * bytes_up / uplink              (the push to every shard)
//   finish   = download + compute + upload
//
// The round then closes as the coordinator closes it (server.cc): at the K-th finished update
// (K = server.clients_per_round), else at the deadline if a selected client is silent (offline,
// dropped out) or too slow, else when the last report arrives. plan_round() applies that rule in
// simulated time and says which clients make the cut.
//
// Availability: "always", or "diurnal:MIN:MAX": the chance of being online swings between MIN and
// MAX over a simulated day, peaking at noon of the client's own time zone (its phase). Dropout: the
// chance that a selected, online client drops out during the round and is never heard from again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/random.h"

namespace cohort::sim {

inline constexpr double kSecondsPerDay = 86400.0;

struct DeviceProfile {
  double gflops = 10.0;         // sustained training throughput, GFLOP/s
  double uplink_mbps = 10.0;    // Mbit/s
  double downlink_mbps = 50.0;  // Mbit/s
  double latency_ms = 50.0;     // one way, added once per transfer direction
  double online_min = 1.0;      // diurnal availability: probability range over a day
  double online_max = 1.0;
  double phase = 0.0;    // time zone as a fraction of a day, [0, 1)
  double dropout = 0.0;  // probability of dropping out of a round it was selected for
  // Training memory budget in bytes (ALGORITHMS.md 3.5.2); 0: unlimited. Fractions are dropped.
  double memory_bytes = 0.0;
  bool operator==(const DeviceProfile&) const = default;
};

// A value drawn per client: "X" or "const:X", "uniform:A:B", "lognormal:MEDIAN:SIGMA" (the log of
// the value is normal with mean log(MEDIAN) and deviation SIGMA).
struct Distribution {
  enum class Kind { kConst, kUniform, kLogNormal };
  Kind kind = Kind::kConst;
  double a = 0.0;
  double b = 0.0;
  [[nodiscard]] double sample(Rng& rng) const;
};

// Throws ConfigError naming `key` and the valid forms; values must be positive.
Distribution parse_distribution(std::string_view spec, std::string_view key);

struct ProfileSpec {
  Distribution gflops{Distribution::Kind::kConst, 10.0, 0.0};
  Distribution uplink_mbps{Distribution::Kind::kConst, 10.0, 0.0};
  Distribution downlink_mbps{Distribution::Kind::kConst, 50.0, 0.0};
  Distribution latency_ms{Distribution::Kind::kConst, 50.0, 0.0};
  double online_min = 1.0, online_max = 1.0;  // from "always" or "diurnal:MIN:MAX"
  double dropout = 0.0;
  Distribution memory_bytes{Distribution::Kind::kConst, 0.0, 0.0};  // const 0: unlimited
};

// Parses "always" or "diurnal:MIN:MAX" (0 <= MIN <= MAX <= 1) into spec's online range.
// Throws ConfigError.
void parse_availability(std::string_view text, ProfileSpec& spec);

// Client `client`'s profile: a function of (seed, client) only.
DeviceProfile draw_profile(const ProfileSpec& spec, std::uint64_t seed, std::uint64_t client);

// A CSV trace of measured devices, one per row, with a header naming the columns: gflops,
// uplink_mbps, downlink_mbps, latency_ms are required; online_min, online_max, phase and
// dropout, memory (bytes, 0: unlimited) are optional (defaults: always online, phase 0, no
// dropout, unlimited memory). Client i gets row
// i mod rows. Throws DataError naming the file and line.
std::vector<DeviceProfile> parse_profile_trace(std::string_view text, std::string_view origin);
std::vector<DeviceProfile> read_profile_trace(const std::filesystem::path& path);

struct ClientWork {
  std::uint64_t bytes_down = 0;  // payload bytes of the pull replies
  std::uint64_t bytes_up = 0;    // payload bytes of the pushes
  double flops = 0.0;            // training work
  // Compute time's factor for training in micro-batches (memory_budgets.h): 1 for whole batches.
  // Activation recomputation is never planned (MemoryPlan::recompute is always false), so no
  // FLOPs are added for it: its term is 0 today.
  double slowdown = 1.0;
};

struct ClientTime {
  double download_s = 0.0;
  double compute_s = 0.0;
  double upload_s = 0.0;
  [[nodiscard]] double total() const { return download_s + compute_s + upload_s; }
};

ClientTime client_time(const DeviceProfile& profile, const ClientWork& work);

// 6 * parameters * samples: a training sample costs a forward (2 FLOPs per parameter) and a
// backward pass (4).
double training_flops(std::uint64_t parameters, std::uint64_t samples);

// Samples one local training pass processes over `rows` rows, exactly as LocalTrainer::train
// does: an epoch is ceil(rows / batch) batches, the last one short (with drop_last: rows / batch
// full batches); `steps` > 0: that many batches, running through epochs; else `epochs` epochs.
// 0 when no batch fits (no rows, or drop_last with rows < batch).
std::uint64_t samples_per_round(std::size_t rows, std::size_t batch, std::size_t epochs,
                                std::size_t steps, bool drop_last);

// Transfers to or from several shards at once over one link of `mbps` Mbit/s, sharing it fairly
// (while k are unfinished each gets 1/k of it): the seconds from request to answer of each, in
// the order of `bytes`, latency included; 0 for an empty transfer. The last one ends at
// latency + 8 * sum(bytes) / link, the whole transfer's time in client_time().
std::vector<double> shared_link_seconds(double latency_s, double mbps,
                                        std::span<const std::uint64_t> bytes);

// Probability that the client is online at simulated time t (seconds).
double online_probability(const DeviceProfile& profile, double t);
// Whether it is online at the start of a round, and whether it drops out of that round: fixed
// functions of (seed, client, round), so reruns agree.
bool is_online(const DeviceProfile& profile, std::uint64_t seed, std::uint64_t client,
               std::uint64_t round, double t);
bool drops_out(const DeviceProfile& profile, std::uint64_t seed, std::uint64_t client,
               std::uint64_t round);

enum class Fate {
  kCompletes,  // pushes in time and is among the first K
  kCut,        // would finish in time, but the round closed at the K-th update first
  kStraggler,  // would finish after the deadline
  kSilent,     // offline or dropped out: never answers
};

struct Selected {
  double finish_s = 0.0;  // ClientTime::total(), ignored when silent
  bool silent = false;
};

struct RoundPlan {
  std::vector<Fate> fate;  // one per Selected, same order
  std::size_t completes = 0;
  double close_s = 0.0;  // simulated length of the round
};

// The coordinator's closing rule in simulated time (see the header comment). Ties in finish time
// go to the earlier entry. REQUIRES: k >= 1, deadline_s > 0.
RoundPlan plan_round(std::span<const Selected> selected, std::size_t k, double deadline_s);

}  // namespace cohort::sim
