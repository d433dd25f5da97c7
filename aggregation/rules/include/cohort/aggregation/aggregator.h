// How a parameter-server shard combines the updates pushed in one round (the Aggregator plug-in).
//
// A shard owns a contiguous range of the flat parameter vector; an Aggregator sees only that range.
// Updates arrive in chunks (the transport's 1 MiB pieces): a streaming rule (FedAvg) folds each
// chunk in as it arrives and keeps O(range) memory whatever the number of clients; a rule that
// needs every update at once (median, Krum) says so with is_streaming() == false, and the shard
// then hands it each client's whole update in one piece.
//
// Contract, per round: begin_round(); then for each client its chunks in order (chunks of
// different clients may interleave), each followed eventually by end_update(client, complete);
// then finish_round(). Instances are not thread-safe: the shard drives each from one thread.
// Bad client data (wrong size, non-finite values) yields Verdict::kRejected, never an exception.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cohort/core/config.h"
#include "cohort/core/ids.h"

namespace cohort::aggregation {

// One piece of one client's update, already decoded by the shard.
struct UpdateChunk {
  ClientId client = 0;
  std::size_t offset = 0;         // first element, relative to the shard's range
  std::span<const float> values;  // valid only during accept(); copy what you keep
  double weight = 1.0;            // e.g. the client's sample count; equal for all its chunks
};

enum class Verdict { kAccepted, kRejected };

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  // True: accept() takes chunks as they arrive. False: the shard reassembles every update and
  // calls accept() once per client with offset 0 and the whole range (O(clients x range) memory).
  [[nodiscard]] virtual bool is_streaming() const = 0;
  virtual void begin_round(std::uint64_t round, std::size_t size) = 0;
  // kRejected for a chunk outside the range, a non-finite value, or a chunk of a client whose
  // update was already ended or rejected in this round.
  [[nodiscard]] virtual Verdict accept(const UpdateChunk& chunk) = 0;
  // The client's update is complete, or abandoned (a chunk was rejected, the client vanished).
  // What a streaming rule already folded in of an abandoned update stays, chunk-wise exact: see
  // the rule's own comment.
  virtual void end_update(ClientId client, bool complete) = 0;
  // Updates completed (end_update with complete == true) since begin_round().
  [[nodiscard]] virtual std::size_t completed_updates() const = 0;
  // The fewest complete updates with which finish_round() can succeed (Krum needs 2f + 3, Bulyan
  // 4f + 3). A shard should not close a round on fewer; finish_round() returns false if it does.
  [[nodiscard]] virtual std::size_t min_updates() const { return 1; }
  // Writes the round's aggregate delta. REQUIRES out.size() == size. Returns false if no update
  // (or too few for the rule) arrived; out is then untouched.
  [[nodiscard]] virtual bool finish_round(std::span<float> out) = 0;
};

using AggregatorFactory = std::function<std::unique_ptr<Aggregator>(const ConfigSection& options)>;

// Names come from config: aggregator = { name = "fedavg" }. Built in main() and passed down.
class AggregatorRegistry {
 public:
  // Throws ConfigError if the name is taken.
  void add(std::string name, AggregatorFactory factory);
  // Throws ConfigError listing the known names if `name` is unknown.
  [[nodiscard]] std::unique_ptr<Aggregator> create(std::string_view name,
                                                   const ConfigSection& options) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;  // "fedavg, median, ..."

 private:
  std::map<std::string, AggregatorFactory, std::less<>> factories_;
};

void add_builtin_aggregators(AggregatorRegistry& registry);

}  // namespace cohort::aggregation
