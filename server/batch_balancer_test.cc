// Speed-proportional batches (docs/ALGORITHMS.md 3.4): the balancer alone, then a BSP shard that
// hands the batches out and steps on gradient sums, driven with a manual clock, no sockets.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/random.h"

#include "batch_balancer.h"
#include "options.h"
#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;

std::uint64_t total(const std::vector<std::uint64_t>& b) {
  return std::accumulate(b.begin(), b.end(), std::uint64_t{0});
}

TEST_CASE("speed_batches: equal speeds give equal batches") {
  const std::vector<double> speeds(4, 250.0);
  CHECK(speed_batches(speeds, 64, 0) == std::vector<std::uint64_t>(4, 16));
  const std::vector<double> three(3, 7.5);  // 10 = 4 + 3 + 3: the leftover goes to the first
  CHECK(speed_batches(three, 10, 0) == std::vector<std::uint64_t>{4, 3, 3});
}

TEST_CASE("speed_batches: one worker k times slower gets about B / (k (n - 1) + 1)") {
  for (const double k : {2.0, 4.0, 10.0}) {
    for (const std::size_t n : {2UL, 4UL, 8UL}) {
      std::vector<double> speeds(n, 100.0 * k);
      speeds[1] = 100.0;
      const std::uint64_t global = 64 * n;
      const auto b = speed_batches(speeds, global, 0);
      const double expect = double(global) / (k * double(n - 1) + 1);
      INFO("k = " << k << ", n = " << n << ", b_slow = " << b[1] << ", expected " << expect);
      CHECK(std::abs(double(b[1]) - expect) < 1.0);
      CHECK(total(b) == global);
      for (std::size_t p = 0; p < n; ++p) {
        if (p != 1) CHECK(std::abs(double(b[p]) - k * expect) < 1.0);
      }
    }
  }
}

TEST_CASE("speed_batches: a capped worker's excess goes to the others in proportion to speed") {
  // Uncapped the fast worker would take 24 of 30; at 12 the other 18 go 1 : 1, then 1 : 2.
  CHECK(speed_batches(std::vector<double>{1, 1, 8}, 30, 12) ==
        std::vector<std::uint64_t>{9, 9, 12});
  CHECK(speed_batches(std::vector<double>{1, 2, 8}, 30, 12) ==
        std::vector<std::uint64_t>{6, 12, 12});
  // Every worker capped exactly at the global batch's share: all at the cap.
  CHECK(speed_batches(std::vector<double>{1, 5, 9}, 30, 10) ==
        std::vector<std::uint64_t>{10, 10, 10});
}

TEST_CASE("speed_batches: every worker keeps at least one sample") {
  // The slow worker's share is 0.005: it takes 1, the two fast ones split the other 9 (tie: the
  // first gets the leftover).
  CHECK(speed_batches(std::vector<double>{1, 1000, 1000}, 10, 0) ==
        std::vector<std::uint64_t>{1, 5, 4});
  CHECK(speed_batches(std::vector<double>{1, 1, 1}, 3, 1) == std::vector<std::uint64_t>{1, 1, 1});
}

TEST_CASE("speed_batches: over random speeds the sum is B, bounds hold, faster never gets less") {
  Rng rng(2026);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng.below(9);
    std::vector<double> speeds(n);
    for (auto& s : speeds) s = std::exp(4.0 * rng.uniform());  // a spread up to e^4 = 55x
    const std::uint64_t per = 1 + rng.below(64);
    const std::uint64_t global = per * n;
    const std::uint64_t cap = rng.below(2) == 0 ? 0 : per + rng.below(3 * per);
    const auto b = speed_batches(speeds, global, cap);
    INFO("trial " << trial << ": n = " << n << ", B = " << global << ", cap = " << cap);
    REQUIRE(b.size() == n);
    CHECK(total(b) == global);
    for (std::size_t p = 0; p < n; ++p) {
      CHECK(b[p] >= 1);
      if (cap > 0) CHECK(b[p] <= cap);
      for (std::size_t q = 0; q < n; ++q) {
        if (speeds[p] > speeds[q]) CHECK(b[p] >= b[q]);
      }
    }
  }
}

