// AllReduce (sum) over a Comm: ring (reduce-scatter + all-gather, chunked and pipelined),
// halving-doubling (Rabenseifner) and recursive doubling, the last two with the fold step for n
// not a power of two; docs/ALGORITHMS.md section 4.
//
// Ring: the vector is cut into n chunks whose sizes differ by at most one element, each chunk into
// segments of at most segment_bytes. A rank sends its own chunk's segments, then forwards every
// segment it receives as soon as it has added (reduce-scatter) or stored (all-gather) it, so the
// 2(n-1) ring steps overlap segment by segment. Each rank sends 2(n-1)/n of the vector.
// Halving-doubling: a reduce-scatter by recursive halving (log2 n exchanges of half the range
// still held, with rank XOR 2^j), then an all-gather by recursive doubling: 2(n-1)/n of the
// vector in 2 log2 n steps. Recursive doubling: log2(n) whole-vector exchanges, segmented, each
// step's sum written to the other of two buffers; latency-optimal, for small vectors. kAuto:
// recursive doubling below small_bytes; above, halving-doubling when n is a power of two, else
// the ring (whose chunks need no fold). Measured on loopback: docs/PERFORMANCE.md 10.
//
// Every algorithm sends without copying (Comm::send_shared): a region of a buffer is written
// again only after the transport has released every send of it, and sum() returns only once all
// are released, so the caller may change the vector at once.
//
// Every call must be made by all ranks of the Comm, in the same order, with the same length. On
// integer-valued data all algorithms give the exact sum on every rank. Throws TimeoutError when a
// peer stays silent past `timeout` (a crashed rank), ProtocolError on a wrong-sized message.
// Thread-safety: one AllReducer per Comm, driven by the Comm's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/core/comm.h"

namespace cohort::aggregation {

enum class AllreduceAlgo { kAuto, kRing, kRecursiveDoubling, kHalvingDoubling };

[[nodiscard]] std::string_view allreduce_algo_name(AllreduceAlgo algo);
// "auto", "ring", "recursive_doubling" (or "tree"), "halving_doubling"; ConfigError naming the
// choices otherwise.
[[nodiscard]] AllreduceAlgo parse_allreduce_algo(std::string_view name);

struct AllreduceOptions {
  AllreduceAlgo algo = AllreduceAlgo::kAuto;
  std::size_t segment_bytes = std::size_t{1} << 20;  // pipelining grain of the ring
  std::size_t small_bytes = std::size_t{512} << 10;  // kAuto: recursive doubling below this
  std::chrono::milliseconds timeout{60000};
  std::uint64_t tag_base = std::uint64_t{1} << 62;  // keeps its tags apart from gossip tags
};

class AllReducer {
 public:
  explicit AllReducer(Comm& comm, AllreduceOptions options = {});

  // data <- sum over ranks of data. Returns the algorithm used.
  AllreduceAlgo sum(std::span<float> data);
  // data <- mean over ranks.
  AllreduceAlgo mean(std::span<float> data);

  // The algorithm sum() runs for `bytes` on this Comm's group.
  [[nodiscard]] AllreduceAlgo choose(std::size_t bytes) const;
  [[nodiscard]] const AllreduceOptions& options() const { return options_; }

 private:
  void ring(std::span<float> data, std::uint64_t tag);
  void recursive_doubling(std::span<float> data, std::uint64_t tag);
  void halving_doubling(std::span<float> data, std::uint64_t tag);

  Comm& comm_;
  AllreduceOptions options_;
  std::uint64_t op_ = 0;
  std::vector<float> scratch_;  // recursive doubling's second buffer, kept between calls
};

// Bus bandwidth of one allreduce of `bytes` that took `seconds` on n ranks (NCCL-tests'
// definition): bytes / seconds * 2(n-1)/n, in GB/s (1e9 bytes per second).
[[nodiscard]] double allreduce_bus_bandwidth_gbps(std::size_t bytes, double seconds, Rank n);

}  // namespace cohort::aggregation
