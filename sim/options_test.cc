// SimOptions at the edge: filled and checked from a simulation's Config, per runner.
#include "options.h"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/sim/sim.h"

namespace cohort::sim {
namespace {

Config load(std::vector<std::string> overrides) {
  return Config::load(sim_config_schema(), std::nullopt, overrides);
}

TEST_CASE("sim_options_from fills the typed options, per runner, with the keys' clear errors") {
  const SimOptions o = sim_options_from(
      load({"sim.clients=7", "sim.threads=3", "server.clients_per_round=0",
            "server.round_deadline_ms=2500", "data.partition=dirichlet:0.3", "data.seed=5",
            "profile.gflops=uniform:1:3", "profile.availability=diurnal:0.2:0.9",
            "sim.csv_file=", "sim.progress=false"}),
      Runner::kInProcess);
  CHECK(o.clients == 7);
  CHECK(o.threads == 3);
  CHECK(o.server.mode == ServerMode::kFederated);
  CHECK(o.server.clients_per_round == 1);  // at least one
  CHECK(o.server.round_deadline_s == doctest::Approx(2.5));
  CHECK(o.data.partition.kind == client::PartitionKind::kDirichlet);
  CHECK(o.data.partition_text == "dirichlet:0.3");
  CHECK(o.data.seed == 5);
  CHECK(o.profile.spec.gflops.kind == Distribution::Kind::kUniform);
  CHECK(o.profile.spec.online_min == doctest::Approx(0.2));
  CHECK(o.report.csv_file.empty());
  CHECK_FALSE(o.report.progress);
  // metrics.tensorboard_dir: the simulator's scalars in DIR/sim, the coordinator's in DIR/server.
  CHECK(o.report.tensorboard_dir.empty());
  const Config tb = load({"metrics.tensorboard_dir=runs/a"});
  CHECK(sim_options_from(tb, Runner::kInProcess).report.tensorboard_dir == "runs/a/sim");
  CHECK(server_tensorboard_dir(tb) == "runs/a/server");
  CHECK(server_tensorboard_dir(load({})).empty());

  // The in-process fleet simulates federated rounds and device profiles; --processes hands the
  // mode to cohort-server and has no profiles.
  const Config fedbuff = load({"server.mode=fedbuff", "profile.gflops=fast"});
  CHECK_THROWS_WITH_AS(sim_options_from(fedbuff, Runner::kInProcess),
                       "cohort-sim simulates federated rounds: server.mode must be \"federated\"",
                       ConfigError);
  CHECK(sim_options_from(fedbuff, Runner::kProcesses).server.mode == ServerMode::kOther);
  CHECK_THROWS_WITH_AS(sim_options_from(load({"profile.gflops=fast"}), Runner::kInProcess),
                       doctest::Contains("profile.gflops"), ConfigError);
  CHECK_THROWS_WITH_AS(sim_options_from(load({"profile.dropout=1.5"}), Runner::kInProcess),
                       "profile.dropout must be in [0, 1]", ConfigError);
  // A trace overrides profile.*, which is then not read.
  CHECK_NOTHROW(sim_options_from(load({"sim.profile_trace=devices.csv", "profile.gflops=fast"}),
                                 Runner::kInProcess));

  CHECK_THROWS_WITH_AS(sim_options_from(load({"sim.clients=0"}), Runner::kProcesses),
                       "sim.clients must be at least 1", ConfigError);
  CHECK_THROWS_WITH_AS(sim_options_from(load({"sim.threads=2000"}), Runner::kInProcess),
                       "sim.threads must be between 0 and 1024, got 2000", ConfigError);
  CHECK_THROWS_WITH_AS(
      sim_options_from(load({"sim.clients=201"}), Runner::kProcesses),
      "--processes starts one process per client: sim.clients must be 1..200, got 201",
      ConfigError);
  CHECK_THROWS_WITH_AS(
      sim_options_from(load({"train.reset_optimizer_state=false"}), Runner::kInProcess),
      doctest::Contains("train.reset_optimizer_state = false is not simulated"), ConfigError);
}

TEST_CASE("profile.memory: unlimited by default, else a distribution of bytes") {
  const SimOptions none = sim_options_from(load({}), Runner::kInProcess);
  CHECK(none.profile.spec.memory_bytes.kind == Distribution::Kind::kConst);
  CHECK(none.profile.spec.memory_bytes.a == 0.0);
  CHECK(none.micro_batch_slowdown == 0.0);  // measured
  const SimOptions some = sim_options_from(
      load({"profile.memory=uniform:1e5:4e6", "sim.micro_batch_slowdown=1.5"}), Runner::kInProcess);
  CHECK(some.profile.spec.memory_bytes.kind == Distribution::Kind::kUniform);
  CHECK(some.profile.spec.memory_bytes.b == 4e6);
  CHECK(some.micro_batch_slowdown == 1.5);
  CHECK_THROWS_WITH_AS(sim_options_from(load({"profile.memory=-5"}), Runner::kInProcess),
                       doctest::Contains("profile.memory"), ConfigError);
  CHECK_THROWS_WITH_AS(
      sim_options_from(load({"sim.micro_batch_slowdown=0.5"}), Runner::kInProcess),
      doctest::Contains("sim.micro_batch_slowdown must be 0 (measure it) or a factor >= 1"),
      ConfigError);
  // --processes has no device profiles: neither key is read.
  CHECK_NOTHROW(sim_options_from(load({"profile.memory=-5", "sim.micro_batch_slowdown=0.5"}),
                                 Runner::kProcesses));
}

TEST_CASE("server.work = deadline (the default) plans against the simulated deadline") {
  if (sim_config_schema().find("server.work") == nullptr) {
    // This server has no heterogeneity-aware work yet: the key is unknown.
    CHECK_THROWS_AS((void)load({"server.work=deadline"}), ConfigError);
    return;
  }
  CHECK(sim_options_from(load({}), Runner::kInProcess).server.deadline_work);  // the default
  CHECK(sim_options_from(load({"server.work=deadline"}), Runner::kInProcess).server.deadline_work);
  CHECK_FALSE(
      sim_options_from(load({"server.work=fixed"}), Runner::kInProcess).server.deadline_work);
  // Work is planned against the simulated deadline, rounds close at sim.wall_deadline_ms of host
  // time: the two go together.
  CHECK(sim_options_from(load({"server.work=deadline", "sim.wall_deadline_ms=5000"}),
                         Runner::kInProcess)
            .wall_deadline_ms == 5000);
  // Real processes run on real time: server.work goes to cohort-server, which sizes work to
  // server.round_deadline_ms itself; --processes has no use for sim.wall_deadline_ms.
  CHECK_NOTHROW(sim_options_from(load({"server.work=deadline", "sim.wall_deadline_ms=5000"}),
                                 Runner::kProcesses));
}

}  // namespace
}  // namespace cohort::sim
