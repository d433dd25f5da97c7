#include "cohort/client/partition.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

// `classes` classes of `per_class` examples each, interleaved (label = i mod classes).
std::vector<std::int32_t> balanced_labels(std::size_t classes, std::size_t per_class) {
  std::vector<std::int32_t> labels(classes * per_class);
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>(i % classes);
  return labels;
}

void check_disjoint_cover(const Partition& p, std::size_t n_items, std::size_t n_clients) {
  REQUIRE(p.size() == n_clients);
  std::vector<int> seen(n_items, 0);
  std::size_t total = 0;
  for (const auto& client : p) {
    total += client.size();
    for (const auto i : client) {
      REQUIRE(i < n_items);
      ++seen[i];
    }
  }
  CHECK(total == n_items);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

// Mean over clients of the total-variation distance between the client's label distribution and
// the global one.
double mean_tv_distance(const Partition& p, const std::vector<std::int32_t>& labels,
                        std::size_t classes) {
  const auto hist = label_histogram(p, labels, classes);
  std::vector<double> global(classes, 0);
  for (const auto l : labels)
    global[static_cast<std::size_t>(l)] += 1.0 / static_cast<double>(labels.size());
  double sum = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    double tv = 0;
    for (std::size_t c = 0; c < classes; ++c) {
      tv +=
          std::abs(static_cast<double>(hist[j][c]) / static_cast<double>(p[j].size()) - global[c]);
    }
    sum += tv / 2;
  }
  return sum / static_cast<double>(p.size());
}

TEST_CASE("every partitioner returns a disjoint cover, reproducibly for a seed") {
  const auto labels = balanced_labels(10, 500);
  const std::size_t n = labels.size();
  for (const std::string spec : {"iid", "shards:2", "shards:3", "dirichlet:0.5", "dirichlet:0.1",
                                 "quantity:0.5", "quantity:5"}) {
    for (const std::size_t clients : {1u, 7u, 20u}) {
      CAPTURE(spec);
      CAPTURE(clients);
      const PartitionSpec ps = parse_partition_spec(spec);
      const Partition a = make_partition(ps, labels, clients, 123);
      check_disjoint_cover(a, n, clients);
      CHECK(make_partition(ps, labels, clients, 123) == a);
      if (clients > 1) CHECK(make_partition(ps, labels, clients, 124) != a);
    }
  }
}

TEST_CASE("iid gives near-equal sizes") {
  const Partition p = partition_iid(103, 10, 9);
  check_disjoint_cover(p, 103, 10);
  for (std::size_t j = 0; j < 10; ++j) CHECK(p[j].size() == (j < 3 ? 11u : 10u));
}

TEST_CASE("shards: each client sees at most S labels when class sizes are multiples of the shard") {
  // 10 classes x 60 examples, 20 clients x 2 shards: 40 shards of 15, 4 per class.
  const auto labels = balanced_labels(10, 60);
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    const Partition p = partition_shards(labels, 20, 2, seed);
    check_disjoint_cover(p, labels.size(), 20);
    const auto hist = label_histogram(p, labels, 10);
    for (const auto& h : hist) {
      CHECK(std::count_if(h.begin(), h.end(), [](std::size_t c) { return c > 0; }) <= 2);
    }
    for (const auto& client : p) CHECK(client.size() == 30);
  }
}

TEST_CASE("dirichlet label skew grows as alpha shrinks") {
  const auto labels = balanced_labels(10, 1000);
  double previous = -1;
  for (const double alpha : {100.0, 1.0, 0.1}) {
    CAPTURE(alpha);
    double tv = 0;
    for (std::uint64_t seed = 0; seed < 5; ++seed) {
      tv += mean_tv_distance(partition_dirichlet(labels, 10, alpha, seed), labels, 10) / 5;
    }
    MESSAGE("alpha=" << alpha << " mean TV distance from the global label distribution=" << tv);
    CHECK(tv > previous);
    previous = tv;
  }
}

TEST_CASE("dirichlet at the extremes (docs/ALGORITHMS.md section 9 tests, 10 classes x 5000)") {
  const auto labels = balanced_labels(10, 5000);
  for (const std::size_t clients : {10u, 16u}) {
    CAPTURE(clients);
    // alpha = 1e6: every client within total variation 0.01 of the global distribution.
    const Partition iid_like = partition_dirichlet(labels, clients, 1e6, 7);
    const auto hist = label_histogram(iid_like, labels, 10);
    for (std::size_t j = 0; j < clients; ++j) {
      double tv = 0;
      for (std::size_t c = 0; c < 10; ++c) {
        tv += std::abs(static_cast<double>(hist[j][c]) / static_cast<double>(iid_like[j].size()) -
                       0.1);
      }
      CHECK(tv / 2 < 0.01);
    }
    // alpha = 0.01: at least 75% of clients have one class above half of their samples.
    const Partition skewed = partition_dirichlet(labels, clients, 0.01, 7);
    check_disjoint_cover(skewed, labels.size(), clients);
    const auto h2 = label_histogram(skewed, labels, 10);
    std::size_t dominated = 0;
    for (std::size_t j = 0; j < clients; ++j) {
      const auto top = *std::max_element(h2[j].begin(), h2[j].end());
      if (2 * top > skewed[j].size()) ++dominated;
    }
    CHECK(4 * dominated >= 3 * clients);
    for (const auto& client : skewed) CHECK(client.size() >= 10);
  }
}

