#include "cohort/aggregation/allreduce.h"

#include <doctest/doctest.h>

#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::aggregation {
namespace {

// Rank r's input: integer values, distinct per rank and element, small enough that every
// partial sum is exact in float32.
float input(Rank r, std::size_t i) { return static_cast<float>((r + 1) * 1000 + i % 997); }

// Runs one sum on every rank of an in-memory network; returns each rank's result.
std::vector<std::vector<float>> run(Rank n, std::size_t d, AllreduceOptions options,
                                    std::vector<std::uint64_t>* sent = nullptr) {
  InMemoryNetwork net(n);
  std::vector<std::vector<float>> data(n, std::vector<float>(d));
  for (Rank r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < d; ++i) data[r][i] = input(r, i);
  }
  std::vector<std::string> errors(n);
  {
    std::vector<std::jthread> threads;
    for (Rank r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          AllReducer reducer(net.comm(r), options);
          reducer.sum(data[r]);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
  }
  for (Rank r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[r].empty(), errors[r]);
  if (sent) {
    sent->clear();
    for (Rank r = 0; r < n; ++r) sent->push_back(net.comm(r).bytes_sent());
  }
  return data;
}

void check_exact(const std::vector<std::vector<float>>& data, Rank n, std::size_t d) {
  for (Rank r = 0; r < n; ++r) {
    REQUIRE(data[r].size() == d);
    for (std::size_t i = 0; i < d; ++i) {
      float want = 0;
      for (Rank k = 0; k < n; ++k) want += input(k, i);
      if (data[r][i] != want) {
        FAIL_CHECK("rank " << r << " element " << i << ": " << data[r][i] << " != " << want);
        return;
      }
    }
  }
}

TEST_CASE("ring allreduce: exact sums for n = 2..8 and lengths not divisible by n") {
  for (Rank n = 2; n <= 8; ++n) {
    for (std::size_t d : {std::size_t{1}, std::size_t{n - 1}, std::size_t{n + 1}, std::size_t{37},
                          std::size_t{1000}, std::size_t{10007}}) {
      CAPTURE(n);
      CAPTURE(d);
      AllreduceOptions opt;
      opt.algo = AllreduceAlgo::kRing;
      opt.segment_bytes = 64;  // many segments per chunk: exercises the pipeline
      opt.timeout = std::chrono::seconds(60);
      std::vector<std::uint64_t> sent;
      auto out = run(n, d, opt, &sent);
      check_exact(out, n, d);
      const std::uint64_t bound = 2 * (n - 1) * ((d + n - 1) / n) * sizeof(float);
      for (Rank r = 0; r < n; ++r) CHECK(sent[r] <= bound);
    }
  }
}

TEST_CASE("recursive doubling (with the fold for n not a power of two) equals the ring") {
  for (Rank n = 2; n <= 8; ++n) {
    for (std::size_t d :
         {std::size_t{1}, std::size_t{n + 1}, std::size_t{999}, std::size_t{10007}}) {
      CAPTURE(n);
      CAPTURE(d);
      AllreduceOptions rd;
      rd.algo = AllreduceAlgo::kRecursiveDoubling;
      rd.segment_bytes = 256;  // many segments per exchange, both buffers in turn
      rd.timeout = std::chrono::seconds(60);
      AllreduceOptions ring = rd;
      ring.algo = AllreduceAlgo::kRing;
      auto a = run(n, d, rd);
      auto b = run(n, d, ring);
      check_exact(a, n, d);
      CHECK(a == b);  // bit for bit
    }
  }
}

TEST_CASE("halving-doubling: exact sums for n = 2..9, every rank the same, 2(n-1)/n sent") {
  for (Rank n = 2; n <= 9; ++n) {
    for (std::size_t d : {std::size_t{1}, std::size_t{n - 1}, std::size_t{n + 1}, std::size_t{37},
                          std::size_t{1000}, std::size_t{10007}}) {
      CAPTURE(n);
      CAPTURE(d);
      AllreduceOptions opt;
      opt.algo = AllreduceAlgo::kHalvingDoubling;
      opt.segment_bytes = 64;  // many segments per level
      opt.timeout = std::chrono::seconds(60);
      std::vector<std::uint64_t> sent;
      auto out = run(n, d, opt, &sent);
      check_exact(out, n, d);
      if ((n & (n - 1)) == 0) {  // a power of two: no fold, the optimal volume
        for (Rank r = 0; r < n; ++r) CHECK(sent[r] <= 2 * d * sizeof(float) + 8 * n);
      }
    }
  }
}

TEST_CASE("send_shared hands the receiver the sender's own bytes: early writes would show") {
  // The in-memory network lends the bytes until the receiver drops them, so an algorithm that
  // wrote a region before the transport let go of it would corrupt a peer's sum (the exactness
  // tests above run every algorithm over it).
  InMemoryNetwork net(2);
  std::vector<float> mine(4, 1.0f);
  bool released = false;
  std::shared_ptr<const void> owner(&released, [&](const void*) { released = true; });
  net.comm(0).send_shared(1, 7, std::as_bytes(std::span<const float>(mine)), std::move(owner));
  CHECK_FALSE(released);
  mine[2] = 5.0f;  // too early: the receiver sees it
  {
    auto got = net.comm(1).recv(0, 7, std::chrono::seconds(1));
    REQUIRE(got);
    CHECK(reinterpret_cast<const float*>(got->data())[2] == 5.0f);
    CHECK_FALSE(released);
  }
  CHECK(released);  // dropped by the receiver
}

TEST_CASE("auto: recursive doubling when small, then halving-doubling, or the ring for odd n") {
  InMemoryNetwork two(2), four(4);
  AllReducer reducer(two.comm(0));
  CHECK(reducer.choose(4096) == AllreduceAlgo::kRecursiveDoubling);
  CHECK(reducer.choose(std::size_t{1} << 20) == AllreduceAlgo::kHalvingDoubling);
  InMemoryNetwork three(3);
  AllReducer wide(four.comm(0)), odd(three.comm(0));
  CHECK(wide.choose(4096) == AllreduceAlgo::kRecursiveDoubling);
  CHECK(wide.choose(std::size_t{1} << 20) == AllreduceAlgo::kHalvingDoubling);
  CHECK(wide.choose(std::size_t{1} << 30) == AllreduceAlgo::kHalvingDoubling);
  CHECK(odd.choose(std::size_t{1} << 20) == AllreduceAlgo::kRing);  // no fold for the ring
  CHECK(parse_allreduce_algo("halving_doubling") == AllreduceAlgo::kHalvingDoubling);
  CHECK(allreduce_algo_name(AllreduceAlgo::kHalvingDoubling) == "halving_doubling");
  CHECK(parse_allreduce_algo("tree") == AllreduceAlgo::kRecursiveDoubling);
  CHECK_THROWS_AS((void)parse_allreduce_algo("butterfly"), ConfigError);
  CHECK(allreduce_bus_bandwidth_gbps(1000000000, 1.0, 4) == doctest::Approx(1.5));
}

TEST_CASE("repeated calls on one reducer stay in step, mean divides by n") {
  const Rank n = 3;
  InMemoryNetwork net(n);
  std::vector<std::vector<float>> v(n, std::vector<float>(5000));
  {
    std::vector<std::jthread> threads;
    for (Rank r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        AllreduceOptions opt;
        opt.segment_bytes = 4096;
        opt.small_bytes = 1024;  // the 20 kB vector: halving-doubling (with the fold, n = 3)
        AllReducer reducer(net.comm(r), opt);
        for (int it = 0; it < 10; ++it) {
          std::vector<float> small(7, static_cast<float>(r));
          reducer.sum(small);  // recursive doubling in between halving-doubling calls
          for (float& x : v[r]) x = static_cast<float>(3 * r) + small[0];
          reducer.mean(v[r]);
        }
      });
    }
  }
  // mean over r of (3r + 3) = 3 + 3 = 6 for n = 3 (r = 0, 1, 2).
  for (Rank r = 0; r < n; ++r) CHECK(v[r][4999] == 6.0f);
}

TEST_CASE("a silent peer ends the allreduce with a TimeoutError") {
  InMemoryNetwork net(2);
  net.kill(1);
  AllreduceOptions opt;
  opt.timeout = std::chrono::milliseconds(50);
  AllReducer reducer(net.comm(0), opt);
  std::vector<float> v(100, 1.0f);
  CHECK_THROWS_AS(reducer.sum(v), TimeoutError);
  for (const auto algo : {AllreduceAlgo::kRing, AllreduceAlgo::kHalvingDoubling}) {
    CAPTURE(allreduce_algo_name(algo));
    opt.algo = algo;
    AllReducer other(net.comm(0), opt);
    CHECK_THROWS_AS(other.sum(v), TimeoutError);
  }
}

}  // namespace
}  // namespace cohort::aggregation
