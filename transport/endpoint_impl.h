// The state behind an Endpoint (private to transport/). One Endpoint::Impl is driven by the thread
// that owns the Endpoint; its member functions are defined by concept:
//   endpoint.cc         Context, bind/connect, the public calls, the receive loop (pump), the
//                       socket monitor (DEALER reconnects), the receive budget and the sweep
//   endpoint_send.cc    sending: records, chunking, sealing ahead on the pool, pacing
//   tls_session.cc      the TLS handshake records and the session states
//   reassembly.cc       the serial receive path: records, checks, chunk reassembly, delivery
//   open_pipeline.cc    the pipelined receive path: bulk frames opened on the pool, committed in
//                       record order
// with the pieces they share in record.h (framing), crypto_pipeline.h (crypto jobs) and
// send_pacing.h (pacing).
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/security.h"
#include "crypto_pipeline.h"
#include "record.h"
#include "send_pacing.h"

namespace cohort::transport {
namespace detail {

using Clock = std::chrono::steady_clock;

// A ready session that has not been heard from for this long is forgotten (clients heartbeat).
constexpr auto kSessionIdleTimeout = std::chrono::minutes(30);

struct Transfer {
  Envelope head;
  PooledBuffer buffer;  // whole payload, when reassembling
  std::uint32_t next_index = 1;
  std::uint32_t count = 0;
  Clock::time_point
      last_active;  // its head or latest chunk arrived (transfer_timeout counts from here)
};

struct Session {
  enum class State { kHandshaking, kAwaitAccept, kReady, kFailed };
  State state = State::kHandshaking;
  std::unique_ptr<security::Handshake> handshake;
  std::unique_ptr<security::FrameCipher> tx;
  std::unique_ptr<security::FrameCipher> rx;
  security::ReplayWindow window;
  NodeId peer_id;
  std::uint64_t tx_counter = 0;
  // Handshake attempt: carried in the counter field of handshake records, so that answers to an
  // abandoned attempt (after a reconnect) are ignored instead of failing the new one.
  std::uint64_t attempt = 0;
  Clock::time_point started = Clock::now();
  Clock::time_point last_seen = Clock::now();
  std::unordered_map<std::uint64_t, Transfer> transfers;
  std::string failure;
};

// One record being sealed on the pool while earlier ones go out.
struct PendingRecord {
  std::array<std::byte, kRecordHeaderBytes> header{};
  std::vector<std::byte> envelope;  // plaintext: the bulk frame's AAD
  std::vector<std::byte> sealed_envelope;
  PooledBuffer bulk;
  std::shared_ptr<CryptoJob> seal;  // null without a bulk frame
};

// A received data record whose bulk frame is being opened (on the pool) while later records are
// read. Everything before the open (header, envelope, validation, destination) is done, against
// the session state as it will be if every earlier pending record commits; the commit (replay
// window, stats, inbox) happens in record order. See Endpoint::Impl::defer_data().
struct PendingOpen {
  enum class Kind { kHeadPiece, kHeadWhole, kChunkPiece, kChunkWhole };
  Kind kind = Kind::kHeadPiece;
  PeerHandle peer;
  Session* session = nullptr;  // sessions are not erased while records are pending
  RecordHeader header{};
  std::vector<zmq::message_t> frames;  // kept for the open, and for a serial retry
  std::vector<std::byte> plain_env;    // sealed: the opened envelope, the bulk frame's AAD
  Envelope env;                        // kHeadPiece: the message's envelope
  NodeId sender;
  std::uint64_t transfer = 0;     // id of the transfer this record created or continues
  bool created_transfer = false;  // a head that opened a multi-chunk transfer
  std::uint64_t offset = 0;
  std::uint64_t len = 0;
  bool last = false;   // chunks: completes the transfer
  PooledBuffer piece;  // k*Piece: the destination
  std::shared_ptr<CryptoJob> job;
};

// One message being cut into records: its head envelope (seq, sizes filled in), its payload and
// how it is chunked.
struct Outgoing {
  Envelope head;
  Payload payload;
  std::uint64_t total = 0;
  std::size_t chunk = 0;
  std::uint32_t count = 1;
  // The envelope of record i: the head, or a ChunkHeader that takes the next seq from `seq`.
  Envelope envelope_for(std::uint32_t i, std::uint64_t& seq) const;
  // Record i's part of the payload (empty without one).
  std::span<const std::byte> slice(std::uint32_t i) const;
};

// How defer_data() opens a record's bulk frame: what the record brings, and what its plan decided.
struct OpenPlan {
  zmq::message_t* bulk = nullptr;  // the record's bulk frame
  std::uint64_t bulk_bytes = 0;    // its plaintext size
  bool sealed = false;
  bool can_open_in_place = false;  // sealed, no crypto pool, and the frame can be adopted
  std::span<std::byte> dest;       // where the plaintext goes
  bool adopted = false;            // the piece is the frame itself: nothing to copy
  bool in_place = false;           // opened where it lies, at commit time
};

}  // namespace detail

// The endpoint's files name these unqualified.
namespace sec = security;
using detail::adopt_frame;
using detail::adoptable;
using detail::BulkHint;
using detail::bytes_of;
using detail::Clock;
using detail::CryptoJob;
using detail::finish_job;
using detail::free_bulk;
using detail::is_inproc;
using detail::kOpenWindow;
using detail::kSealWindow;
using detail::kSendAhead;
using detail::kSessionIdleTimeout;
using detail::make_header;
using detail::message_from;
using detail::parse_header;
using detail::poll_sockets;
using detail::SendPacer;
using detail::Session;
using detail::start_job;
using detail::text_of;
using detail::Transfer;

struct Endpoint::Impl {
  using Clock = detail::Clock;
  using Kind = detail::Kind;
  using RecordHeader = detail::RecordHeader;
  using Session = detail::Session;
  using PendingOpen = detail::PendingOpen;
  using PendingRecord = detail::PendingRecord;
  using SendProgress = detail::SendProgress;

