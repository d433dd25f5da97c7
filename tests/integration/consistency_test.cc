// The data-parallel consistency models and FedBuff, end to end with real processes.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "cohort/client/idx.h"
#include "cohort/client/participant.h"
#include "cohort/client/partition.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/loss.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/server/checkpoint.h"
#include "federation.h"

using namespace std::chrono_literals;
using cohort::test::Federation;

TEST_CASE("BSP data-parallel equals a single-process run of the same steps") {
  constexpr int kWorkers = 2, kSteps = 8, kBatch = 32;
  constexpr float kLr = 0.05f;
  Federation f(2, kWorkers,
               {"--server.mode=dataparallel", "--server.consistency=bsp",
                "--server.steps=" + std::to_string(kSteps), "--server.clients_per_round=2",
                "--server.min_clients=2", "--server_optimizer.lr=0.05",
                "--train.batch_size=" + std::to_string(kBatch), "--server.eval_every=0"});
  f.start();
  REQUIRE(f.wait(180s) == 0);
  const auto server = f.checkpointed_model();

  // The same steps in one process: every worker's batch gradient at x, summed in worker order.
  auto data = cohort::client::load_fashion_mnist();
  const auto partition = cohort::client::make_partition(cohort::client::parse_partition_spec("iid"),
                                                        data.train.labels(), kWorkers, 1);
  const auto spec = cohort::kernels::make_network_spec("mlp:784-256-128-10");
  auto device = cohort::kernels::make_device("cpu");
  auto net = device->make_network(spec);
  std::vector<float> x(spec.parameter_count());
  spec.initialize(1, x);
  std::vector<float> inputs, dlogits;
  std::vector<std::int32_t> labels;
  for (std::size_t step = 0; step < kSteps; ++step) {
    std::vector<float> sum(x.size(), 0.0f);
    for (int w = 0; w < kWorkers; ++w) {
      const auto rows =
          cohort::client::dataparallel_batch(partition[static_cast<std::size_t>(w)], step, kBatch,
                                             1 * 7919ULL + static_cast<std::uint64_t>(w));
      inputs.clear();
      labels.clear();
      for (auto r : rows) {
        const auto row = data.train.row(r);
        inputs.insert(inputs.end(), row.begin(), row.end());
        labels.push_back(data.train.labels()[r]);
      }
      std::copy(x.begin(), x.end(), net->parameters().begin());
      const auto logits = net->forward(inputs, rows.size(), true);
      dlogits.resize(logits.size());
      (void)cohort::kernels::softmax_cross_entropy(logits, labels, 10, dlogits);
      net->backward(dlogits);
      const auto g = net->gradients();
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
    }
    for (std::size_t i = 0; i < x.size(); ++i) x[i] -= kLr * sum[i];
  }
  REQUIRE(server.size() == x.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(x[i] - server[i])));
  MESSAGE("largest difference from the single-process run: " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("BSP with speed batches equals a single-process run over the same global batches") {
  constexpr int kWorkers = 3, kSteps = 10, kBatch = 16;
  constexpr float kLr = 0.05f;
  Federation f(
      2, kWorkers,
      {"--server.mode=dataparallel", "--server.consistency=bsp", "--server.batch_policy=speed",
       "--server.rebalance_every=2", "--server.steps=" + std::to_string(kSteps),
       "--server.clients_per_round=3", "--server.min_clients=3", "--server_optimizer.lr=0.05",
       "--train.batch_size=" + std::to_string(kBatch), "--server.eval_every=0"});
  f.client_extra[2] = {"--client.step_delay_ms=150"};  // a straggler: it gets smaller batches
  f.start();
  REQUIRE(f.wait(180s) == 0);
  const auto server = f.checkpointed_model();

  // Each worker's batch per step, as shard 0 handed it out.
  std::map<std::pair<std::int64_t, std::string>, std::uint32_t> batch;
  for (const auto& p : f.records("dp_pull")) {
    batch[{p["clock"].get<std::int64_t>(), p["worker"].get<std::string>()}] =
        p["batch"].get<std::uint32_t>();
  }
  REQUIRE(batch.size() == kWorkers * kSteps);
  int unequal = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::uint32_t sum = 0;
    for (int w = 0; w < kWorkers; ++w) sum += batch.at({step, "client-" + std::to_string(w)});
    CHECK(sum == kWorkers * kBatch);
    unequal += batch.at({step, "client-2"}) < batch.at({step, "client-0"}) ? 1 : 0;
  }
  MESSAGE("steps where the straggler took a smaller batch: " << unequal << " of " << kSteps);
  CHECK(unequal > 0);
  CHECK(!f.records("dp_rebalance").empty());

  // One process: each step's B samples (every worker's rows, in worker order) as one batch, the
  // mean gradient over B times n (BSP's step is the sum of the n workers' mean gradients).
  auto data = cohort::client::load_fashion_mnist();
  const auto partition = cohort::client::make_partition(cohort::client::parse_partition_spec("iid"),
                                                        data.train.labels(), kWorkers, 1);
  const auto spec = cohort::kernels::make_network_spec("mlp:784-256-128-10");
  auto device = cohort::kernels::make_device("cpu");
  auto net = device->make_network(spec);
  std::vector<float> x(spec.parameter_count());
  spec.initialize(1, x);
  std::vector<float> inputs, dlogits;
  std::vector<std::int32_t> labels;
  std::vector<std::uint64_t> cursor(kWorkers, 0);
  for (int step = 0; step < kSteps; ++step) {
    inputs.clear();
    labels.clear();
    for (int w = 0; w < kWorkers; ++w) {
      const auto b = batch.at({step, "client-" + std::to_string(w)});
      const auto rows =
          cohort::client::dataparallel_rows(partition[static_cast<std::size_t>(w)], cursor[w], b,
                                            1 * 7919ULL + static_cast<std::uint64_t>(w));
      cursor[w] += b;
      for (auto r : rows) {
        const auto row = data.train.row(r);
        inputs.insert(inputs.end(), row.begin(), row.end());
        labels.push_back(data.train.labels()[r]);
      }
    }
    REQUIRE(labels.size() == kWorkers * kBatch);
    std::copy(x.begin(), x.end(), net->parameters().begin());
    const auto logits = net->forward(inputs, labels.size(), true);
    dlogits.resize(logits.size());
    (void)cohort::kernels::softmax_cross_entropy(logits, labels, 10, dlogits);
    net->backward(dlogits);
    const auto g = net->gradients();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] -= kLr * kWorkers * g[i];
  }
  REQUIRE(server.size() == x.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(x[i] - server[i])));
  MESSAGE("largest difference from the single-process run: " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("SSP never lets a worker run more than s clocks ahead of the slowest") {
  constexpr int kBound = 2;
  Federation f(1, 3,
               {"--server.mode=dataparallel", "--server.consistency=ssp",
                "--server.staleness=" + std::to_string(kBound), "--server.steps=12",
                "--server.clients_per_round=3", "--server.min_clients=3",
                "--server_optimizer.lr=0.05", "--server.eval_every=0"});
  f.client_extra[2] = {"--client.step_delay_ms=150"};  // a straggler
  f.start();
  REQUIRE(f.wait(180s) == 0);
  const auto pulls = f.records("dp_pull");
  REQUIRE(pulls.size() == 36);
  int at_bound = 0;
  for (const auto& p : pulls) {
    const auto ahead = p["clock"].get<std::int64_t>() - p["min_clock"].get<std::int64_t>();
    CHECK(ahead <= kBound);
    at_bound += ahead == kBound ? 1 : 0;
  }
  CHECK(at_bound > 0);  // the fast workers did run up to the bound, and were held there
}

TEST_CASE("FedBuff with zero staleness and K = cohort size takes exactly a FedAvg step") {
  const std::vector<std::string> common{"--server.rounds=1", "--server.min_clients=3",
                                        "--server.eval_every=0", "--train.epochs=1"};
  // FedAvg's clients run train.epochs as FedBuff's do (server.work = deadline would start them on
  // server.min_local_steps).
  auto args = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  Federation avg(
      1, 3,
      args({"--server.mode=federated", "--server.clients_per_round=3", "--server.work=fixed"}));
  avg.start();
  REQUIRE(avg.wait(180s) == 0);
  Federation buf(1, 3,
                 args({"--server.mode=fedbuff", "--server.buffer_size=3", "--server.concurrency=3",
                       "--server.max_staleness=0"}));
  buf.start();
  REQUIRE(buf.wait(180s) == 0);
  const auto a = avg.checkpointed_model(), b = buf.checkpointed_model();
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i] - b[i])));
  MESSAGE("largest difference between the FedBuff and FedAvg steps: " << worst);
  CHECK(worst <= 1e-5);
  // And the step really moved the model away from its initialisation.
  std::vector<float> init(a.size());
  cohort::kernels::make_network_spec("mlp:784-256-128-10").initialize(1, init);
  double moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    moved = std::max(moved, std::abs(static_cast<double>(a[i] - init[i])));
  MESSAGE("largest change of a parameter in the step: " << moved);
  CHECK(moved > 1e-3);
}
