// ZeroMQ endpoints that carry Envelopes with bulk payloads, chunked, and sealed by default.
//
// A server binds a ROUTER endpoint (many peers); a client connects a DEALER endpoint (one peer).
// Over tcp:// and ipc:// every connection first runs a mutual TLS 1.3 handshake (OpenSSL over
// ZeroMQ frames); the peer's certificate must come from our CA and name the node id the peer
// claims. Afterwards each record is sealed with AES-256-GCM under per-direction keys exported from
// the TLS session, with a counter nonce and a replay window. Plaintext needs `insecure = true`
// (logged as a warning), except over inproc:// inside one process.
//
// Records on the wire (one ZeroMQ multipart message each):
//   frame 0: 16-byte record header  "CH", version, kind, 4 reserved bytes, 64-bit counter
//   frame 1: the encoded Envelope   (sealed: AAD = frame 0; nonce = (0, counter))
//   frame 2: optional bulk chunk    (sealed: AAD = plaintext envelope; nonce = (1, counter))
// A payload larger than chunk_bytes is cut into chunks: chunk 0 rides with the head envelope, the
// rest follow as ChunkHeader envelopes. Receivers reassemble into one pooled buffer, or, with
// deliver_chunks, hand each chunk to the caller as it arrives (streaming aggregation).
//
// Thread-safety: an Endpoint is owned and used by one thread (its socket's thread). Sealing of
// large payloads runs on the ThreadPool given in the options. Throws TransportError for socket and
// security failures, ConfigError for bad options or unreadable key files.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/core/thread_pool.h"
#include "cohort/transport/messages.h"

namespace zmq {
class context_t;
}

namespace cohort::transport {

// One ZeroMQ context per process, made in main() and passed by reference. Must outlive every
// Endpoint made with it. Its I/O threads run under cohort::io_scheduling() as it was when the
// Context was made (SCHED_BATCH by default; see cohort/core/scheduling.h).
class Context {
 public:
  explicit Context(int io_threads = 1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  friend class Endpoint;
  struct Impl;
  zmq::context_t& zmq_context();
  std::unique_ptr<Impl> impl_;
};

// Which AES-256-GCM implementation seals records (config key transport.aead). Both are standard
// AES-256-GCM, so peers choosing differently interoperate. kAuto: Intel's ipsec-mb where the build
// has it and the CPU has AES-NI (faster with VAES), else OpenSSL. kIpsecMb: ipsec-mb, or
// a ConfigError when the endpoint is made where it cannot run. kOpenSsl: always OpenSSL.
enum class Aead { kAuto, kIpsecMb, kOpenSsl };

struct SecurityOptions {
  bool insecure = false;  // plaintext over tcp:// and ipc:// (logged as a warning)
  std::string ca_file;    // PEM: the CA every peer certificate must chain to
  std::string cert_file;  // PEM: our certificate, whose CN is our node id
  std::string key_file;   // PEM: our private key
  // Client side: the node id the server must prove (its certificate CN); empty accepts any node
  // with a certificate from our CA.
  std::string expected_peer;
  Aead aead = Aead::kAuto;
};

struct EndpointOptions {
  NodeId node_id;  // our id; under TLS it must equal our certificate's CN
  SecurityOptions security;
  std::size_t chunk_bytes = std::size_t{1} << 20;  // 1 MiB: overlaps recv, open and aggregate
  std::uint64_t max_payload_bytes = std::uint64_t{4} << 30;
  std::size_t max_open_transfers = 64;  // per peer
  bool deliver_chunks = false;          // see header comment
  ThreadPool* pool = nullptr;           // seals chunks in parallel; null: inline
  std::shared_ptr<BufferPool> buffers;  // null: the endpoint makes its own
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds send_timeout{30000};  // blocked longer than this: TimeoutError
  std::chrono::milliseconds transfer_timeout{
      60000};               // a half-received payload with no chunk for this long is dropped
  int heartbeat_ms = 1000;  // ZMTP heartbeats; peer dead after 5x
  // Records queued per peer inside ZeroMQ (ZMQ_RCVHWM); bounds memory. Fixed for the endpoint's
  // life: libzmq 4.3.4 tells every pipe's peer of a changed HWM without checking that the peer
  // still exists, and a ROUTER whose queue changed while a peer's connection was closing crashed
  // in its I/O thread (a freed pipe). A TLS ROUTER that opens records inline reads one record
  // ahead of the one it opens, so one queued per peer keeps the socket busy while it decrypts.
  int receive_queue = 4096;
  // Multiplexed connections, for plaintext inproc:// only (a ConfigError elsewhere): one socket
  // speaks for many virtual nodes of this process (cohort-sim's fleet). DEALER: send() keeps a
  // non-empty envelope.sender the caller set instead of node_id. ROUTER: each peer handle names
  // one (connection, sender) pair, and a send through it sets envelope.recipient to that sender,
  // so the DEALER can hand the reply to the right virtual node. Off: behaviour is unchanged.
  bool multiplex = false;
};

// A ROUTER's opaque handle for one connected peer (its ZeroMQ routing id). Empty on a DEALER.
using PeerHandle = std::string;

// On a multiplexed ROUTER (EndpointOptions::multiplex): the handle of virtual node `sender` on the
// connection that `handle` (another virtual node's handle) came from. cohort-sim's coordinator
// addresses the members of its population through it without a message from each.
PeerHandle multiplexed_peer(const PeerHandle& handle, const NodeId& sender);

// A payload to send: bytes plus, optionally, an owner that keeps them alive until ZeroMQ is done,
// which lets plaintext sends skip the copy. Without an owner the bytes are copied or sealed into
// pooled chunks before send() returns, so the caller may reuse them at once.
struct Payload {
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;
};

// A received message, or with deliver_chunks one chunk of one.
struct Message {
  PeerHandle peer;
  NodeId sender;             // authenticated under TLS; as claimed otherwise
  Envelope envelope;         // the head envelope of the transfer (its real body)
  std::uint64_t offset = 0;  // where `payload` starts within the whole payload
  PooledBuffer payload;      // all of it, or this chunk of it
  bool complete = true;      // false for all but the last chunk of a streamed transfer
};

struct EndpointStats {
  std::uint64_t records_sent = 0;
  std::uint64_t records_received = 0;
  std::uint64_t bytes_sent = 0;      // payload bytes
  std::uint64_t bytes_received = 0;  // payload bytes
  std::uint64_t handshakes = 0;      // completed
  std::uint64_t refused_peers = 0;   // failed handshakes or plaintext against TLS
  std::uint64_t dropped_auth = 0;    // records that failed authentication (tampered)
  std::uint64_t dropped_replay = 0;  // replayed or too old
  std::uint64_t dropped_malformed = 0;
  int receive_queue = 0;  // records ZeroMQ queues per peer (ZMQ_RCVHWM; EndpointOptions)
};

class Endpoint {
 public:
  // ROUTER bound at url (tcp://127.0.0.1:* picks a free port; see bound_url()).
  static Endpoint bind(Context& ctx, const std::string& url, EndpointOptions options);
  // DEALER connected to url; under TLS the handshake starts at once (see wait_ready()).
  static Endpoint connect(Context& ctx, const std::string& url, EndpointOptions options);