  zmq::socket_t socket;
  zmq::socket_t monitor;  // DEALER only: connect/disconnect events trigger a new handshake
  bool is_router = false;
  bool secure = true;
  std::string url;
  EndpointOptions options;
  std::unique_ptr<security::TlsContext> tls;
  security::AeadBackend aead = security::AeadBackend::kAuto;  // options.security.aead, checked
  std::shared_ptr<BufferPool> buffers;
  // Bulk bytes handed to ZeroMQ and not yet let go of (Endpoint::unsent_bytes()); shared with
  // the frames' free callbacks, which may run after the endpoint is gone.
  std::shared_ptr<std::atomic<std::uint64_t>> unsent =
      std::make_shared<std::atomic<std::uint64_t>>(0);
  std::unordered_map<PeerHandle, Session> sessions;  // ROUTER: by routing id; DEALER: key ""
  std::deque<Message> inbox;
  std::uint64_t seq = 0;
  EndpointStats stats;
  Clock::time_point last_sweep = Clock::now();
  std::function<std::vector<Frames>(Frames)> hook;
  std::deque<std::unique_ptr<PendingOpen>> opening;       // bulk records being opened, in order
  std::vector<std::vector<zmq::message_t>> spare_frames;  // receive frame vectors, reused
  std::uint64_t warn_budget_reset = 0;
  int warnings_this_second = 0;

  // ---- sending ------------------------------------------------------------------------------

  // Sends one record; returns false if a ROUTER's peer is unreachable.
  bool send_frames(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk);

  bool send_hooked(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk);

  void raw_send(const PeerHandle& peer, const Frames& record);

  void send_control(const PeerHandle& peer, Kind kind, std::span<const std::byte> a,
                    std::optional<std::span<const std::byte>> b = std::nullopt,
                    std::uint64_t attempt = 0);

  void refuse(const PeerHandle& peer, const std::string& reason, std::uint64_t attempt = 0);

  void warn_limited(const std::string& text);

  std::optional<std::uint64_t> send_message(const PeerHandle& peer, Envelope env, Payload payload);
  // The records of one message, in plaintext or sealed; false if a ROUTER's peer is unreachable.
  bool send_plain(const PeerHandle& peer, const detail::Outgoing& out);
  bool send_sealed(const PeerHandle& peer, Session& session, const detail::Outgoing& out);

  // A DEALER paces its messages to its one peer. A ROUTER does not: waiting on one slow peer
  // would hold up every other. Over inproc:// a frame is let go of only when the receiver drops
  // it, often on this thread.
  bool paced() const;

