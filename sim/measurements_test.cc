#include "measurements.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace cohort::sim {
namespace {

TEST_CASE("a virtual client's links: every shard at once over one link, from its profile") {
  DeviceProfile p;
  p.latency_ms = 20;
  p.downlink_mbps = 8;  // 1 MB/s
  p.uplink_mbps = 2;    // 0.25 MB/s
  const std::vector<ShardBytes> shards{{0, 1'000'000, 500'000}, {1, 3'000'000, 0}};
  const auto links = virtual_links(p, shards);
  REQUIRE(links.size() == 2);
  CHECK(links[0].shard == 0);
  CHECK(links[1].shard == 1);
  CHECK(links[0].down_bytes == 1'000'000);
  CHECK(links[1].up_bytes == 0);
  // Down: both share the link until shard 0's 1 MB is in (2 MB sent: 2 s), then shard 1 alone.
  CHECK(links[0].down_seconds == doctest::Approx(0.02 + 2.0));
  CHECK(links[1].down_seconds == doctest::Approx(0.02 + 4.0));
  // The last answer comes when client_time() says the whole transfer ends.
  const ClientTime t = client_time(p, {4'000'000, 500'000, 0});
  CHECK(links[1].down_seconds == doctest::Approx(t.download_s));
  CHECK(links[0].up_seconds == doctest::Approx(t.upload_s));
  CHECK(links[1].up_seconds == 0.0f);  // nothing sent: not measured
}

TEST_CASE("shared_link_seconds: equal transfers end together, an empty one is not measured") {
  const std::vector<std::uint64_t> bytes{250'000, 0, 250'000, 500'000};
  const auto s = shared_link_seconds(0.01, 8, bytes);
  REQUIRE(s.size() == 4);
  CHECK(s[1] == 0.0);
  CHECK(s[0] == doctest::Approx(0.01 + 0.75));  // 3 x 250 kB sent at 1 MB/s
  CHECK(s[2] == doctest::Approx(s[0]));
  CHECK(s[3] == doctest::Approx(0.01 + 1.0));  // all 1 MB
}

TEST_CASE("virtual throughput is the profile's speed over the model's training FLOPs") {
  DeviceProfile p;
  p.gflops = 3;
  CHECK(virtual_samples_per_second(p, 1000, 0) == 0.0);
  CHECK(virtual_samples_per_second(p, 1000, 640) == doctest::Approx(3e9 / 6000.0));
  p.gflops = 0.3;  // ten times slower, ten times fewer samples per second
  CHECK(virtual_samples_per_second(p, 1000, 640) == doctest::Approx(3e8 / 6000.0));
}

}  // namespace
}  // namespace cohort::sim
