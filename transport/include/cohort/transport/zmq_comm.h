// The Comm interface (core/comm.h) over ZeroMQ Endpoints, with the Endpoint's security: mutual
// TLS 1.3 + AES-256-GCM by default, plaintext only with security.insecure.
//
// Each rank binds one ROUTER (its inbox) and connects one DEALER to every peer it sends to, on
// first use or via connect(). A message is one Endpoint message: a GossipExchange envelope whose
// step carries the tag and fromRank the sender's rank, and the bytes as its payload (chunked by
// the Endpoint above chunk_bytes). Under TLS a message is accepted only when the authenticated
// certificate names the node id registered for its rank; otherwise it is dropped with a warning.
//
// While waiting for one peer's message or handshake, the Comm keeps reading every socket and
// parks what arrives in a Mailbox, so two ranks that send to each other never deadlock.
// A send to a peer that cannot be reached (its handshake does not complete within the options'
// handshake_timeout on first contact, 200 ms once it had been connected) is dropped with a
// warning, like a message to a crashed process: gossip treats the silence, not the sender.
//
// Thread-safety: a ZmqComm is owned and used by one thread (the thread of its sockets).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cohort/core/comm.h"
#include "cohort/transport/endpoint.h"

namespace cohort::transport {

struct PeerAddress {
  std::string url;  // the peer's ROUTER, e.g. tcp://10.0.0.5:7100
  NodeId node_id;   // the CN its certificate must carry
  bool operator==(const PeerAddress&) const = default;
};

class ZmqComm final : public Comm {
 public:
  // Binds our ROUTER at bind_url (tcp://host:* picks a port; see url()). options.node_id is ours.
  ZmqComm(Context& ctx, Rank rank, Rank size, const std::string& bind_url, EndpointOptions options);
  ~ZmqComm() override;
  ZmqComm(const ZmqComm&) = delete;
  ZmqComm& operator=(const ZmqComm&) = delete;

  // Our ROUTER's url with the real port, to announce to the others.
  [[nodiscard]] const std::string& url() const;
  // The group's addresses, indexed by rank (our own entry is ignored). May be called again when
  // membership changes: a rank whose address changed is reconnected on next use; `size` grows.
  void set_peers(std::vector<PeerAddress> peers);
  // Connects to `ranks` now and drives the handshakes (also answering incoming ones) until all are
  // ready. Throws TimeoutError naming a rank that did not answer within `timeout`.
  void connect(std::span<const Rank> ranks, std::chrono::milliseconds timeout);
  // Closes the connection to a rank that left and drops its queued messages.
  void forget(Rank r);
  // Our rank, when it is only known after binding (a peer learns it from the coordinator).
  void set_rank(Rank r);

  [[nodiscard]] Rank rank() const override;
  [[nodiscard]] Rank size() const override;
  void send(Rank to, std::uint64_t tag, std::span<const std::byte> bytes) override;
  // Plaintext: the bytes go to ZeroMQ without a copy, and `owner` is released once it is done
  // with them; over TLS they are sealed into the pool's chunks as send() does.
  void send_shared(Rank to, std::uint64_t tag, std::span<const std::byte> bytes,
                   std::shared_ptr<const void> owner) override;
  [[nodiscard]] std::optional<PooledBuffer> recv(Rank from, std::uint64_t tag,
                                                 std::chrono::milliseconds timeout) override;
  [[nodiscard]] std::uint64_t bytes_sent() const override;
  [[nodiscard]] std::uint64_t bytes_received() const override;

  // Reads whatever the sockets hold into the mailbox, waiting at most `timeout` for the first
  // record. For a thread that only serves handshakes while it computes.
  void pump(std::chrono::milliseconds timeout);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::transport