  Endpoint(Endpoint&&) noexcept;
  Endpoint& operator=(Endpoint&&) noexcept;
  ~Endpoint();

  // The url with the port actually bound (ROUTER), or the url dialled (DEALER).
  [[nodiscard]] const std::string& url() const;
  [[nodiscard]] bool is_secure() const;
  [[nodiscard]] const NodeId& node_id() const;

  // Sends one logical message. The endpoint fills in sender, seq, protocol version and the
  // payload fields of `envelope`. On a DEALER `peer` is ignored; before the handshake completes
  // messages are queued. Returns the seq given to the message, or nullopt when a ROUTER's peer is
  // gone. Throws TimeoutError when ZeroMQ stays full past send_timeout.
  std::optional<std::uint64_t> send(const PeerHandle& peer, Envelope envelope,
                                    Payload payload = {});

  // Waits up to `timeout` for the next complete message (or chunk). Handshakes, chunk reassembly
  // and drops of bad records happen inside. Returns nullopt on timeout.
  std::optional<Message> receive(std::chrono::milliseconds timeout);

  // DEALER: drives the handshake until it completes. Throws TransportError with the peer's reason
  // when it refused us (or we it), TimeoutError after `timeout`. ROUTER: returns at once.
  void wait_ready(std::chrono::milliseconds timeout);
  [[nodiscard]] bool is_ready() const;

  // The authenticated node id behind a ROUTER's peer handle, if that peer is connected.
  [[nodiscard]] std::optional<NodeId> peer_id(const PeerHandle& peer) const;

  // Waits up to `timeout` until one of `endpoints` has a message (or chunk) ready and returns its
  // index, or -1 on timeout; then call receive(0ms) on it. All must be owned by this thread.
  static int poll(std::span<Endpoint* const> endpoints, std::chrono::milliseconds timeout);

  [[nodiscard]] EndpointStats stats() const;
  [[nodiscard]] const std::shared_ptr<BufferPool>& buffers() const;
  // Payload bytes of earlier sends still inside ZeroMQ: handed to it, not yet written to the
  // socket (nor dropped). A DEALER's sends to a slow link queue here; any thread may ask.
  [[nodiscard]] std::uint64_t unsent_bytes() const;
  // True while a chunked payload is arriving: part of it is in and a chunk came within the last
  // second (a reply still streaming over a slow link). The owning thread only.
  [[nodiscard]] bool receiving() const;

  // Seams for tests and fuzzers. send_raw sends frames as one record, bypassing framing and
  // sealing. The outgoing hook sees every record (header, envelope, bulk frames, after sealing)
  // and returns the records to send instead: none (drop), a tampered one, or several (replay).
  using Frames = std::vector<std::vector<std::byte>>;
  void send_raw_for_testing(const PeerHandle& peer, const Frames& frames);
  void set_outgoing_hook_for_testing(std::function<std::vector<Frames>(Frames)> hook);

  struct Impl;

 private:
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::transport
