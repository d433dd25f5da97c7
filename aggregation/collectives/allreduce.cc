#include "cohort/aggregation/allreduce.h"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::aggregation {

std::string_view allreduce_algo_name(AllreduceAlgo algo) {
  switch (algo) {
    case AllreduceAlgo::kAuto: return "auto";
    case AllreduceAlgo::kRing: return "ring";
    case AllreduceAlgo::kRecursiveDoubling: return "recursive_doubling";
    case AllreduceAlgo::kHalvingDoubling: return "halving_doubling";
  }
  return "?";
}

AllreduceAlgo parse_allreduce_algo(std::string_view name) {
  if (name == "auto") return AllreduceAlgo::kAuto;
  if (name == "ring") return AllreduceAlgo::kRing;
  if (name == "recursive_doubling" || name == "tree") return AllreduceAlgo::kRecursiveDoubling;
  if (name == "halving_doubling") return AllreduceAlgo::kHalvingDoubling;
  throw ConfigError("unknown allreduce algorithm '" + std::string(name) +
                    "' (known: auto, ring, halving_doubling, recursive_doubling)");
}

AllReducer::AllReducer(Comm& comm, AllreduceOptions options) : comm_(comm), options_(options) {
  if (options_.segment_bytes < sizeof(float)) {
    throw ConfigError("allreduce segment size must be at least 4 bytes");
  }
}

AllreduceAlgo AllReducer::choose(std::size_t bytes) const {
  if (options_.algo != AllreduceAlgo::kAuto) return options_.algo;
  if (bytes < options_.small_bytes) return AllreduceAlgo::kRecursiveDoubling;
  return std::has_single_bit(comm_.size()) ? AllreduceAlgo::kHalvingDoubling : AllreduceAlgo::kRing;
}

