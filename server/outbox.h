// The seam between the server's logic (shard, coordinator) and the network: they send through an
// Outbox and never touch a transport::Endpoint, so tests drive them with a recording outbox and
// no sockets. node.cc implements it over the listening Endpoint. Internal to the server library.
#pragma once

#include "cohort/transport/endpoint.h"

namespace cohort::server {

class Outbox {
 public:
  virtual ~Outbox() = default;
  // Sends one logical message to `peer` (Endpoint::send). Returns false when the peer is gone
  // (its connection closed). May throw TimeoutError, as Endpoint::send does.
  virtual bool send(const transport::PeerHandle& peer, transport::Envelope envelope,
                    transport::Payload payload) = 0;
  bool send(const transport::PeerHandle& peer, transport::Envelope envelope) {
    return send(peer, std::move(envelope), transport::Payload{});
  }
};

}  // namespace cohort::server
