// One client's side of secure aggregation in one federated round (server.secure_aggregation;
// docs/ALGORITHMS.md 8.1, 8.2): the coordinator's stages (server/secagg_round.h) as plain data in,
// plain data out, over aggregation/secure_aggregation.h's Client. cohort-client's participant and
// cohort-sim's fleet both run it; neither sends anything it did not return.
//
// Not thread-safe. Secrets stay in the secagg::Client, which wipes them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/transport/secagg_messages.h"

namespace cohort::client {

class SecAggSession {
 public:
  // `id`: this client's protocol id (Welcome.client_index); `vector_size`: the model's length.
  SecAggSession(std::uint32_t id, std::uint64_t round, std::uint64_t vector_size);

  // R0: this client's public keys.
  [[nodiscard]] transport::SecAggData advertise() const;
  // R0 -> R1: the coordinator's U1 (keys, weights, threshold, graph, fixed point). Returns the
  // sealed shares to send. ProtocolError when this client is not in U1 or its keys were altered,
  // the fixed point or sizes disagree with this client's, or the library refuses (secagg::Client).
  [[nodiscard]] transport::SecAggData on_keys(const transport::SecAggData& keys);
  // R1 -> R2: the shares the coordinator forwarded. ProtocolError as secagg::Client::open_shares.
  void on_forwarded(const transport::SecAggData& forwarded);
  // R2: the masked input for `update` (the delta): scaled by this client's weight, clipped to
  // [-c, c], quantised with stochastic rounding from `seed`, masked. REQUIRES on_forwarded() done
  // and update.size() == vector_size.
  [[nodiscard]] std::vector<std::uint32_t> masked_input(std::span<const float> update,
                                                        std::uint64_t seed) const;
  // R4: this client's unmasking shares for U3, once; a second request (another survivor set) is
  // refused with ProtocolError: answering two would reveal a self mask and a mask key together.
  [[nodiscard]] transport::SecAggData on_unmask(const transport::SecAggData& ask);

  [[nodiscard]] bool keyed() const { return keyed_; }
  [[nodiscard]] bool masking() const { return opened_; }
  [[nodiscard]] double weight() const { return weight_; }
  [[nodiscard]] std::uint64_t round() const { return round_; }

 private:
  std::uint32_t id_;
  std::uint64_t round_;
  std::uint64_t vector_size_;
  std::unique_ptr<aggregation::secagg::Client> client_;
  double weight_ = 0;
  double clip_ = 0;
  std::uint32_t levels_ = 0;
  bool keyed_ = false, opened_ = false, unmasked_ = false;
};

}  // namespace cohort::client