  zmq::message_t pooled_message(PooledBuffer buf,
                                const std::shared_ptr<SendProgress>& progress = nullptr);

  zmq::message_t bulk_message(std::span<const std::byte> bytes,
                              const std::shared_ptr<const void>& owner,
                              const std::shared_ptr<SendProgress>& progress = nullptr);

  // ---- handshakes ---------------------------------------------------------------------------

  std::uint64_t attempts = 0;

  void start_client_handshake();

  // The client is done before the server has checked its certificate, so it waits for kAccept.
  void finish_handshake(const PeerHandle& peer, Session& s);

  void on_accept(const RecordHeader& h);

  void on_hello(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f);

  void on_handshake(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f);

  void on_refuse(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f);

  // ---- data records -------------------------------------------------------------------------

  void on_data(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f);

  void reject(const PeerHandle& peer, Session& s, const RecordHeader& h, const std::string& why,
              std::uint64_t ref_seq);

  // Moves (or opens) one bulk frame into `dest`; false if it failed authentication.
  bool unpack_bulk(Session& s, const RecordHeader& h, std::span<const std::byte> aad,
                   const zmq::message_t& bulk, std::span<std::byte> dest);

  std::size_t bulk_plain_size(const RecordHeader& h, const zmq::message_t& bulk);

  void deliver(const PeerHandle& peer, Session& s, const RecordHeader& h, Envelope& env,
               std::span<const std::byte> aad, zmq::message_t* bulk);

  // ---- pipelined opens of bulk frames ------------------------------------------------------
  //
  // A well-formed bulk data record continuing the state that the records already pending will
  // leave is started here: header, envelope (opened and decoded), validation and destination are
  // settled in record order, the open of its bulk frame runs on the pool, and its commit (replay
  // window, stats, inbox) runs in record order in complete_front(). Any other record returns
  // false having changed nothing, and takes the serial path (on_data and deliver) once the
  // pending records are committed, so that drops, rejections and Error replies are always decided
  // on the true state. A pending record that fails authentication or the replay check rolls back
  // the optimistic state of itself and every record behind it; those are then processed again,
  // serially, exactly as if they had arrived one by one.
  bool defer_data(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f);
  // defer_data() for a chunk of a known transfer, and for a head: checks and the destination.
  // False, having changed nothing, when the record must take the serial path.
  bool plan_chunk_open(Session& s, const ChunkHeader& c, PendingOpen& p, detail::OpenPlan& plan);
  bool plan_head_open(Session& s, Envelope& env, PendingOpen& p, detail::OpenPlan& plan);

  // Commits an opened record, as deliver() does after unpack_bulk(); false if it is a replay.
  bool commit_open(PendingOpen& p);

  // Undoes what defer_data() assumed about the session state for `p`.
  void roll_back(PendingOpen& p);

  // Waits until no worker touches any pending record (without running the unstarted ones).
  void quiesce_opening();

  // Commits the oldest pending record, opening it here if no worker has started it.
  void complete_front();

  std::size_t open_window() const;

  // The pool that seals and opens bulk frames, or none: where AES-GCM runs on vector AES units
  // (faster than the socket), this thread does it inline, since waking a worker per chunk cost
  // more than it saved (docs/PERFORMANCE.md 3.2).
  ThreadPool* crypto_pool() const;

  // Commits every pending record, in order.
  void settle_opening();

  // On an exception: drops the pending records, leaving the state as if they never arrived.
  void abandon_opening() noexcept;

  // ---- the receive loop ---------------------------------------------------------------------

  std::vector<zmq::message_t> take_frames();

  void recycle_frames(std::vector<zmq::message_t>&& f);

  // Reads one multipart message from the socket (non-blocking) and processes it, or starts to
  // (defer_data); false if none was waiting.
  bool read_record();

  // The serial path: every record in order, after all pending ones are committed.
  void process_record(const PeerHandle& peer, const RecordHeader& h,
                      std::vector<zmq::message_t>& f);

  void read_monitor();

  void sweep();

  // Waits up to `timeout` for socket input and processes what arrives. Returns when the inbox
  // has something, `until()` holds, or time is up.
  template <typename Pred>
  void pump(std::chrono::milliseconds timeout, Pred until);

  bool is_ready() const;

  void wait_ready(std::chrono::milliseconds timeout);

  void configure_socket();
};

}  // namespace cohort::transport