TEST_CASE("speed_batches: an impossible split is a bug, not a silent answer") {
  CHECK_THROWS_AS((void)speed_batches(std::vector<double>{1, 1, 1}, 2, 0), InternalError);
  CHECK_THROWS_AS((void)speed_batches(std::vector<double>{1, 1}, 10, 4), InternalError);
  CHECK_THROWS_AS((void)speed_batches(std::vector<double>{1, 0}, 10, 0), InternalError);
}

TEST_CASE("BatchBalancer: step 0 unmeasured, first split once all are timed, then every K") {
  BatchBalancer bal(2, 8, 0, 3);
  CHECK(bal.batch("a", 0) == 8);
  bal.measured("a", 0, 0.001);  // start-up: ignored
  bal.measured("b", 0, 1.0);
  CHECK_FALSE(bal.step_closed(0));
  bal.measured("a", 1, 1.0);        // 8 samples/s
  CHECK_FALSE(bal.step_closed(1));  // b has no speed yet
  bal.measured("b", 2, 3.0);        // 8/3 samples/s: a is 3x faster
  CHECK(bal.step_closed(2));
  CHECK(bal.batch("a", 3) == 12);
  CHECK(bal.batch("b", 3) == 4);
  CHECK(bal.batch("a", 2) == 8);  // the step that closed keeps its batches
  // Equal times from now on: the moving average moves a's speed (12/s) and b's (4/s) toward
  // equal, but the next split waits for step 5 (K = 3: after steps 2, 5, 8, ...).
  bal.measured("a", 3, 1.0);
  bal.measured("b", 3, 1.0);
  CHECK(bal.speeds().at("a") == doctest::Approx(8 + BatchBalancer::kSmoothing * (12 - 8)));
  CHECK(bal.speeds().at("b") ==
        doctest::Approx(8.0 / 3 + BatchBalancer::kSmoothing * (4 - 8.0 / 3)));
  CHECK_FALSE(bal.step_closed(3));
  CHECK_FALSE(bal.step_closed(4));
  CHECK(bal.batch("a", 5) == 12);
  CHECK(bal.step_closed(5));
  CHECK(bal.batch("a", 6) + bal.batch("b", 6) == 16);
}

// ---- the shard ----------------------------------------------------------------------------

constexpr std::uint64_t kModelSize = 6;  // mlp:2-2

struct SpeedShard {
  explicit SpeedShard(std::vector<std::string> overrides)
      : options(testing::make_options(std::move(overrides))),
        registries(builtin_registries()),
        shard(options, registries, out, nullptr, clock) {
    shard.setup("mlp:2-2", kModelSize);
  }
  void pull(const NodeId& w, std::uint64_t clock_value) {
    auto m = testing::message(
        w, transport::Pull{
               .shard = 0, .begin = shard.begin(), .end = shard.end(), .min_version = clock_value});
    REQUIRE(shard.handle(m));
  }
  // The last PullReply's batch to `w`, and how many `w` got.
  std::pair<std::uint32_t, std::size_t> replies(const NodeId& w) const {
    std::pair<std::uint32_t, std::size_t> r{0, 0};
    for (const auto& [sent, reply] : out.of<transport::PullReply>()) {
      if (sent.peer != "peer:" + w) continue;
      r = {reply.batch_size, r.second + 1};
    }
    return r;
  }
  // Pushes `g` for clock `c` over `samples`; the ack.
  transport::PushAck push(const NodeId& w, std::uint64_t c, std::uint64_t samples,
                          std::vector<float>& g) {
    auto m = testing::push_all(w,
                               transport::Push{.shard = 0,
                                               .begin = shard.begin(),
                                               .end = shard.end(),
                                               .num_samples = samples,
                                               .kind = transport::PushKind::kGradient,
                                               .clock = c},
                               1, ++seq, g);
    REQUIRE(shard.handle(m));
    const auto acks = out.of<transport::PushAck>();
    REQUIRE(!acks.empty());
    return acks.back().second;
  }
  std::vector<float> params() const { return {shard.params().begin(), shard.params().end()}; }

