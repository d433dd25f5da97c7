// The client side of the parameter-server protocol, written once: every program that talks to
// shards as a client (cohort-client's participant, the simulator's virtual clients, the ps and
// load benchmarks) builds its Pull / Push requests here and checks the answers here.
//
// Three layers, each usable alone:
//   - named builders and checks for the messages (pull_request, push_request, pull_reply_for,
//     push_ack_for), for event-driven callers such as the simulator;
//   - exchange(): one request to every shard, answers awaited, resends to silent shards with
//     exponential backoff, until a deadline; it runs over the ShardLinks interface, so tests drive
//     it with a fake link and a ManualClock, without sockets;
//   - ShardClient: ShardLinks over real Endpoints (shard 0 through the coordinator's connection,
//     the others connected from the Welcome's shard list), with register, pull, push and report.
//
// Thread-safety: none; a ShardClient and its endpoints belong to one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/clock.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/messages.h"

namespace cohort::client {

// ---- messages, by name ------------------------------------------------------------------------

// What a push says about the update besides the shard's range (filled in from the ShardInfo).
struct PushFields {
  std::uint64_t round = 0;
  std::uint64_t num_samples = 0;
  std::uint64_t base_version = 0;  // the model version the update was computed from
  transport::Encoding encoding = transport::Encoding::kDenseF32;
  transport::PushKind kind = transport::PushKind::kDelta;
  float train_loss = 0;
  std::uint64_t clock = 0;  // data-parallel: the worker's clock (gradients pushed so far)
  float local_work = 0;     // FedNova's a_i (local_work.h); 0: not given
};

// A Pull of `shard`'s whole range at `min_version` (data-parallel: the worker's clock).
transport::Envelope pull_request(const transport::ShardInfo& shard, std::uint64_t round,
                                 std::uint64_t min_version);

// A Push of an update for `shard`'s whole range (elements = the range's length).
transport::Envelope push_request(const transport::ShardInfo& shard, const PushFields& fields);

// `m`'s PullReply when it answers a pull of `shard`, else nullptr. Throws ProtocolError when it
// is that shard's reply but not the shape of its range (range or payload length differ).
const transport::PullReply* pull_reply_for(const transport::ShardInfo& shard,
                                           const transport::Message& m);

// `m`'s PushAck when it answers a push for `round`, else nullptr.
const transport::PushAck* push_ack_for(std::uint64_t round, const transport::Message& m);

// ---- exchange: one request to every shard, with resends ---------------------------------------

// How exchange() reaches shard i (0 <= i < size()).
class ShardLinks {
 public:
  virtual ~ShardLinks() = default;
  [[nodiscard]] virtual std::size_t size() const = 0;
  // Throws TransportError when the shard cannot be reached now (exchange() retries later).
  virtual void send(std::size_t shard, transport::Envelope envelope,
                    transport::Payload payload) = 0;
  virtual std::optional<transport::Message> receive(std::size_t shard,
                                                    std::chrono::milliseconds wait) = 0;
  // Waits up to `wait` until one of `shards` has a message (or a chunk of one) ready; returns
  // that shard, or -1 on timeout. receive(shard, 0ms) then takes it (or nothing yet, for a chunk).
  virtual int wait_any(std::span<const std::size_t> shards, std::chrono::milliseconds wait) = 0;
  // Payload bytes of earlier sends to `shard` still queued in this process, not yet on the wire
  // (a slow link); 0 when not known.
  [[nodiscard]] virtual std::uint64_t unsent_bytes(std::size_t /*shard*/) const { return 0; }
  // True while something from `shard` is streaming in (a reply over a slow link); false when not
  // known.
  [[nodiscard]] virtual bool receiving(std::size_t /*shard*/) const { return false; }
};

// When each shard's request goes out again: at once, then after `first` unanswered, then after
// twice that, and so on up to `max`. Pure; the caller supplies the time.
class ResendSchedule {
 public:
  ResendSchedule(std::size_t shards, Duration first, Duration max);
  // The shards whose request is due at `now`: never sent, or unanswered for their wait.
  [[nodiscard]] std::vector<std::size_t> due(TimePoint now) const;
  // The request went out at `at` (after its send returned: a large push takes a while); the
  // shard's next wait doubles.
  void sent(std::size_t shard, TimePoint at);
  // A resend is due while the last copy has not left yet (a link slower than the request's size
  // per wait): another copy would only queue behind it. The shard's next try waits `first` from
  // `now`, the wait it would have had after a send that left at once; its doubling waits too.
  void postpone(std::size_t shard, TimePoint now) { next_[shard] = now + first_; }
  void mark_answered(std::size_t shard) { answered_[shard] = true; }
  [[nodiscard]] bool is_answered(std::size_t shard) const { return answered_[shard]; }
  [[nodiscard]] bool was_sent(std::size_t shard) const { return sent_[shard]; }
  [[nodiscard]] bool all_answered() const;