AllreduceAlgo AllReducer::sum(std::span<float> data) {
  const AllreduceAlgo algo = choose(data.size_bytes());
  // Four tags per operation (the ring uses one, the doubling algorithms three phases).
  const std::uint64_t tag = options_.tag_base + 4 * op_++;
  if (comm_.size() == 1) return algo;
  switch (algo) {
    case AllreduceAlgo::kRing: ring(data, tag); break;
    case AllreduceAlgo::kHalvingDoubling: halving_doubling(data, tag); break;
    case AllreduceAlgo::kAuto:
    case AllreduceAlgo::kRecursiveDoubling: recursive_doubling(data, tag); break;
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

// Counts the sends without a copy that the transport still holds, per region of the vector: a
// region is written again only once its count is back to zero. The counts drop on whichever
// thread releases the owner (ZeroMQ's I/O thread, or a receiver in InMemoryNetwork).
class SendLedger {
 public:
  explicit SendLedger(std::size_t regions) : state_(std::make_shared<State>(regions)) {}
  SendLedger(const SendLedger&) = delete;
  SendLedger& operator=(const SendLedger&) = delete;
  // Every sum() waits for its sends, so none outlives the call (the caller owns the vector).
  ~SendLedger() = default;

  // Sends `values` to `to` without a copy, counted against `region`.
  void send(Comm& comm, Rank to, std::uint64_t tag, std::span<const float> values,
            std::size_t region) {
    {
      std::lock_guard lock(state_->mu);
      ++state_->held[region];
    }
    // Not null: transports take a null owner for none (and copy).
    std::shared_ptr<const void> owner(state_.get(), [s = state_, region](const void*) {
      {
        std::lock_guard lock(s->mu);
        --s->held[region];
      }
      s->cv.notify_all();
    });
    comm.send_shared(to, tag, std::as_bytes(values), std::move(owner));
  }
  // Waits until the transport released every send of `region` (all regions: npos).
  void wait(std::size_t region, std::chrono::milliseconds timeout) {
    std::unique_lock lock(state_->mu);
    const bool done = state_->cv.wait_for(lock, timeout, [&] {
      if (region != kAll) return state_->held[region] == 0;
      return std::all_of(state_->held.begin(), state_->held.end(),
                         [](std::size_t h) { return h == 0; });
    });
    if (!done) {
      throw TimeoutError("allreduce: the transport still held a send after " +
                         std::to_string(timeout.count()) + " ms");
    }
  }
  static constexpr std::size_t kAll = static_cast<std::size_t>(-1);

 private:
  struct State {
    explicit State(std::size_t regions) : held(regions, 0) {}
    std::mutex mu;  // guards held
    std::condition_variable cv;
    std::vector<std::size_t> held;
  };
  std::shared_ptr<State> state_;
};

// Calls f(part) for each segment of `range`, in order: at most `seg` elements each.
template <typename F>
void for_segments(std::span<float> range, std::size_t seg, F&& f) {
  for (std::size_t off = 0; off < range.size(); off += seg) {
    f(range.subspan(off, std::min(seg, range.size() - off)));
  }
}

// Segmented sends (without a copy, counted by a ledger) and receives of whole ranges, and the
// fold of the doubling algorithms. Region 0 of the ledger is the fold's and the unfold's.
class Segmented {
 public:
  Segmented(Comm& comm, const AllreduceOptions& options, std::size_t regions)
      : comm_(comm),
        seg_(std::max<std::size_t>(1, options.segment_bytes / sizeof(float))),
        timeout_(options.timeout),
        sends_(regions) {}

  [[nodiscard]] std::size_t seg() const { return seg_; }
  // Waits until the transport released every send of `region` (all: SendLedger::kAll).
  void wait(std::size_t region) { sends_.wait(region, timeout_); }
  void send_all(Rank to, std::uint64_t tag, std::span<float> range, std::size_t region) {
    for_segments(range, seg_,
                 [&](std::span<float> part) { sends_.send(comm_, to, tag, part, region); });
  }
  // Receives `range` segment by segment, added into it or stored.
  void receive_all(Rank from, std::uint64_t tag, std::span<float> range, bool add) {
    for_segments(range, seg_, [&](std::span<float> part) {
      const bool ok = add ? recv_add_floats(comm_, from, tag, part, timeout_)
                          : recv_floats(comm_, from, tag, part, timeout_);
      if (!ok) silent_peer(from, timeout_);
    });
  }
  // Fold for n not a power of two p: among the first 2 (n - p) ranks, each even rank hands its
  // vector to the odd one above it and sits out, then receives the result (the unfold, tag + 2):
  // nullopt. The others get ranks 0..p-1 (real() maps them back).
  std::optional<Rank> fold(std::span<float> data, std::uint64_t tag) {
    const Rank r = comm_.rank(), rem = comm_.size() - std::bit_floor(comm_.size());
    if (r >= 2 * rem) return r - rem;
    if (r % 2 == 1) {
      receive_all(r - 1, tag, data, true);
      return r / 2;
    }
    send_all(r + 1, tag, data, 0);
    wait(0);
    receive_all(r + 1, tag + 2, data, false);
    return std::nullopt;
  }
  [[nodiscard]] Rank real(Rank v) const {
    const Rank rem = comm_.size() - std::bit_floor(comm_.size());
    return v < rem ? 2 * v + 1 : v + rem;
  }
  // After the doubling: the odd ranks of the fold send the result down; every send released.
  void unfold(std::span<float> data, std::uint64_t tag) {
    const Rank r = comm_.rank(), rem = comm_.size() - std::bit_floor(comm_.size());
    if (r < 2 * rem) send_all(r - 1, tag + 2, data, 0);
    wait(SendLedger::kAll);
  }

 private:
  Comm& comm_;
  const std::size_t seg_;
  const std::chrono::milliseconds timeout_;
  SendLedger sends_;
};

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
  SendLedger sends(n);  // one region per chunk
  // Step s (0 .. 2n-3) receives chunk (r - s - 1) mod n in reduce-scatter (s < n-1) and chunk
  // (r - (s - (n-1))) mod n in all-gather, and forwards each segment as the next step's send.
  // A chunk is sent in reduce-scatter before all-gather overwrites it: that waits for the sends.
  for_segments(chunk(r), seg,
               [&](std::span<float> part) { sends.send(comm_, next, tag, part, r); });
  const std::size_t steps = 2 * (std::size_t{n} - 1);
  for (std::size_t s = 0; s < steps; ++s) {
    const bool reduce = s < n - 1;
    const std::size_t c = reduce ? (r + 2 * std::size_t{n} - s - 1) % n
                                 : (r + 2 * std::size_t{n} - (s - (n - 1))) % n;
    if (!reduce) sends.wait(c, options_.timeout);
    for_segments(chunk(c), seg, [&](std::span<float> part) {
      const bool ok = reduce ? recv_add_floats(comm_, prev, tag, part, options_.timeout)
                             : recv_floats(comm_, prev, tag, part, options_.timeout);
      if (!ok) silent_peer(prev, options_.timeout);
      if (s + 1 < steps) sends.send(comm_, next, tag, part, c);
    });
  }
  sends.wait(SendLedger::kAll, options_.timeout);
}

void AllReducer::recursive_doubling(std::span<float> data, std::uint64_t tag) {
  const Rank p = std::bit_floor(comm_.size());  // largest power of two <= n
  const auto timeout = options_.timeout;
  Segmented io(comm_, options_, 2);  // regions: 0 the caller's vector, 1 the scratch buffer
  const std::optional<Rank> vrank = io.fold(data, tag);
  if (!vrank) return;
  // Each step sends the buffer holding this rank's partial sum without a copy and writes its sum
  // with the partner's into the other buffer, segment by segment as the partner's arrive: both
  // partners add the same two vectors and float addition commutes, so every rank ends with a
  // bit-identical result even for non-integer data. A buffer is written only once the transport
  // released its sends of two steps before.
  if (scratch_.size() < data.size()) scratch_.resize(data.size());
  std::span<float> buffers[2] = {data, std::span<float>(scratch_.data(), data.size())};
  std::size_t cur = 0;
  for (Rank mask = 1; mask < p; mask <<= 1) {
    const Rank partner = io.real(*vrank ^ mask);
    const std::size_t nxt = 1 - cur;
    io.send_all(partner, tag + 1, buffers[cur], cur);
    io.wait(nxt);
    for (std::size_t off = 0; off < data.size(); off += io.seg()) {
      const std::size_t len = std::min(io.seg(), data.size() - off);
      auto got = comm_.recv(partner, tag + 1, timeout);
      if (!got) silent_peer(partner, timeout);
      if (got->size() != len * sizeof(float)) {
        throw ProtocolError("allreduce: rank " + std::to_string(partner) + " sent " +
                            std::to_string(got->size()) + " bytes, expected " +
                            std::to_string(len * sizeof(float)));
      }
      const float* __restrict in = reinterpret_cast<const float*>(got->data());
      const float* __restrict mine = buffers[cur].data() + off;
      float* __restrict out = buffers[nxt].data() + off;
      for (std::size_t i = 0; i < len; ++i) out[i] = mine[i] + in[i];
    }
    cur = nxt;
  }
  if (cur == 1) {  // the sum is in the scratch buffer
    io.wait(0);
    std::copy(buffers[1].begin(), buffers[1].end(), data.begin());
  }
  io.unfold(data, tag);
}

void AllReducer::halving_doubling(std::span<float> data, std::uint64_t tag) {
  const Rank p = std::bit_floor(comm_.size());
  const auto levels = static_cast<std::size_t>(std::countr_zero(p));
  // Regions: 0 the fold's sends, 1 + k what level k of the reduce-scatter gave away, then the
  // all-gather's sends (read only from then on; waited for at the end).
  Segmented io(comm_, options_, levels + 2);
  const std::size_t late = levels + 1;
  const std::optional<Rank> vrank = io.fold(data, tag);
  if (!vrank) return;
  // Reduce-scatter by recursive halving: at level k (mask p/2, p/4, .., 1) the partners hold
  // the same range; the lower rank keeps its lower half. Partners split a range alike.
  struct Level {
    Rank partner;
    std::size_t lo, mid, hi;
    bool keep_low;
  };
  std::vector<Level> path;
  std::size_t lo = 0, hi = data.size();
  for (Rank mask = p / 2; mask >= 1; mask >>= 1) {
    const Level l{io.real(*vrank ^ mask), lo, lo + (hi - lo) / 2, hi, (*vrank & mask) == 0};
    const auto low = data.subspan(l.lo, l.mid - l.lo), high = data.subspan(l.mid, l.hi - l.mid);
    io.send_all(l.partner, tag + 1, l.keep_low ? high : low, 1 + path.size());
    io.receive_all(l.partner, tag + 1, l.keep_low ? low : high, true);
    std::tie(lo, hi) = l.keep_low ? std::pair{l.lo, l.mid} : std::pair{l.mid, l.hi};
    path.push_back(l);
  }
  // All-gather by recursive doubling, back up the path: send the reduced half, and receive the
  // partner's into the half given away at that level, once the transport released those sends.
  for (std::size_t k = path.size(); k-- > 0;) {
    const Level& l = path[k];
    const auto low = data.subspan(l.lo, l.mid - l.lo), high = data.subspan(l.mid, l.hi - l.mid);
    io.send_all(l.partner, tag + 1, l.keep_low ? low : high, late);
    io.wait(1 + k);
    io.receive_all(l.partner, tag + 1, l.keep_low ? high : low, false);
  }
  io.unfold(data, tag);
}

double allreduce_bus_bandwidth_gbps(std::size_t bytes, double seconds, Rank n) {
  if (seconds <= 0 || n < 2) return 0;
  return static_cast<double>(bytes) / seconds * 2.0 * (n - 1) / n / 1e9;
}

}  // namespace cohort::aggregation