TEST_CASE("quantity skew: sizes vary with beta, each client gets at least 10") {
  const Partition p = partition_quantity(5000, 20, 0.5, 3);
  check_disjoint_cover(p, 5000, 20);
  std::size_t smallest = 5000;
  std::size_t largest = 0;
  for (const auto& c : p) {
    smallest = std::min(smallest, c.size());
    largest = std::max(largest, c.size());
  }
  CHECK(smallest >= 9);  // min q_j * N >= 10 before flooring the cumulative cut points
  CHECK(largest > 2 * smallest);
}

TEST_CASE("partition specs parse, round-trip and reject nonsense with a ConfigError") {
  CHECK(parse_partition_spec("iid").kind == PartitionKind::kIid);
  CHECK(parse_partition_spec("shards:2").shards_per_client == 2);
  CHECK(parse_partition_spec("shards").shards_per_client == 2);
  CHECK(parse_partition_spec("dirichlet:0.1").alpha == doctest::Approx(0.1));
  CHECK(parse_partition_spec("dirichlet:0.1:20").min_size == 20);
  CHECK(parse_partition_spec("quantity:1.5").beta == doctest::Approx(1.5));
  for (const std::string s :
       {"iid", "shards:3", "dirichlet:0.1", "dirichlet:0.5:20", "quantity:1.5"}) {
    CHECK(parse_partition_spec(s).to_string() == s);
  }
  for (const std::string bad :
       {"", "iid:1", "shards:0", "shards:1.5", "dirichlet:0", "dirichlet:-1", "dirichlet:abc",
        "dirichlet:0.1:2:3", "quantity:0", "pathological", "dirichlet:inf"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_partition_spec(bad), ConfigError);
  }
  try {
    (void)parse_partition_spec("zipf:2");
    FAIL("no throw");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("unknown partitioner 'zipf'") != std::string::npos);
    CHECK(what.find("dirichlet") != std::string::npos);
  }
}

TEST_CASE("sample:M (cohort-sim only): rows from (seed, client) alone, distinct, even coverage") {
  CHECK(parse_partition_spec("sample:60", true).sample_size == 60);
  CHECK(parse_partition_spec("sample:60", true).to_string() == "sample:60");
  for (const std::string bad : {"sample", "sample:0", "sample:1.5", "sample:-3", "sample:2:3"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS((void)parse_partition_spec(bad, true), ConfigError);
  }
  try {  // a real federation's client: refused at parse time
    (void)parse_partition_spec("sample:60");
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("only a simulation may") != std::string::npos);
  }
  const auto labels = balanced_labels(10, 100);  // 1,000 examples
  CHECK_THROWS_AS((void)make_partition(parse_partition_spec("sample:5", true), labels, 10, 1),
                  ConfigError);
  // Independent of the number of clients, distinct and in range.
  for (std::uint64_t c : {0u, 1u, 77u, 999999u}) {
    const auto rows = sample_rows(1000, 60, 9, c);
    CHECK(rows == sample_rows(1000, 60, 9, c));
    CHECK(rows != sample_rows(1000, 60, 10, c));
    CHECK(std::set<std::uint32_t>(rows.begin(), rows.end()).size() == 60);
    CHECK(*std::max_element(rows.begin(), rows.end()) < 1000);
  }
  CHECK(sample_rows(50, 50, 3, 4).size() == 50);  // M = examples: all of them
  // 20,000 clients of 60 out of 1,000 examples: each example drawn 1,200 times on average;
  // every count within 5 sigma (sigma = sqrt(1200 x 0.94) ~ 34).
  std::vector<int> drawn(1000);
  for (std::uint64_t c = 0; c < 20000; ++c) {
    for (auto i : sample_rows(1000, 60, 4, c)) ++drawn[i];
  }
  const auto [lo, hi] = std::minmax_element(drawn.begin(), drawn.end());
  CHECK(*lo > 1200 - 5 * 34);
  CHECK(*hi < 1200 + 5 * 34);
  // ClientRows: stored kinds through make_partition, sample computed into the scratch.
  Dataset data(FloatBuffer(1000), std::vector<std::int32_t>(labels.begin(), labels.end()),
               Shape{1, 1, 1});
  const ClientRows sampled(parse_partition_spec("sample:60", true), data, 5000000, 4);
  CHECK(sampled.clients() == 5000000);
  CHECK(sampled.size(4999999) == 60);
  std::vector<std::uint32_t> scratch;
  const auto rows = sampled.rows(123, scratch);
  CHECK(std::vector<std::uint32_t>(rows.begin(), rows.end()) == sample_rows(1000, 60, 4, 123));
  const ClientRows stored(parse_partition_spec("iid"), data, 10, 4);
  CHECK(stored.size(3) == 100);
  CHECK(stored.rows(3, scratch).size() == 100);
  CHECK_THROWS_AS(ClientRows(parse_partition_spec("sample:1001", true), data, 10, 4), ConfigError);
}

TEST_CASE("impossible partitions are ConfigErrors, not endless loops") {
  const auto labels = balanced_labels(10, 10);
  CHECK_THROWS_AS((void)partition_iid(5, 6, 1), ConfigError);
  CHECK_THROWS_AS((void)partition_shards(labels, 60, 2, 1), ConfigError);
  CHECK_THROWS_AS((void)partition_dirichlet(labels, 11, 0.5, 1), ConfigError);
  CHECK_THROWS_AS((void)partition_quantity(100, 11, 0.5, 1), ConfigError);
  // Possible in principle, but with tiny alpha each of two classes lands on one client, so eight
  // of ten clients stay empty: the retry cap must end it.
  const auto two_classes = balanced_labels(2, 50);
  CHECK_THROWS_AS((void)partition_dirichlet(two_classes, 10, 0.001, 1, 10, 50), ConfigError);
}

}  // namespace
}  // namespace cohort::client