 private:
  std::vector<bool> answered_;
  std::vector<bool> sent_;
  std::vector<TimePoint> next_;
  std::vector<Duration> wait_;
  Duration first_;
  Duration max_;
};

struct ExchangeOptions {
  TimePoint deadline;
  // The shard may hold the request on purpose (data-parallel SSP/BSP pulls): resend rarely
  // (30 s, then doubling) instead of after 3 s.
  bool patient = false;
  const std::atomic<bool>* stop = nullptr;  // set: give up at once
  // Messages that are no answer to this exchange but must not be lost (a RoundStart or Bye that
  // arrives on the coordinator's connection while shard 0 is asked): handed over here.
  std::function<void(transport::Message&&)> other;
  std::string who = "client";  // for log lines
  // False: one request per shard, never resent (a benchmark that times one request, or a push
  // whose acknowledgement may take longer than any resend interval).
  bool resend = true;
};

using MakeRequest = std::function<std::pair<transport::Envelope, transport::Payload>(std::size_t)>;
// True when `m` is shard i's answer (the exchange stops waiting for that shard).
using AcceptAnswer = std::function<bool(std::size_t, transport::Message&)>;

// Sends make(i) to every shard and waits for each answer `accept` takes, resending on the
// ResendSchedule. Returns true when every shard answered, false at the deadline or on stop. A send
// that fails (TransportError) is retried at the next resend; without resends it is rethrown.
// RoundStart, Bye and SecAgg messages go to options.other; other unaccepted messages are dropped.
bool exchange(ShardLinks& links, const Clock& clock, const MakeRequest& make,
              const AcceptAnswer& accept, const ExchangeOptions& options);

// What pull_all and push_all measured of each link: one LinkSample per shard that answered, in
// shard order, with its ShardInfo.index. The time runs from the first request to that shard
// (before its send, which for a large push streams the payload) to its answer, on the exchange's
// clock: latency, transfer and the shard's own work, and any resends, all included. Bytes are the
// payload's (pull: the reply's; push: the update's). A pull fills the down_* fields, a push the
// up_* fields; the client merges the two (merge_link_samples) for its ClientReport.
using LinkSamples = std::vector<transport::LinkSample>;

struct PullOutcome {
  bool answered = false;  // every shard replied before the deadline
  LinkSamples links;
  explicit operator bool() const { return answered; }
};

// Pulls every shard's range into `params` (the flat model). answered = false at the deadline or on
// stop. `batch_size`, when given, receives shard 0's PullReply.batch_size (data-parallel speed
// batches).
PullOutcome pull_all(ShardLinks& links, const std::vector<transport::ShardInfo>& shards,
                     const Clock& clock, std::uint64_t round, std::uint64_t min_version,
                     std::span<float> params, const ExchangeOptions& options,
                     std::uint32_t* batch_size = nullptr);

struct PushOutcome {
  bool answered = false;              // every shard acknowledged before the deadline
  std::vector<std::string> refusals;  // the reasons of the shards that refused
  LinkSamples links;                  // acknowledged shards (a refusal is an answer too)
  [[nodiscard]] bool accepted() const { return answered && refusals.empty(); }
};

// One sample per shard of either list, ordered by shard, with the down_* fields of `pulled` and
// the up_* fields of `pushed`.
LinkSamples merge_link_samples(const LinkSamples& pulled, const LinkSamples& pushed);

// Pushes shard i's bytes, bytes_of(i), with `fields` (encoding_of(i) when given) to every shard.
PushOutcome push_all(ShardLinks& links, const std::vector<transport::ShardInfo>& shards,
                     const Clock& clock, const PushFields& fields,
                     const std::function<std::span<const std::byte>(std::size_t)>& bytes_of,
                     const ExchangeOptions& options,
                     const std::function<transport::Encoding(std::size_t)>& encoding_of = {});

// ---- ShardClient: the links over real endpoints -----------------------------------------------

class ShardClient final : public ShardLinks {
 public:
  // `coordinator` is shard 0's connection too; other shards get endpoints made with
  // options_for(their node id). Both must outlive this object.
  ShardClient(transport::Context& ctx, transport::Endpoint& coordinator,
              std::function<transport::EndpointOptions(const std::string& node_id)> options_for);

  // Sends Register and waits up to `wait` for the Welcome. RoundStart messages that arrive first
  // go to `other`; an ErrorBody ends the wait (its text is returned in `refusal`).
  std::optional<transport::Welcome> register_once(
      const transport::Register& r, std::chrono::milliseconds wait,
      const std::function<void(transport::Message&&)>& other, std::string* refusal = nullptr);

  // Connects to the Welcome's shards (shard 0 through the coordinator). Endpoints of an earlier
  // layout are closed.
  void connect(const std::vector<transport::ShardInfo>& shards);
  [[nodiscard]] const std::vector<transport::ShardInfo>& shards() const { return shards_; }
  transport::Endpoint& endpoint(std::size_t shard);
  // Waits until every shard connection finished its handshake (throws as Endpoint::wait_ready).
  void wait_ready(std::chrono::milliseconds timeout);

  // Sends `r` to the coordinator; false (and a log line) when the connection is gone.
  bool report(const transport::ClientReport& r, const std::string& who);

  // Payload bytes over the coordinator's and every shard's connection.
  [[nodiscard]] std::uint64_t bytes_sent() const;
  [[nodiscard]] std::uint64_t bytes_received() const;

  [[nodiscard]] std::size_t size() const override { return shards_.size(); }
  void send(std::size_t shard, transport::Envelope envelope, transport::Payload payload) override;
  std::optional<transport::Message> receive(std::size_t shard,
                                            std::chrono::milliseconds wait) override;
  int wait_any(std::span<const std::size_t> shards, std::chrono::milliseconds wait) override;
  [[nodiscard]] std::uint64_t unsent_bytes(std::size_t shard) const override;
  [[nodiscard]] bool receiving(std::size_t shard) const override;

 private:
  transport::Context& ctx_;
  transport::Endpoint& coordinator_;
  std::function<transport::EndpointOptions(const std::string&)> options_for_;
  std::vector<transport::ShardInfo> shards_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;  // null: the coordinator's
};

}  // namespace cohort::client
