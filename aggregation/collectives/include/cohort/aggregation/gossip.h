// One node's side of gossip over a Comm and a Topology: the exchanges every decentralized
// optimizer is built from (docs/ALGORITHMS.md 5.1, 5.4, 7.7).
//
// Each exchange is tagged with its step (tag_base + step), so messages of different steps never
// mix. Two kinds of absence:
// - gone (set_gone(), from membership: the coordinator saw the peer leave or stop heartbeating):
//   not sent to, not waited for; its weight moves to our own (see neighbourhood()).
// - suspect: its message did not arrive within `timeout`. It is still sent to, but from then on
//   only polled (no waiting): a step without its message moves its weight to our own, and the
//   first message that arrives in time makes it a full neighbour again. A slow neighbour thus
//   costs one timeout, a crashed one costs one timeout, and nobody is cut off for being late
//   behind someone else's crash.
// Dropping a neighbour for a step breaks the symmetry of W for that step, so the network average
// may drift by that step's difference; push-sum loses the share (x and w together, so z = x / w
// stays unbiased); CHOCO's copy of that neighbour falls behind until it reappears.
// Thread-safety: one Gossip per node, driven by the node's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "cohort/aggregation/topology.h"
#include "cohort/core/buffer.h"
#include "cohort/core/comm.h"

namespace cohort::aggregation {

struct GossipOptions {
  std::chrono::milliseconds timeout{30000};  // silent this long: the neighbour is gone
  std::uint64_t tag_base = 0;
  // Asynchronous gossip with a staleness bound S (0: synchronous). mix() at step t uses each
  // in-neighbour's newest model that has arrived, and waits only when that is older than step
  // t - S; before any has arrived (t < S) the neighbour's weight stays with us. A node may thus
  // run up to S steps ahead of its slowest neighbour. Static topologies only (ConfigError
  // otherwise); push() and exchange() stay synchronous.
  std::uint64_t staleness = 0;
};

class Gossip {
 public:
  // `topology` must outlive the Gossip.
  Gossip(Comm& comm, const Topology& topology, GossipOptions options = {});

  [[nodiscard]] Rank rank() const { return comm_.rank(); }
  [[nodiscard]] Rank size() const { return comm_.size(); }
  [[nodiscard]] Comm& comm() { return comm_; }
  [[nodiscard]] const Topology& topology() const { return topology_; }

  // Our neighbourhood at `step`, without the neighbours taken as gone.
  [[nodiscard]] Neighbourhood neighbourhood_at(std::uint64_t step) const;

  // out = sum_j W_ij v_j over our live neighbourhood (v_i = v). Sends v to our out-neighbours.
  // REQUIRES: out.size() == v.size(), out does not alias v.
  void mix(std::uint64_t step, std::span<const float> v, std::span<float> out);

  // Push-sum (5.5-5.6): sends the shares P_ji (x, w) to our live out-neighbours, keeps our own
  // share plus the shares of gone ones (so no mass is lost on our side), and adds what our
  // in-neighbours pushed. x is updated in place; returns the new w.
  double push(std::uint64_t step, std::span<float> x, double w);

  // Sends `bytes` to every live out-neighbour and collects one message from every live
  // in-neighbour (CHOCO's compressed differences). Returns (rank, W_ij, bytes) per received one.
  struct Received {
    Rank from;
    double weight;
    PooledBuffer bytes;
  };
  std::vector<Received> exchange(std::uint64_t step, std::span<const std::byte> bytes,
                                 double* self_weight = nullptr);

  [[nodiscard]] const std::set<Rank>& gone() const { return gone_; }
  [[nodiscard]] const std::set<Rank>& suspects() const { return suspects_; }
  void set_gone(std::set<Rank> gone) { gone_ = std::move(gone); }
  // A neighbour that is back; with asynchronous gossip, its messages count from `from_step`.
  void rejoin(Rank r, std::uint64_t from_step = 0) {
    gone_.erase(r);
    suspects_.erase(r);
    if (options_.staleness > 0) latest_[r] = Latest{from_step, false, {}};
  }
  // Bytes sent by this node's Comm so far.
  [[nodiscard]] std::uint64_t bytes_sent() const { return comm_.bytes_sent(); }

 private:
  std::uint64_t tag(std::uint64_t step) const { return options_.tag_base + step; }
  // The message of in-neighbour j for `step`: waits up to the timeout, or only polls when j is
  // a suspect; updates the suspect set.
  std::optional<PooledBuffer> receive_from(Rank j, std::uint64_t step);

  Comm& comm_;
  const Topology& topology_;
  GossipOptions options_;
  void mix_stale(std::uint64_t step, std::span<const float> v, std::span<float> out);

  std::set<Rank> gone_;
  std::set<Rank> suspects_;
  struct Latest {            // asynchronous gossip: the newest model from one in-neighbour
    std::uint64_t next = 0;  // the next step whose message we have not taken
    bool has = false;
    std::vector<float> model;
  };
  std::map<Rank, Latest> latest_;
  std::vector<float> scratch_;  // reused send buffer of push()
};

}  // namespace cohort::aggregation
