// The coordinator's side of secure aggregation in one federated round (server.secure_aggregation;
// docs/ALGORITHMS.md 8.1 and 8.2): it collects the cohort's keys (R0) and sealed shares (R1) and
// routes them, asks the shards to stop taking masked inputs and say whose they hold, asks the
// survivors for their unmasking shares (R4), rebuilds the seeds whose masks the shards remove
// (secagg::reconstruct) and hands them to the shards. Every stage has a deadline
// (secagg.stage_ms); who misses it has dropped. Fewer survivors than a stage needs fail the round
// with the reason. It reads time from a Clock and sends through an Outbox, so tests drive it
// without sockets. Internal to the server library; not thread-safe (the coordinator's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/clock.h"
#include "cohort/transport/secagg_messages.h"

#include "outbox.h"
#include "server_options.h"

namespace cohort::server {

class SecAggRound {
 public:
  // A member of the cohort: its protocol id (the coordinator's client index), node id, connection
  // and the factor it scales its update by (FedAvg: n_k over the cohort's samples; under DP 1/m).
  struct Member {
    std::uint32_t id = 0;
    NodeId node;
    transport::PeerHandle peer;
    double weight = 0;
  };
  // How the coordinator reaches its shards: send(i, envelope, payload) to shard i (false when it
  // is down); shard 0 is the coordinator's own and answers through on_held() directly.
  struct Shards {
    std::size_t count = 1;
    std::function<bool(std::size_t, transport::Envelope, transport::Payload)> send;
    std::function<NodeId(std::size_t)> node;  // shard i's node id (its kHeld answer's sender)
    // Shard 0 in the coordinator's process: freeze round r, return whom it holds.
    std::function<std::vector<NodeId>(std::uint64_t)> local_held;
    // Shard 0: the seeds of round r.
    std::function<void(std::uint64_t, const transport::SecAggData&)> local_seeds;
  };
  enum class Stage { kIdle, kAdvertise, kShares, kMasking, kHeld, kUnmask, kDone, kFailed };

  SecAggRound(const SecAggOptions& options, Outbox& out, const Clock& clock, Shards shards);

  // Round `round` starts with `cohort` (the RoundStarts went out: each member advertises its keys
  // next); `vector_size`: the model's coordinates.
  void begin(std::uint64_t round, std::vector<Member> cohort, std::uint64_t vector_size);
  // A SecAgg message for the coordinator (a client's stage, or a shard's kHeld answer). Bad ones
  // (wrong round or stage, a sender outside the stage's set, a repeat, malformed data) are
  // refused: logged, answered with an ErrorBody, and without effect on the round.
  void on_message(const transport::Message& m, const transport::SecAgg& s);
  // The round closes: freeze the shards, then unmask. U3 is whose masked inputs every shard holds
  // (their held answers), not whose reports came. REQUIRES stage() == kMasking.
  void close();
  // Deadlines and retries; call it from the coordinator's tick.
  void tick();

  [[nodiscard]] Stage stage() const { return stage_; }
  [[nodiscard]] std::uint64_t round() const { return round_; }
  // Why the round failed (stage() == kFailed).
  [[nodiscard]] const std::string& failure() const { return failure_; }
  // Who survived (U3), once stage() == kDone.
  [[nodiscard]] std::size_t survivors() const { return u3_.size(); }
  // Members that dropped at each stage so far (for the round's record).
  [[nodiscard]] std::size_t dropped() const;
  // The round is over for secure aggregation (committed or failed elsewhere): forget it.
  void reset();

 private:
  struct Held {
    bool answered = false;
    std::set<NodeId> nodes;
  };
  void fail(std::string why);
  void refuse(const transport::Message& m, const std::string& why);
  // R0 done (all advertised, or the deadline): send every member of U1 the keys.
  void finish_advertise();
  // R1 done: forward to each member of U2 the shares sealed for it.
  void finish_shares();
  // The shards all answered kHeld: U3, then ask U3 for their unmasking shares.
  void finish_held();
  // R4 done: reconstruct and send the seeds to the shards.
  void finish_unmask();
  void send_held(std::size_t shard);
  bool send_data(const transport::PeerHandle& peer, transport::SecAggStage stage,
                 const transport::SecAggData& data);
  [[nodiscard]] aggregation::secagg::Params params() const;
  const Member* member(const NodeId& node) const;

  SecAggOptions options_;
  Outbox& out_;
  const Clock& clock_;
  Shards shards_;
  Stage stage_ = Stage::kIdle;
  std::string failure_;
  std::uint64_t round_ = 0;
  std::uint64_t vector_size_ = 0;
  TimePoint deadline_;
  std::map<NodeId, Member> cohort_;
  std::map<std::uint32_t, NodeId> by_id_;
  std::map<std::uint32_t, aggregation::secagg::Advertisement> adverts_;  // U1 (so far)
  std::vector<std::uint32_t> u1_;                                        // sorted
  std::size_t threshold_ = 2, degree_ = 0;
  aggregation::secagg::Key graph_seed_{};
  std::map<std::uint32_t, std::vector<transport::SecAggSealed>> shares_;  // U2: sender -> sealed
  std::vector<Held> held_;
  TimePoint held_retry_;
  std::vector<std::uint32_t> u3_;  // sorted
  std::map<std::uint32_t, aggregation::secagg::UnmaskingShares> responses_;
};

}  // namespace cohort::server