  ManualClock clock;
  ServerOptions options;
  Registries registries;
  testing::RecordingOutbox out;
  Shard shard;
  std::uint64_t seq = 0;
};

// The per-sample gradient j of a worker: distinct values, so a lost or double-counted sample
// shows.
std::vector<float> sample_gradient(int worker, std::uint64_t j) {
  std::vector<float> g(kModelSize);
  for (std::size_t i = 0; i < kModelSize; ++i)
    g[i] = 0.01f * float(worker + 1) + 0.001f * float(j) - 0.002f * float(i);
  return g;
}

std::vector<float> gradient_sum(int worker, std::uint64_t samples) {
  std::vector<float> sum(kModelSize, 0.0f);
  for (std::uint64_t j = 0; j < samples; ++j) {
    const auto g = sample_gradient(worker, j);
    for (std::size_t i = 0; i < kModelSize; ++i) sum[i] += g[i];
  }
  return sum;
}

TEST_CASE(
    "BSP speed batches: shard 0 sizes each worker's batch from its step time, and a step over "
    "unequal batches is the step over all B samples") {
  SpeedShard f({"server.mode=dataparallel", "server.consistency=bsp", "server.batch_policy=speed",
                "server.clients_per_round=2", "train.batch_size=4", "server.rebalance_every=50",
                "server_optimizer.name=sgd", "server_optimizer.lr=0.5"});
  // Steps 0 and 1 at the equal split, 4 each; a takes 1 s a step, b 4 s (a is 4x faster).
  for (std::uint64_t c = 0; c < 2; ++c) {
    f.pull("a", c);
    f.pull("b", c);
    CHECK(f.replies("a") == std::pair<std::uint32_t, std::size_t>{4, c + 1});
    CHECK(f.replies("b") == std::pair<std::uint32_t, std::size_t>{4, c + 1});
    f.clock.advance(1s);
    auto ga = gradient_sum(0, 4);
    CHECK(f.push("a", c, 4, ga).accepted);
    f.clock.advance(3s);
    auto gb = gradient_sum(1, 4);
    CHECK(f.push("b", c, 4, gb).accepted);
  }
  CHECK(f.shard.version() == 2);
  // Speeds 4/s and 1/s: B = 8 splits 6.4 : 1.6, rounded 6 : 2, from step 2 on.
  f.pull("a", 2);
  f.pull("b", 2);
  CHECK(f.replies("a").first == 6);
  CHECK(f.replies("b").first == 2);

  SUBCASE("a gradient over another number of samples than the batch is refused") {
    auto g = gradient_sum(0, 4);
    const auto ack = f.push("a", 2, 4, g);
    CHECK_FALSE(ack.accepted);
    CHECK(ack.reason == "gradient over 4 samples, but the batch for clock 2 is 6");
    auto none = gradient_sum(1, 2);
    CHECK(f.push("b", 2, 0, none).reason ==
          "gradient over 0 samples (server.batch_policy = speed weighs each by its samples)");
  }
  SUBCASE("the step: x - lr (n / B) sum of the 8 samples' gradients") {
    const auto before = f.params();
    auto ga = gradient_sum(0, 6), gb = gradient_sum(1, 2);
    CHECK(f.push("b", 2, 2, gb).accepted);
    CHECK(f.push("a", 2, 6, ga).accepted);
    CHECK(f.shard.version() == 3);
    std::vector<double> all(kModelSize, 0.0);  // one process, one batch of 8, in double
    for (int w = 0; w < 2; ++w) {
      for (std::uint64_t j = 0; j < (w == 0 ? 6U : 2U); ++j) {
        const auto g = sample_gradient(w, j);
        for (std::size_t i = 0; i < kModelSize; ++i) all[i] += g[i];
      }
    }
    const auto after = f.params();
    for (std::size_t i = 0; i < kModelSize; ++i) {
      const double expect = double(before[i]) - 0.5 * (2.0 / 8.0) * all[i];
      CHECK(double(after[i]) == doctest::Approx(expect).epsilon(1e-6));
    }
  }
}

