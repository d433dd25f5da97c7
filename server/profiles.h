// Measured device profiles and deadline-sized work (docs/ALGORITHMS.md "Deadline-sized work",
// issue 23). Every federated ClientReport carries the client's training throughput and, per
// shard, the bytes and request-to-answer times of its pull and its push; the coordinator keeps a
// profile per client, exponential moving averages of those measurements, reset when the client
// registers again. Under server.work = deadline the next round's RoundStart.local_steps of each
// selected client comes from plan_local_steps(). Pure functions: no clock, no I/O. Internal to
// the server library.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/metrics.h"
#include "cohort/transport/messages.h"

namespace cohort::server {

// The weight of the newest measurement in every moving average.
inline constexpr double kProfileAlpha = 0.3;

// One shard's link as the client measured it. Rates are payload bytes over the time from request
// to answer, so they fold latency and the shard's own work in: for a payload of the size measured
// they predict the time the client will wait.
struct LinkProfile {
  double down_rate = 0;  // pull: bytes/s, moving average; 0: never measured
  double up_rate = 0;    // push (to its acknowledgement): bytes/s, moving average; 0: never
  std::uint64_t down_bytes = 0, up_bytes = 0;  // the payloads of the last measurement
};

struct ClientProfile {
  double samples_per_s = 0;        // training throughput, moving average; 0: never measured
  std::vector<LinkProfile> links;  // by shard index (sized to the federation's shards)
  std::uint64_t reports = 0;       // reports folded in since the client (re-)registered
};

// alpha * sample + (1 - alpha) * previous; the first measurement (previous == 0) is taken as is.
double ema(double previous, double sample, double alpha = kProfileAlpha);

// Folds one report's measurements into `profile` with weight `alpha`: samples_per_second when
// > 0, and each link sample of a shard below `shards` in the directions it measured (bytes > 0
// and seconds > 0). Unmeasured fields leave the averages as they were. alpha = 1 replaces them
// (the coordinator does so for a round whose work did not fit: see kMissAlpha).
void update_profile(ClientProfile& profile, const transport::ClientReport& report,
                    std::size_t shards, double alpha = kProfileAlpha);

// The weight of a measurement from a round whose work did not fit (the update did not complete,
// or its report came after the round closed): it replaces the averages, which planned that work,
// so that one round corrects them instead of several missed ones.
inline constexpr double kMissAlpha = 1.0;

// The transfer time the profile predicts for a round: shards are pulled in parallel and pushed
// in parallel, so the slowest shard's pull plus the slowest shard's push (the last measured
// payloads at the averaged rates). Negative when a shard's rate is unknown in either direction.
double expected_transfer_seconds(const ClientProfile& profile);

// What the planner needs besides the profile.
struct WorkBounds {
  double deadline_s = 60;  // D: server.round_deadline_ms in seconds
  double margin = 0.2;     // server.deadline_margin: the fraction of D left unplanned
  double round_s = 0;  // T: the round's planned length (planned_round_seconds()); 0: (1 - margin) D
  std::uint64_t batch_size = 64;  // B: train.batch_size
  std::uint32_t min_steps = 1;    // server.min_local_steps
  std::uint32_t max_steps = 1;    // server.max_local_steps, or the client's derived bound
};

// Seconds the profile predicts for `steps` local steps of `batch_size` samples plus the round's
// transfers; negative when it cannot tell (no throughput, or a shard's rate unknown).
double expected_work_seconds(const ClientProfile& profile, std::uint64_t steps,
                             std::uint64_t batch_size);

// T, the length a round under server.work = deadline is planned to: (1 - margin) D, or less when
// every selected client with a usable profile is predicted to finish the work server.work = fixed
// would give it sooner: then the latest of those finishes. `fixed_finish_s` holds those
// predictions (negative entries, clients without a usable profile, are skipped). So a fleet whose
// slowest selected device meets the deadline keeps its rounds as short as fixed work makes them,
// and the faster devices fill that time; only a fleet with a device too slow for the deadline
// plans its rounds to the deadline.
double planned_round_seconds(std::span<const double> fixed_finish_s, double deadline_s,
                             double margin);

// Whether the planner can use `profile`: a throughput and both rates of every one of `shards`.
bool usable_profile(const ClientProfile& profile, std::size_t shards);

// The quantile of the measured fleet a client without a usable profile is planned with.
inline constexpr double kPriorQuantile = 0.1;

// A stand-in profile for a client that has not been measured yet: per field (throughput, each
// shard's down and up rate), the kPriorQuantile quantile over `fleet`'s usable profiles, the slow
// end of the devices measured so far, with the largest payloads they last measured. Not usable
// (no throughput) when no profile in `fleet` is.
ClientProfile fleet_prior(std::span<const ClientProfile* const> fleet, std::size_t shards);

// `own` with each field it has not measured (throughput, a shard's down or up rate) taken from
// `prior`: a client that never completed a push (it missed every deadline it was given) still has
// its measured speed and pull planned with, and the fleet's up rate for the push it never made.
ClientProfile filled_from(const ClientProfile& own, const ClientProfile& prior);

// tau = clamp(floor((T - c) * s / B), min_steps, max_steps), with s the profile's samples/s, c its
// expected transfer time and T = bounds.round_s (or (1 - margin) D). min_steps for a client
// without a usable profile (none, no throughput yet, or a shard's rate unknown) and when
// transfers alone use the budget. max_steps below min_steps is taken as min_steps.
std::uint32_t plan_local_steps(const ClientProfile* profile, const WorkBounds& bounds);

// The work server.work = fixed gives a client with `samples` samples: train.steps when set, else
// train.epochs x ceil(samples / batch_size); at least min_steps.
std::uint32_t fixed_work_steps(std::uint32_t train_steps, std::uint32_t train_epochs,
                               std::uint64_t batch_size, std::uint64_t samples,
                               std::uint32_t min_steps);

// server.max_local_steps = 0 bounds a client's deadline-sized work at this many times its fixed
// work: a fast device fills the round, but does not run tens of epochs over its own shard of the
// data (which pulls the model towards its local optimum) because one slow device set the round's
// length. Set server.max_local_steps for another bound.
inline constexpr std::uint32_t kDerivedWorkFactor = 4;

// server.max_local_steps = 0: kDerivedWorkFactor x fixed_work_steps(), at least min_steps.
std::uint32_t derived_max_steps(std::uint32_t train_steps, std::uint32_t train_epochs,
                                std::uint64_t batch_size, std::uint64_t samples,
                                std::uint32_t min_steps);

// One client's part in one federated round, as its "client" metrics record shows it.
struct ClientRoundRecord {
  std::uint64_t round_id = 0;
  std::string client;
  bool trained = false;
  std::uint32_t assigned_steps = 0;       // RoundStart.local_steps sent (0: as configured)
  std::uint32_t local_steps = 0;          // ClientReport.local_steps
  double measured_samples_per_s = 0;      // ClientReport.samples_per_second
  std::uint64_t peak_training_bytes = 0;  // ClientReport: its measured training-memory peak
  std::uint32_t micro_batch = 0;          // ClientReport: its memory plan (0: not said)
  std::uint32_t accumulation = 0;
  bool recompute = false;  // ClientReport: activations recomputed by segment
  // ClientReport: local training, pulling and pushing, and the whole round, in its seconds.
  double train_seconds = 0, comm_seconds = 0, round_seconds = 0;
  std::uint64_t participations = 0;  // complete updates so far, this one included
  ClientProfile profile;             // after this report
};

// The fields of the "client" record: round_id, client, trained, assigned_steps, local_steps,
// measured_samples_per_s, samples_per_s (the average), profile_reports, participations,
// peak_training_bytes, micro_batch, accumulation, recompute, train_seconds, comm_seconds,
// round_seconds, and per
// shard k down_bytes_per_s_<k> and up_bytes_per_s_<k> (averages; 0: not measured).
std::vector<MetricField> client_record_fields(const ClientRoundRecord& record);

}  // namespace cohort::server
