// Clients and workers really slower: a CPU quota on one process (a cgroup, root only).
// Data-parallel BSP: equal batches against speed-proportional ones (docs/ALGORITHMS.md 3.4). The
// steps per second of both runs are printed, never asserted (timings depend on the machine); what
// is asserted holds on any machine: every step's batches sum to the global batch, the equal run
// keeps train.batch_size each, the speed run rebalanced. Federated with server.work = deadline:
// once measured, the throttled client is given fewer local steps than the others, and it runs
// what it is given. Its own binary: it skips where no cgroup can be made.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "cpu_limit.h"
#include "federation.h"
#include "skip.h"

using namespace std::chrono_literals;
using cohort::test::CpuLimit;
using cohort::test::Federation;

namespace {

struct Outcome {
  double steps_per_s = 0;
  std::map<std::string, std::uint32_t> last_batches;  // each worker's batch at the last step
  std::string rebalances;                             // "step: batches" at each rebalance
};

constexpr int kWorkers = 3, kSteps = 60, kBatch = 256;

Outcome run(const std::string& policy, CpuLimit& slow) {
  std::vector<std::string> args{"--server.mode=dataparallel",
                                "--server.consistency=bsp",
                                "--server.batch_policy=" + policy,
                                "--server.steps=" + std::to_string(kSteps),
                                "--server.clients_per_round=" + std::to_string(kWorkers),
                                "--server.min_clients=" + std::to_string(kWorkers),
                                "--train.batch_size=" + std::to_string(kBatch),
                                "--server.eval_every=0"};
  if (policy == "speed") args.emplace_back("--server.rebalance_every=20");
  Federation f(1, kWorkers, args);
  for (int i = 0; i < kWorkers; ++i) f.client_extra[i] = {"--client.threads=1"};
  f.start_servers();
  for (int i = 0; i < kWorkers; ++i) {
    f.start_client(i);
    if (i == kWorkers - 1) REQUIRE(slow.add(f.clients.back().pid()));
  }
  REQUIRE(f.wait(300s) == 0);
  Outcome o;
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 1);
  o.steps_per_s = kSteps / rounds[0]["round_seconds"].get<double>();
  std::map<std::int64_t, std::uint32_t> sums;
  for (const auto& p : f.records("dp_pull")) {
    const auto clock = p["clock"].get<std::int64_t>();
    const auto b = p["batch"].get<std::uint32_t>();
    sums[clock] += b;
    if (policy == "equal") CHECK(b == kBatch);
    if (clock == kSteps - 1) o.last_batches[p["worker"].get<std::string>()] = b;
  }
  CHECK(sums.size() == kSteps);
  for (const auto& [clock, sum] : sums) CHECK(sum == kWorkers * kBatch);
  const auto rebalances = f.records("dp_rebalance");
  if (policy == "speed") CHECK(!rebalances.empty());
  std::int64_t at = -1;
  for (const auto& r : rebalances) {
    if (r["step"].get<std::int64_t>() != at) {
      at = r["step"].get<std::int64_t>();
      o.rebalances += "\n  from step " + std::to_string(at) + ":";
    }
    std::ostringstream speed;
    speed.precision(4);
    speed << r["speed"].get<double>();
    o.rebalances += " " + r["worker"].get<std::string>() + " " +
                    std::to_string(r["batch"].get<std::uint32_t>()) + " (" + speed.str() + "/s)";
  }
  return o;
}

}  // namespace

TEST_CASE("BSP with one worker held to a quarter CPU: speed batches against equal batches") {
  std::string why;
  auto slow = CpuLimit::make(0.25, why);
  if (!slow) {
    cohort::test::skip_test_case(why);
    return;
  }
  const Outcome equal = run("equal", *slow);
  const Outcome speed = run("speed", *slow);
  std::ostringstream batches;
  for (const auto& [w, b] : speed.last_batches) batches << ' ' << w << '=' << b;
  MESSAGE("steps/s: equal " << equal.steps_per_s << ", speed " << speed.steps_per_s << " (x"
                            << speed.steps_per_s / equal.steps_per_s
                            << "); speed batches at the last step:" << batches.str()
                            << "; rebalances (batch, measured samples/s):" << speed.rebalances);
}

TEST_CASE(
    "federated, server.work = deadline, one client held to a tenth of a CPU: it is given fewer "
    "steps") {
  std::string why;
  auto slow = CpuLimit::make(0.1, why);
  if (!slow) {
    cohort::test::skip_test_case(why);
    return;
  }
  constexpr int kClients = 3, kRounds = 5;
  // A model and a deadline that no client fills with train.epochs = 1 (313 steps of 64 over its
  // 20000 samples, the most it may be given): what each is given follows its measured speed.
  Federation f(
      1, kClients,
      {"--server.mode=federated", "--server.work=deadline",
       "--server.rounds=" + std::to_string(kRounds),
       "--server.clients_per_round=" + std::to_string(kClients),
       "--server.min_clients=" + std::to_string(kClients), "--server.round_deadline_ms=1000",
       "--model.spec=cnn:lenet5", "--server.min_local_steps=5", "--server.eval_every=0",
       "--train.epochs=1", "--train.batch_size=64"});
  for (int i = 0; i < kClients; ++i) f.client_extra[i] = {"--client.threads=1"};
  f.start_servers();
  for (int i = 0; i < kClients; ++i) {
    f.start_client(i);
    if (i == kClients - 1) REQUIRE(slow->add(f.clients.back().pid()));
  }
  REQUIRE(f.wait(300s) == 0);
  REQUIRE(f.records("round").size() == kRounds);
  const std::string slow_id = "client-" + std::to_string(kClients - 1);
  // Per client, round id -> steps given. A client still busy when a round starts (its last round
  // overran the deadline on a loaded host) is not selected for it and has no record there.
  std::map<std::string, std::map<std::uint64_t, std::uint64_t>> assigned;
  std::map<std::string, double> speed;  // the last measured samples/s
  std::uint64_t first_round = ~std::uint64_t{0};
  for (const auto& c : f.records("client")) {
    const std::string id = c["client"];
    const auto round = c["round_id"].get<std::uint64_t>();
    assigned[id][round] = c["assigned_steps"].get<std::uint64_t>();
    first_round = std::min(first_round, round);
    if (c["trained"].get<bool>()) CHECK(c["local_steps"] == c["assigned_steps"]);
    speed[id] = c["measured_samples_per_s"].get<double>();
  }
  std::ostringstream text;
  for (const auto& [id, steps] : assigned) {
    text << "\n  " << id << " (" << speed[id] << " samples/s):";
    for (const auto& [round, s] : steps) text << " r" << round << ':' << s;
  }
  MESSAGE("local steps given per round:" << text.str());
  REQUIRE(assigned.size() == kClients);
  // Round 1: nobody measured yet, everyone gets server.min_local_steps. From round 2 on the slow
  // client is given fewer steps than each fast one, in every round both were selected for (at
  // least two of the four).
  for (auto& [id, steps] : assigned) {
    const std::string who = id;
    CAPTURE(who);
    REQUIRE(steps.contains(first_round));
    CHECK(steps[first_round] == 5);
  }
  auto& slow_steps = assigned[slow_id];
  for (auto& [id, steps] : assigned) {
    if (id == slow_id) continue;
    const std::string who = id;
    CAPTURE(who);
    int compared = 0;
    for (const auto& [round, s] : steps) {
      if (round == first_round || !slow_steps.contains(round)) continue;
      const std::uint64_t r = round;
      CAPTURE(r);
      CHECK(slow_steps[round] < s);
      ++compared;
    }
    CHECK(compared >= 2);
  }
}
