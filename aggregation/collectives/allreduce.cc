#include "cohort/aggregation/allreduce.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <string>

#include "cohort/core/error.h"

namespace cohort::aggregation {

std::string_view allreduce_algo_name(AllreduceAlgo algo) {
  switch (algo) {
    case AllreduceAlgo::kAuto: return "auto";
    case AllreduceAlgo::kRing: return "ring";
    case AllreduceAlgo::kRecursiveDoubling: return "recursive_doubling";
  }
  return "?";
}

AllreduceAlgo parse_allreduce_algo(std::string_view name) {
  if (name == "auto") return AllreduceAlgo::kAuto;
  if (name == "ring") return AllreduceAlgo::kRing;
  if (name == "recursive_doubling" || name == "tree") return AllreduceAlgo::kRecursiveDoubling;
  throw ConfigError("unknown allreduce algorithm '" + std::string(name) +
                    "' (known: auto, ring, recursive_doubling)");
}

AllReducer::AllReducer(Comm& comm, AllreduceOptions options) : comm_(comm), options_(options) {
  if (options_.segment_bytes < sizeof(float)) {
    throw ConfigError("allreduce segment size must be at least 4 bytes");
  }
}

AllreduceAlgo AllReducer::choose(std::size_t bytes) const {
  if (options_.algo != AllreduceAlgo::kAuto) return options_.algo;
  return bytes < options_.small_bytes ? AllreduceAlgo::kRecursiveDoubling : AllreduceAlgo::kRing;
}

AllreduceAlgo AllReducer::sum(std::span<float> data) {
  const AllreduceAlgo algo = choose(data.size_bytes());
  // Four tags per operation (ring uses one, recursive doubling three phases).
  const std::uint64_t tag = options_.tag_base + 4 * op_++;
  if (comm_.size() == 1) return algo;
  if (algo == AllreduceAlgo::kRing) {
    ring(data, tag);
  } else {
    recursive_doubling(data, tag);
  }
  return algo;
}

AllreduceAlgo AllReducer::mean(std::span<float> data) {
  const AllreduceAlgo algo = sum(data);
  const float scale = 1.0f / static_cast<float>(comm_.size());
  for (float& v : data) v *= scale;
  return algo;
}

namespace {

[[noreturn]] void silent_peer(Rank peer, std::chrono::milliseconds timeout) {
  throw TimeoutError("allreduce: rank " + std::to_string(peer) + " sent nothing for " +
                     std::to_string(timeout.count()) + " ms (did it crash?)");
}

}  // namespace

void AllReducer::ring(std::span<float> data, std::uint64_t tag) {
  const Rank n = comm_.size();
  const Rank r = comm_.rank();
  const Rank next = (r + 1) % n;
  const Rank prev = (r + n - 1) % n;
  const std::size_t d = data.size();
  // Chunk c covers [begin(c), begin(c + 1)): the first d % n chunks have one element more.
  const std::size_t base = d / n, extra = d % n;
  auto begin = [&](std::size_t c) { return c * base + std::min(c, extra); };
  const std::size_t seg = std::max<std::size_t>(1, options_.segment_bytes / sizeof(float));
  auto chunk = [&](std::size_t c) {
    c %= n;
    return data.subspan(begin(c), begin(c + 1) - begin(c));
  };
  auto send_chunk = [&](std::span<float> ch) {
    for (std::size_t off = 0; off < ch.size(); off += seg) {
      send_floats(comm_, next, tag, ch.subspan(off, std::min(seg, ch.size() - off)));
    }
  };
  // Step s (0 .. 2n-3) receives chunk (r - s - 1) mod n in reduce-scatter (s < n-1) and chunk
  // (r - (s - (n-1))) mod n in all-gather, and forwards each segment as the next step's send.
  send_chunk(chunk(r));
  const std::size_t steps = 2 * (std::size_t{n} - 1);
  for (std::size_t s = 0; s < steps; ++s) {
    const bool reduce = s < n - 1;
    const std::size_t c = reduce ? (r + 2 * std::size_t{n} - s - 1) % n
                                 : (r + 2 * std::size_t{n} - (s - (n - 1))) % n;
    std::span<float> ch = chunk(c);
    for (std::size_t off = 0; off < ch.size(); off += seg) {
      auto part = ch.subspan(off, std::min(seg, ch.size() - off));
      const bool ok = reduce ? recv_add_floats(comm_, prev, tag, part, options_.timeout)
                             : recv_floats(comm_, prev, tag, part, options_.timeout);
      if (!ok) silent_peer(prev, options_.timeout);
      if (s + 1 < steps) send_floats(comm_, next, tag, part);
    }
  }
}

void AllReducer::recursive_doubling(std::span<float> data, std::uint64_t tag) {
  const Rank n = comm_.size();
  const Rank r = comm_.rank();
  const Rank p = std::bit_floor(n);  // largest power of two <= n
  const Rank rem = n - p;
  const auto timeout = options_.timeout;
  // Fold: among the first 2*rem ranks, each even rank hands its vector to the odd one above it
  // and sits out; the remaining p ranks run the doubling with ranks renumbered 0..p-1.
  Rank vrank = 0;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      send_floats(comm_, r + 1, tag, data);
      if (!recv_floats(comm_, r + 1, tag + 2, data, timeout)) silent_peer(r + 1, timeout);
      return;
    }
    if (!recv_add_floats(comm_, r - 1, tag, data, timeout)) silent_peer(r - 1, timeout);
    vrank = r / 2;
  } else {
    vrank = r - rem;
  }
  auto real = [&](Rank v) { return v < rem ? 2 * v + 1 : v + rem; };
  // Both partners add the same two vectors and float addition commutes, so every rank holds a
  // bit-identical result even for non-integer data.
  std::optional<PooledBuffer> got;
  for (Rank mask = 1; mask < p; mask <<= 1) {
    const Rank partner = real(vrank ^ mask);
    send_floats(comm_, partner, tag + 1, data);
    got = comm_.recv(partner, tag + 1, timeout);
    if (!got) silent_peer(partner, timeout);
    if (got->size() != data.size_bytes()) {
      throw ProtocolError("allreduce: rank " + std::to_string(partner) + " sent " +
                          std::to_string(got->size()) + " bytes, expected " +
                          std::to_string(data.size_bytes()));
    }
    const auto* in = reinterpret_cast<const float*>(got->data());
    for (std::size_t i = 0; i < data.size(); ++i) data[i] += in[i];
  }
  if (r < 2 * rem) send_floats(comm_, r - 1, tag + 2, data);  // unfold
}

double allreduce_bus_bandwidth_gbps(std::size_t bytes, double seconds, Rank n) {
  if (seconds <= 0 || n < 2) return 0;
  return static_cast<double>(bytes) / seconds * 2.0 * (n - 1) / n / 1e9;
}

}  // namespace cohort::aggregation
