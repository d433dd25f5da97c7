// The fleet's memory plan: plan_memory()'s micro-batch per budget, with probes shared, the unfit
// clients and the compute-time factor.
#include "memory_budgets.h"

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/sim/sim.h"

namespace cohort::sim {
namespace {

using kernels::measure_peak_bytes;

struct Setup {
  kernels::NetworkSpec spec = kernels::make_network_spec("mlp:784-16-10");
  std::unique_ptr<kernels::Device> device = kernels::make_device("cpu", {.threads = 1});
  kernels::OptimizerOptions optimizer{.learning_rate = 0.05f, .momentum = 0.9f};
  std::size_t batch = 32;
  [[nodiscard]] std::size_t peak(std::size_t m) const {
    return measure_peak_bytes(spec, *device, optimizer, batch, m);
  }
};

TEST_CASE("each client gets plan_memory()'s micro-batch for its budget; too little is unfit") {
  const Setup s;
  const std::size_t whole = s.peak(s.batch), one = s.peak(1);
  REQUIRE(one < whole);  // this model's activations per sample make micro-batches pay
  const std::vector<std::size_t> budgets{
      0, whole, s.peak(16), s.peak(8), one, (one + whole) / 2, one - 1, 1000, s.peak(16)};
  const FleetMemory m =
      FleetMemory::plan(s.spec, *s.device, s.optimizer, s.batch, budgets, /*slowdown=*/1.5);
  CHECK(m.has_budgets());
  CHECK(m.clients() == budgets.size());
  CHECK(m.unfit() == 2);
  CHECK(m.minimum_bytes() == one);
  for (std::uint32_t c = 0; c < budgets.size(); ++c) {
    CAPTURE(budgets[c]);
    if (budgets[c] != 0 && budgets[c] < one) {
      CHECK_FALSE(m.fits(c));
      CHECK_THROWS_AS(
          kernels::plan_memory(s.spec, *s.device, s.optimizer, s.batch, budgets[c], "m"),
          ConfigError);
      continue;
    }
    CHECK(m.fits(c));
    const auto plan =
        kernels::plan_memory(s.spec, *s.device, s.optimizer, s.batch, budgets[c], "m");
    CHECK(m.micro_batch(c) == plan.network_micro_batch());
    CHECK(m.slowdown(c) == (plan.network_micro_batch() == 0 ? 1.0 : 1.5));
  }
  CHECK(m.micro_batch(0) == 0);  // unlimited
  CHECK(m.micro_batch(1) == 0);  // the whole batch fits
  CHECK(m.micro_batch(2) > 0);   // micro-batches
  CHECK(m.micro_batched() == budgets.size() - 2 - 2);
  CHECK_FALSE(m.slowdown_measured());

  const FleetMemory none;  // no budgets: everyone fits, whole batches
  CHECK_FALSE(none.has_budgets());
  CHECK(none.fits(12345));
  CHECK(none.micro_batch(12345) == 0);
  CHECK(none.slowdown(12345) == 1.0);
}

TEST_CASE("a budget that holds the whole batch trains whole; the minimum is the smaller peak") {
  Setup s;
  s.spec = kernels::make_network_spec("mlp:784-256-128-10");
  const std::size_t whole = s.peak(s.batch), one = s.peak(1);
  const std::size_t minimum = std::min(whole, one);
  const std::vector<std::size_t> budgets{whole, minimum, minimum - 1};
  const FleetMemory m = FleetMemory::plan(s.spec, *s.device, s.optimizer, s.batch, budgets, 2.0);
  CHECK(m.fits(0));
  CHECK(m.micro_batch(0) == 0);
  CHECK(m.fits(1));
  CHECK_FALSE(m.fits(2));
  CHECK(m.minimum_bytes() == minimum);
}

TEST_CASE("below one sample's kept peak a client recomputes activations, at its own factor") {
  Setup s;
  s.spec = kernels::make_network_spec("cnn:lenet5");
  s.batch = 8;
  const std::size_t one = s.peak(1);
  const std::size_t recomputed =
      measure_peak_bytes(s.spec, *s.device, s.optimizer, s.batch, 1, true);
  REQUIRE(recomputed < one);  // LeNet-5 keeps less than all its activations
  const std::vector<std::size_t> budgets{recomputed, one - 1, recomputed - 1, 0, one};
  const FleetMemory m = FleetMemory::plan(s.spec, *s.device, s.optimizer, s.batch, budgets, 0.0);
  CHECK(m.minimum_bytes() == recomputed);
  CHECK(m.recomputing() == 2);
  CHECK(m.unfit() == 1);
  for (std::uint32_t c : {0u, 1u}) {
    CAPTURE(c);
    CHECK(m.fits(c));
    CHECK(m.recompute(c));
    const auto plan =
        kernels::plan_memory(s.spec, *s.device, s.optimizer, s.batch, budgets[c], "m");
    CHECK(plan.recompute);
    CHECK(m.micro_batch(c) == plan.network_micro_batch());
    CHECK(m.slowdown(c) == m.recompute_slowdowns().at(plan.micro_batch));
    CHECK(m.slowdown(c) >= 1.0);
  }
  CHECK_FALSE(m.fits(2));
  CHECK_FALSE(m.recompute(3));
  CHECK(m.slowdown(3) == 1.0);
  CHECK_FALSE(m.recompute(4));  // one sample fits with its activations kept
  CHECK(m.micro_batch(4) == 1);
}

TEST_CASE("the slowdown of micro-batches is measured once per micro-batch in use, at least 1") {
  const Setup s;
  const std::vector<std::size_t> budgets{s.peak(8), s.peak(8), 0};
  const FleetMemory m = FleetMemory::plan(s.spec, *s.device, s.optimizer, s.batch, budgets, 0.0);
  CHECK(m.slowdown_measured());
  REQUIRE(m.slowdowns().size() == 1);
  CHECK(m.slowdowns().begin()->second >= 1.0);
  CHECK(m.slowdown(0) == m.slowdown(1));
  CHECK(m.slowdown(2) == 1.0);
  CHECK(measure_micro_batch_slowdown(s.spec, *s.device, s.optimizer, s.batch, 4) >= 1.0);
}

TEST_CASE(
    "plan_fleet_memory: nothing is measured without budgets; a fleet that cannot train is "
    "refused") {
  const auto config = [](std::vector<std::string> overrides) {
    overrides.push_back("model.spec=mlp:784-16-10");
    overrides.push_back("train.batch_size=32");
    return Config::load(sim_config_schema(), std::nullopt, overrides);
  };
  const Config unlimited = config({"sim.clients=5"});
  CHECK_FALSE(
      plan_fleet_memory(unlimited, sim_options_from(unlimited, Runner::kInProcess)).has_budgets());
  const Config tiny = config({"sim.clients=5", "profile.memory=uniform:1000:2000"});
  try {
    (void)plan_fleet_memory(tiny, sim_options_from(tiny, Runner::kInProcess));
    FAIL("a fleet without a client that can train should be refused");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("none of the 5 clients can train mlp:784-16-10 at batch 32") == 0);
    CHECK(what.find("minimum of ") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  const Config mixed = config({"sim.clients=40", "profile.memory=uniform:1000:2e6"});
  const FleetMemory m = plan_fleet_memory(mixed, sim_options_from(mixed, Runner::kInProcess));
  CHECK(m.clients() == 40);
  CHECK(m.unfit() > 0);
  CHECK(m.unfit() < 40);
}

}  // namespace
}  // namespace cohort::sim
