// Point-to-point messaging between the ranks of a group: the seam collectives and gossip talk
// through (docs/DESIGN.md "Layout"). transport/ implements it over ZeroMQ (ZmqComm); tests and
// in-process simulations use InMemoryNetwork, so every algorithm runs without sockets.
//
// Semantics every implementation keeps:
// - send() copies (or seals) the bytes before it returns: the caller may reuse them at once. It
//   never waits for the receiver to call recv().
// - Messages from one rank to another with the same tag arrive in the order they were sent.
//   Messages with other tags, or from other ranks, are kept until asked for.
// - recv() waits up to `timeout` for the next message from `from` with `tag`; nullopt on timeout
//   (the caller decides whether the peer is gone).
// - A rank sending to itself is an InternalError (algorithms handle their own share locally).
//
// Thread-safety: a Comm is used by one thread at a time (the thread running the algorithm).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cohort/core/buffer.h"

namespace cohort {

using Rank = std::uint32_t;

class Comm {
 public:
  virtual ~Comm() = default;
  [[nodiscard]] virtual Rank rank() const = 0;
  [[nodiscard]] virtual Rank size() const = 0;
  // Throws TransportError when the message cannot be handed over (unknown rank, transport
  // failure). A send to a peer that has gone away may succeed and be lost.
  virtual void send(Rank to, std::uint64_t tag, std::span<const std::byte> bytes) = 0;
  // As send(), but the bytes may be read after it returns, until the last copy of `owner` (not
  // null) is released, possibly on another thread: the transport may send them without copying
  // them (ZmqComm in plaintext). The caller must not change them before then. The default
  // copies, as send() does, and so releases `owner` at once.
  virtual void send_shared(Rank to, std::uint64_t tag, std::span<const std::byte> bytes,
                           std::shared_ptr<const void> owner) {
    (void)owner;
    send(to, tag, bytes);
  }
  [[nodiscard]] virtual std::optional<PooledBuffer> recv(Rank from, std::uint64_t tag,
                                                         std::chrono::milliseconds timeout) = 0;
  // Payload bytes this rank has sent and received so far.
  [[nodiscard]] virtual std::uint64_t bytes_sent() const = 0;
  [[nodiscard]] virtual std::uint64_t bytes_received() const = 0;
};

// Typed helpers. recv_floats: false on timeout; ProtocolError when the message is not exactly
// out.size() floats. recv_add_floats adds the received values into `acc` (same checks).
void send_floats(Comm& comm, Rank to, std::uint64_t tag, std::span<const float> values);
[[nodiscard]] bool recv_floats(Comm& comm, Rank from, std::uint64_t tag, std::span<float> out,
                               std::chrono::milliseconds timeout);
[[nodiscard]] bool recv_add_floats(Comm& comm, Rank from, std::uint64_t tag, std::span<float> acc,
                                   std::chrono::milliseconds timeout);

// A mailbox of messages keyed by (sender, tag), FIFO per key: the shared part of every Comm.
// Thread-safe: put() from any thread, take() waits on a condition variable.
class Mailbox {
 public:
  void put(Rank from, std::uint64_t tag, PooledBuffer message);
  // Waits up to `timeout`; nullopt on timeout or after close().
  std::optional<PooledBuffer> take(Rank from, std::uint64_t tag, std::chrono::milliseconds timeout);
  // Non-blocking take.
  std::optional<PooledBuffer> try_take(Rank from, std::uint64_t tag);
  // Wakes every waiter; later puts are dropped and takes return what is left, then nullopt.
  void close();
  // Drops every message from `from` (a peer that left).
  void drop_from(Rank from);
  // Empties the mailbox and accepts messages again (after close()).
  void reopen();

 private:
  std::mutex mu_;  // guards queues_ and closed_
  std::condition_variable cv_;
  std::map<std::pair<Rank, std::uint64_t>, std::deque<PooledBuffer>> queues_;
  bool closed_ = false;
};

// n ranks inside one process, for tests and simulations. comm(r) is rank r's endpoint; each is
// driven by one thread. send_shared() hands the receiver the sender's own bytes, kept (with
// `owner`) until the receiver drops them, so a sender that changes them too early is caught.
// kill(r) makes rank r vanish: messages to and from it are dropped, and its own sends and receives
// are no-ops that time out, as with a crashed process.
class InMemoryNetwork {
 public:
  explicit InMemoryNetwork(Rank n, std::shared_ptr<BufferPool> buffers = nullptr);
  ~InMemoryNetwork();
  InMemoryNetwork(const InMemoryNetwork&) = delete;
  InMemoryNetwork& operator=(const InMemoryNetwork&) = delete;

  [[nodiscard]] Rank size() const { return static_cast<Rank>(comms_.size()); }
  Comm& comm(Rank r);
  void kill(Rank r);
  // Brings a killed rank back with an empty mailbox.
  void revive(Rank r);
  [[nodiscard]] bool alive(Rank r) const;

  class Endpoint;

 private:
  std::shared_ptr<BufferPool> buffers_;
  std::vector<std::unique_ptr<Endpoint>> comms_;
};

}  // namespace cohort
