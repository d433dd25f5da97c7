#include "sim_clock.h"

#include <doctest/doctest.h>

#include <cmath>

#include "cohort/core/error.h"

namespace cohort::sim {
namespace {

TEST_CASE("client_time is latency plus bytes over bandwidth plus work over speed") {
  DeviceProfile p;
  p.gflops = 2;
  p.uplink_mbps = 4;
  p.downlink_mbps = 8;
  p.latency_ms = 25;
  const ClientTime t = client_time(p, {1'000'000, 500'000, 3e9});
  CHECK(t.download_s == doctest::Approx(0.025 + 8e6 / 8e6));
  CHECK(t.compute_s == doctest::Approx(1.5));
  CHECK(t.upload_s == doctest::Approx(0.025 + 4e6 / 4e6));
  CHECK(t.total() == doctest::Approx(t.download_s + t.compute_s + t.upload_s));
  CHECK(training_flops(1000, 10) == 60000.0);
  // Micro-batches under a memory budget: the compute time only, by the factor; 1 is exact.
  const ClientTime slow = client_time(p, {1'000'000, 500'000, 3e9, 1.25});
  CHECK(slow.compute_s == doctest::Approx(1.875));
  CHECK(slow.download_s == t.download_s);
  CHECK(slow.upload_s == t.upload_s);
  CHECK(client_time(p, {1'000'000, 500'000, 3e9, 1.0}).compute_s == t.compute_s);
}

TEST_CASE("samples_per_round follows the trainer's epochs, steps and drop_last") {
  CHECK(samples_per_round(100, 32, 2, 0, false) == 200);
  CHECK(samples_per_round(100, 32, 2, 0, true) == 192);
  // 100 rows of batch 32: 32, 32, 32, 4 per epoch; five steps are an epoch and one more batch.
  CHECK(samples_per_round(100, 32, 1, 5, false) == 132);
  CHECK(samples_per_round(100, 32, 1, 3, false) == 96);
  CHECK(samples_per_round(100, 32, 1, 8, false) == 200);
  CHECK(samples_per_round(100, 32, 1, 5, true) == 160);  // only full batches: 3 per epoch
  CHECK(samples_per_round(10, 32, 1, 5, false) == 50);
  CHECK(samples_per_round(10, 32, 1, 5, true) == 0);  // no full batch
  CHECK(samples_per_round(0, 32, 1, 0, false) == 0);
}

TEST_CASE("plan_round closes at the K-th finish and cuts the rest") {
  const std::vector<Selected> s{{5.0, false}, {1.0, false}, {3.0, false}, {2.0, false}};
  const RoundPlan p = plan_round(s, 2, 100.0);
  CHECK(p.completes == 2);
  CHECK(p.close_s == 2.0);
  CHECK(p.fate == std::vector<Fate>{Fate::kCut, Fate::kCompletes, Fate::kCut, Fate::kCompletes});
}

TEST_CASE("plan_round waits for the deadline when a client is silent or too slow") {
  SUBCASE("silent") {
    const std::vector<Selected> s{{1.0, false}, {0.0, true}, {2.0, false}};
    const RoundPlan p = plan_round(s, 3, 10.0);
    CHECK(p.completes == 2);
    CHECK(p.close_s == 10.0);
    CHECK(p.fate[1] == Fate::kSilent);
  }
  SUBCASE("straggler") {
    const std::vector<Selected> s{{1.0, false}, {11.0, false}};
    const RoundPlan p = plan_round(s, 2, 10.0);
    CHECK(p.completes == 1);
    CHECK(p.close_s == 10.0);
    CHECK(p.fate[1] == Fate::kStraggler);
  }
  SUBCASE("everyone reports before K: the last report closes it") {
    const std::vector<Selected> s{{1.0, false}, {4.0, false}};
    const RoundPlan p = plan_round(s, 5, 10.0);
    CHECK(p.completes == 2);
    CHECK(p.close_s == 4.0);
  }
  SUBCASE("ties go to the earlier entry") {
    const std::vector<Selected> s{{2.0, false}, {2.0, false}};
    const RoundPlan p = plan_round(s, 1, 10.0);
    CHECK(p.fate == std::vector<Fate>{Fate::kCompletes, Fate::kCut});
  }
}

TEST_CASE("profiles are drawn per client, reproducibly, from the configured distributions") {
  ProfileSpec spec;
  spec.gflops = parse_distribution("uniform:1:3", "profile.gflops");
  spec.uplink_mbps = parse_distribution("lognormal:5:0.5", "profile.uplink_mbps");
  spec.latency_ms = parse_distribution("40", "profile.latency_ms");
  parse_availability("diurnal:0.2:0.9", spec);
  const DeviceProfile a = draw_profile(spec, 7, 12), b = draw_profile(spec, 7, 12);
  CHECK(a == b);
  CHECK_FALSE(a == draw_profile(spec, 7, 13));
  for (std::uint64_t c = 0; c < 200; ++c) {
    const DeviceProfile p = draw_profile(spec, 7, c);
    CHECK(p.gflops >= 1.0);
    CHECK(p.gflops <= 3.0);
    CHECK(p.uplink_mbps > 0);
    CHECK(p.latency_ms == 40.0);
    for (double t : {0.0, 21600.0, 43200.0, 64800.0}) {
      const double q = online_probability(p, t);
      CHECK(q >= 0.2 - 1e-12);
      CHECK(q <= 0.9 + 1e-12);
    }
  }
  CHECK_THROWS_AS(parse_distribution("uniform:3:1", "k"), ConfigError);
  CHECK_THROWS_AS(parse_distribution("gamma:1:2", "k"), ConfigError);
  CHECK_THROWS_AS(parse_distribution("-4", "k"), ConfigError);
  CHECK_THROWS_AS(parse_availability("diurnal:0.9:0.2", spec), ConfigError);
}

TEST_CASE("a memory draw comes last: every other draw of a client is as without it") {
  ProfileSpec spec;
  spec.gflops = parse_distribution("uniform:1:3", "profile.gflops");
  spec.uplink_mbps = parse_distribution("lognormal:5:0.5", "profile.uplink_mbps");
  ProfileSpec with_memory = spec;
  with_memory.memory_bytes = parse_distribution("uniform:1e5:1e6", "profile.memory");
  for (std::uint64_t c = 0; c < 100; ++c) {
    const DeviceProfile a = draw_profile(spec, 7, c);
    DeviceProfile b = draw_profile(with_memory, 7, c);
    CHECK(a.memory_bytes == 0.0);  // unlimited by default
    CHECK(b.memory_bytes >= 1e5);
    CHECK(b.memory_bytes <= 1e6);
    b.memory_bytes = 0.0;
    CHECK(a == b);
  }
}

TEST_CASE("availability and dropout are fixed per (seed, client, round) and match their rates") {
  DeviceProfile p;
  p.dropout = 0.25;
  p.online_min = p.online_max = 0.5;
  int dropped = 0, online = 0;
  for (std::uint64_t c = 0; c < 4000; ++c) {
    dropped += drops_out(p, 3, c, 1) ? 1 : 0;
    online += is_online(p, 3, c, 1, 0.0) ? 1 : 0;
    CHECK(drops_out(p, 3, c, 1) == drops_out(p, 3, c, 1));
  }
  CHECK(dropped == doctest::Approx(1000).epsilon(0.1));
  CHECK(online == doctest::Approx(2000).epsilon(0.1));
  DeviceProfile always;
  CHECK(is_online(always, 3, 1, 1, 0.0));
  CHECK_FALSE(drops_out(always, 3, 1, 1));
}

TEST_CASE("a CSV device trace gives each client a row, with errors naming the line") {
  const auto rows = parse_profile_trace(
      "gflops, uplink_mbps,downlink_mbps,latency_ms,dropout\n1.5,2,8,30,0.1\n\n4,10,50,5,0\n",
      "t.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].gflops == 1.5);
  CHECK(rows[0].dropout == 0.1);
  CHECK(rows[0].online_min == 1.0);
  CHECK(rows[1].downlink_mbps == 50);
  CHECK_THROWS_WITH_AS(parse_profile_trace("gflops,uplink_mbps,latency_ms\n1,2,3\n", "t.csv"),
                       doctest::Contains("downlink_mbps"), DataError);
  CHECK_THROWS_WITH_AS(
      parse_profile_trace("gflops,uplink_mbps,downlink_mbps,latency_ms\n1,2,x,3\n", "t.csv"),
      doctest::Contains("t.csv:2"), DataError);
  CHECK_THROWS_AS(parse_profile_trace("gflops,uplink_mbps,downlink_mbps,latency_ms\n", "t.csv"),
                  DataError);
  CHECK(rows[0].memory_bytes == 0.0);  // a trace without the memory column: unlimited
}

TEST_CASE("a device trace's optional memory column gives each row a budget in bytes") {
  const auto rows = parse_profile_trace(
      "memory,gflops,uplink_mbps,downlink_mbps,latency_ms\n0,1,2,8,30\n5e5,1,2,8,30\n", "t.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].memory_bytes == 0.0);
  CHECK(rows[1].memory_bytes == 500000.0);
  CHECK(rows[1].gflops == 1.0);
  CHECK_THROWS_WITH_AS(
      parse_profile_trace("gflops,uplink_mbps,downlink_mbps,latency_ms,memory\n1,2,8,3,-1\n",
                          "t.csv"),
      doctest::Contains("memory >= 0"), DataError);
}

}  // namespace
}  // namespace cohort::sim