TEST_CASE("BSP speed batches with equal batches take the equal policy's step, bit for bit") {
  SpeedShard speed({"server.mode=dataparallel", "server.consistency=bsp",
                    "server.batch_policy=speed", "server.clients_per_round=2", "train.batch_size=4",
                    "server_optimizer.lr=0.3"});
  SpeedShard equal({"server.mode=dataparallel", "server.consistency=bsp",
                    "server.clients_per_round=2", "train.batch_size=4", "server_optimizer.lr=0.3"});
  REQUIRE(speed.params() == equal.params());
  // Sums over 4 samples are 4 x the means exactly (a power of two), and so is n / B = 1/4.
  auto sa = gradient_sum(0, 4), sb = gradient_sum(1, 4);
  std::vector<float> ma(kModelSize), mb(kModelSize);
  for (std::size_t i = 0; i < kModelSize; ++i) {
    ma[i] = sa[i] / 4;
    mb[i] = sb[i] / 4;
  }
  CHECK(speed.push("a", 0, 4, sa).accepted);
  CHECK(speed.push("b", 0, 4, sb).accepted);
  CHECK(equal.push("a", 0, 4, ma).accepted);
  CHECK(equal.push("b", 0, 4, mb).accepted);
  CHECK(speed.shard.version() == 1);
  CHECK(speed.params() == equal.params());
  CHECK(speed.params() != SpeedShard({"server.mode=dataparallel"}).params());
}

TEST_CASE("server.batch_policy and its keys: start-up refuses what cannot be honoured") {
  const std::vector<std::string> dp{"server.mode=dataparallel"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), dp.begin(), dp.end());
    return more;
  };
  CHECK(testing::validate_error(with({"server.batch_policy=speed"})).empty());
  CHECK(testing::validate_error(with({"server.batch_policy=speed", "server.max_worker_batch=64",
                                      "server.rebalance_every=10"}))
            .empty());
  CHECK(testing::validate_error(with({"server.batch_policy=fast"})) ==
        "server.batch_policy must be equal or speed, got 'fast'");
  CHECK(testing::validate_error(with({"server.batch_policy=speed", "server.consistency=asp"})) ==
        "server.batch_policy = speed needs server.consistency = bsp (ASP and SSP keep equal "
        "batches: their pace is not set by the slowest worker), got 'asp'");
  CHECK(testing::validate_error(with({"server.batch_policy=speed", "server.consistency=ssp"}))
            .find("got 'ssp'") != std::string::npos);
  CHECK(testing::validate_error(with({"server.max_worker_batch=64"})) ==
        "server.max_worker_batch applies to server.batch_policy = speed only");
  CHECK(testing::validate_error(with({"server.batch_policy=equal", "server.rebalance_every=5"})) ==
        "server.rebalance_every applies to server.batch_policy = speed only");
  CHECK(testing::validate_error(with({"server.batch_policy=speed", "server.rebalance_every=0"})) ==
        "server.rebalance_every must be >= 1, got 0");
  CHECK(testing::validate_error(with(
            {"server.batch_policy=speed", "train.batch_size=32", "server.max_worker_batch=16"})) ==
        "server.max_worker_batch must be 0 (no cap) or at least train.batch_size = 32 (the "
        "workers must be able to take the global batch), got 16");
  CHECK(testing::validate_error(with({"server.batch_policy=speed", "train.batch_size=1000000000",
                                      "server.clients_per_round=5"}))
            .find("must fit in 32 bits") != std::string::npos);
  CHECK(testing::validate_error({"server.mode=federated", "server.batch_policy=equal"}) ==
        "server.batch_policy applies to server.mode = dataparallel only, not federated");
  CHECK(testing::validate_error({"server.mode=fedbuff", "server.rebalance_every=3"}) ==
        "server.rebalance_every applies to server.mode = dataparallel only, not fedbuff");
  // A local training rule would be ignored by data-parallel workers: refused, not ignored.
  CHECK(testing::validate_error({"server.mode=dataparallel", "train.rule=clipped_sgd:1"})
            .starts_with("train.rule applies to server.mode = federated"));
}

}  // namespace
}  // namespace cohort::server
