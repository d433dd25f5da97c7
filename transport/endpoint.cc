#include "cohort/transport/endpoint.h"

#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <future>
#include <unordered_map>

#include "cohort/core/clock.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/security/security.h"

namespace cohort::transport {
namespace {

using Clock = std::chrono::steady_clock;
using Frames = Endpoint::Frames;
namespace sec = security;

constexpr std::size_t kRecordHeaderBytes = 16;
constexpr std::uint8_t kRecordVersion = 1;
// Chunks sealed ahead of the socket: enough to keep both cores busy, small enough to bound memory.
constexpr std::size_t kSealWindow = 8;
// A ready session that has not been heard from for this long is forgotten (clients heartbeat).
constexpr auto kSessionIdleTimeout = std::chrono::minutes(30);

enum class Kind : std::uint8_t {
  kHello = 1,      // client -> server: claimed node id, first TLS flight
  kHandshake = 2,  // TLS bytes, either way
  kPlain = 3,      // envelope (+ bulk) in clear
  kSealed = 4,     // envelope (+ bulk) under AES-256-GCM
  kRefuse = 5,     // the peer refused us; frame 1 says why
  kReset = 6,      // the peer has no session for us: handshake again
  kAccept = 7,     // server -> client: your certificate checked out; the session is open
};

struct RecordHeader {
  Kind kind;
  std::uint64_t counter;
};

std::array<std::byte, kRecordHeaderBytes> make_header(Kind kind, std::uint64_t counter) {
  std::array<std::byte, kRecordHeaderBytes> h{};
  h[0] = std::byte{'C'};
  h[1] = std::byte{'H'};
  h[2] = std::byte{kRecordVersion};
  h[3] = static_cast<std::byte>(kind);
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<std::byte>((counter >> (8 * i)) & 0xff);
  return h;
}

std::optional<RecordHeader> parse_header(const zmq::message_t& m) {
  if (m.size() != kRecordHeaderBytes) return std::nullopt;
  const auto* p = static_cast<const unsigned char*>(m.data());
  if (p[0] != 'C' || p[1] != 'H' || p[2] != kRecordVersion) return std::nullopt;
  if (p[3] < 1 || p[3] > 7) return std::nullopt;
  std::uint64_t counter = 0;
  for (int i = 0; i < 8; ++i) counter |= static_cast<std::uint64_t>(p[8 + i]) << (8 * i);
  return RecordHeader{static_cast<Kind>(p[3]), counter};
}

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// Peer-supplied text for logs and errors: bounded, printable ASCII only.
std::string text_of(const zmq::message_t& m, std::size_t limit = 512) {
  std::string s(static_cast<const char*>(m.data()), std::min(m.size(), limit));
  for (char& c : s) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return s;
}

zmq::message_t message_from(std::span<const std::byte> bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

zmq::message_t message_from(std::string_view s) { return zmq::message_t(s.data(), s.size()); }

bool is_inproc(const std::string& url) { return url.rfind("inproc://", 0) == 0; }

struct Transfer {
  Envelope head;
  PooledBuffer buffer;  // whole payload, when reassembling
  std::uint32_t next_index = 1;
  std::uint32_t count = 0;
  Clock::time_point started;
};

struct Session {
  enum class State { kHandshaking, kAwaitAccept, kReady, kFailed };
  State state = State::kHandshaking;
  std::unique_ptr<sec::Handshake> handshake;
  std::unique_ptr<sec::FrameCipher> tx;
  std::unique_ptr<sec::FrameCipher> rx;
  sec::ReplayWindow window;
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
  std::vector<std::byte> envelope;        // plaintext: the bulk frame's AAD
  std::vector<std::byte> sealed_envelope;
  PooledBuffer bulk;
  std::future<void> sealed;
};

}  // namespace

struct Context::Impl {
  zmq::context_t ctx;
  explicit Impl(int io_threads) : ctx(io_threads) {}
};

Context::Context(int io_threads) : impl_(std::make_unique<Impl>(io_threads)) {}
Context::~Context() = default;

struct Endpoint::Impl {
  zmq::socket_t socket;
  zmq::socket_t monitor;  // DEALER only: connect/disconnect events trigger a new handshake
  bool is_router = false;
  bool secure = true;
  std::string url;
  EndpointOptions options;
  std::unique_ptr<sec::TlsContext> tls;
  std::shared_ptr<BufferPool> buffers;
  std::unordered_map<PeerHandle, Session> sessions;  // ROUTER: by routing id; DEALER: key ""
  std::deque<Message> inbox;
  std::uint64_t seq = 0;
  EndpointStats stats;
  Clock::time_point last_sweep = Clock::now();
  std::function<std::vector<Frames>(Frames)> hook;
  std::vector<zmq::message_t> frames;  // receive scratch, reused
  std::uint64_t warn_budget_reset = 0;
  int warnings_this_second = 0;

  // ---- sending ------------------------------------------------------------------------------

  // Sends one record; returns false if a ROUTER's peer is unreachable.
  bool send_frames(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk) {
    if (hook) return send_hooked(peer, std::move(header), std::move(body), std::move(bulk));
    try {
      if (is_router) {
        if (!socket.send(message_from(std::string_view(peer)), zmq::send_flags::sndmore)) {
          throw TimeoutError("send to peer timed out after " +
                             std::to_string(options.send_timeout.count()) + " ms");
        }
      }
      auto more = zmq::send_flags::sndmore;
      if (!socket.send(header, more)) throw TimeoutError("send timed out");
      if (!socket.send(body, bulk ? more : zmq::send_flags::none)) throw TimeoutError("send timed out");
      if (bulk && !socket.send(*bulk, zmq::send_flags::none)) throw TimeoutError("send timed out");
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) return false;
      throw TransportError(std::string("send on ") + url + " failed: " + e.what());
    }
    ++stats.records_sent;
    return true;
  }

  bool send_hooked(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
                   std::optional<zmq::message_t> bulk) {
    Frames record;
    for (zmq::message_t* m : {&header, &body}) {
      auto b = bytes_of(*m);
      record.emplace_back(b.begin(), b.end());
    }
    if (bulk) {
      auto b = bytes_of(*bulk);
      record.emplace_back(b.begin(), b.end());
    }
    auto h = std::move(hook);  // the hook sees each record once, not its own re-sends
    bool ok = true;
    try {
      for (auto& r : h(std::move(record))) raw_send(peer, r);
    } catch (...) {
      hook = std::move(h);
      throw;
    }
    hook = std::move(h);
    return ok;
  }

  void raw_send(const PeerHandle& peer, const Frames& record) {
    if (is_router) socket.send(message_from(std::string_view(peer)), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < record.size(); ++i) {
      socket.send(message_from(std::span<const std::byte>(record[i])),
                  i + 1 < record.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    ++stats.records_sent;
  }

  void send_control(const PeerHandle& peer, Kind kind, std::span<const std::byte> a,
                    std::optional<std::span<const std::byte>> b = std::nullopt,
                    std::uint64_t attempt = 0) {
    auto h = make_header(kind, attempt);
    std::optional<zmq::message_t> second;
    if (b) second = message_from(*b);
    send_frames(peer, message_from(std::span<const std::byte>(h)), message_from(a), std::move(second));
  }

  void refuse(const PeerHandle& peer, const std::string& reason, std::uint64_t attempt = 0) {
    ++stats.refused_peers;
    warn_limited("refused peer: " + reason);
    send_control(peer, Kind::kRefuse, std::as_bytes(std::span(reason.data(), reason.size())),
                 std::nullopt, attempt);
  }

  void warn_limited(const std::string& text) {
    const auto now_s = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count());
    if (now_s != warn_budget_reset) {
      warn_budget_reset = now_s;
      warnings_this_second = 0;
    }
    if (++warnings_this_second <= 5) COHORT_LOG(Warn) << url << ": " << text;
  }

  std::optional<std::uint64_t> send_message(const PeerHandle& peer, Envelope env, Payload payload) {
    Session* session = nullptr;
    if (!is_router) {
      if (!is_ready()) wait_ready(options.handshake_timeout);
      session = &sessions.at("");
    } else {
      auto it = sessions.find(peer);
      if (it == sessions.end() || it->second.state != Session::State::kReady) return std::nullopt;
      session = &it->second;
    }
    const std::uint64_t total = payload.bytes.size();
    if (total > options.max_payload_bytes) {
      throw TransportError("payload of " + std::to_string(total) + " bytes exceeds max_payload_bytes");
    }
    const std::size_t chunk = options.chunk_bytes;
    const std::uint32_t count =
        total == 0 ? 1 : static_cast<std::uint32_t>((total + chunk - 1) / chunk);
    env.protocol_version = kProtocolVersion;
    env.sender = options.node_id;
    env.seq = ++seq;
    env.payload_bytes = total;
    env.chunk_bytes = total == 0 ? 0 : static_cast<std::uint32_t>(chunk);
    const std::uint64_t head_seq = env.seq;

    auto envelope_for = [&](std::uint32_t i) {
      if (i == 0) return env;
      Envelope c;
      c.sender = options.node_id;
      c.seq = ++seq;
      c.round = env.round;
      c.payload_bytes = total;
      c.chunk_bytes = env.chunk_bytes;
      c.body = ChunkHeader{head_seq, i, count, std::uint64_t{i} * chunk};
      return c;
    };
    auto slice = [&](std::uint32_t i) {
      if (total == 0) return std::span<const std::byte>();
      const std::size_t off = std::size_t{i} * chunk;
      return payload.bytes.subspan(off, std::min<std::size_t>(chunk, total - off));
    };

    if (!secure) {
      for (std::uint32_t i = 0; i < count; ++i) {
        auto header = make_header(Kind::kPlain, 0);
        auto body = encode(envelope_for(i));
        std::optional<zmq::message_t> bulk;
        if (total > 0) bulk = bulk_message(slice(i), payload.owner);
        if (!send_frames(peer, message_from(std::span<const std::byte>(header)),
                         message_from(std::span<const std::byte>(body)), std::move(bulk))) {
          return std::nullopt;
        }
      }
      stats.bytes_sent += total;
      return head_seq;
    }

    // Sealed: counters are assigned in order here; bulk chunks are sealed on the pool, up to
    // kSealWindow ahead of the socket.
    std::deque<std::unique_ptr<PendingRecord>> window;
    const sec::FrameCipher& cipher = *session->tx;
    auto flush_front = [&]() -> bool {
      auto rec = std::move(window.front());
      window.pop_front();
      if (rec->sealed.valid()) rec->sealed.get();
      std::optional<zmq::message_t> bulk;
      if (total > 0) bulk = pooled_message(std::move(rec->bulk));
      return send_frames(peer, message_from(std::span<const std::byte>(rec->header)),
                         message_from(std::span<const std::byte>(rec->sealed_envelope)),
                         std::move(bulk));
    };
    bool delivered = true;
    for (std::uint32_t i = 0; i < count && delivered; ++i) {
      auto rec = std::make_unique<PendingRecord>();
      const std::uint64_t counter = ++session->tx_counter;
      rec->header = make_header(Kind::kSealed, counter);
      rec->envelope = encode(envelope_for(i));
      rec->sealed_envelope.resize(rec->envelope.size() + sec::FrameCipher::kTagBytes);
      cipher.seal(counter, 0, rec->header, rec->envelope, rec->sealed_envelope);
      if (total > 0) {
        auto in = slice(i);
        rec->bulk = buffers->acquire(in.size() + sec::FrameCipher::kTagBytes);
        PendingRecord* r = rec.get();
        auto job = [&cipher, r, in, counter] {
          cipher.seal(counter, 1, r->envelope, in, r->bulk.span());
        };
        if (options.pool != nullptr && count > 1) {
          rec->sealed = options.pool->submit(job);
        } else {
          job();
        }
      }
      window.push_back(std::move(rec));
      if (window.size() >= kSealWindow) delivered = flush_front();
    }
    while (!window.empty()) {
      if (delivered) {
        delivered = flush_front();
      } else {
        if (window.front()->sealed.valid()) window.front()->sealed.wait();
        window.pop_front();
      }
    }
    if (!delivered) return std::nullopt;
    stats.bytes_sent += total;
    return head_seq;
  }

  zmq::message_t pooled_message(PooledBuffer buf) {
    const std::size_t size = buf.size();
    void* data = buf.data();
    void* handle = buf.detach();
    return zmq::message_t(
        data, size, [](void*, void* hint) noexcept { PooledBuffer::release_detached(hint); },
        handle);
  }

  zmq::message_t bulk_message(std::span<const std::byte> bytes,
                              const std::shared_ptr<const void>& owner) {
    if (owner) {  // zero copy straight from the caller's memory
      auto* keep = new std::shared_ptr<const void>(owner);  // freed by ZeroMQ's callback
      return zmq::message_t(
          const_cast<std::byte*>(bytes.data()), bytes.size(),
          [](void*, void* hint) noexcept { delete static_cast<std::shared_ptr<const void>*>(hint); },
          keep);
    }
    auto buf = buffers->acquire(bytes.size());
    if (!bytes.empty()) std::memcpy(buf.data(), bytes.data(), bytes.size());
    return pooled_message(std::move(buf));
  }

  // ---- handshakes ---------------------------------------------------------------------------

  std::uint64_t attempts = 0;

  void start_client_handshake() {
    Session& s = sessions[""];
    s = Session{};
    s.attempt = ++attempts;
    if (!secure) {
      s.state = Session::State::kReady;
      return;
    }
    s.handshake = std::make_unique<sec::Handshake>(
        *tls, sec::Role::kClient,
        options.security.expected_peer.empty() ? std::nullopt
                                               : std::optional<NodeId>(options.security.expected_peer));
    auto first = s.handshake->step({});
    send_control("", Kind::kHello,
                 std::as_bytes(std::span(options.node_id.data(), options.node_id.size())),
                 std::span<const std::byte>(first), s.attempt);
  }

  // The client is done before the server has checked its certificate, so it waits for kAccept.
  void finish_handshake(const PeerHandle& peer, Session& s) {
    const sec::SessionKeys keys = s.handshake->keys();
    s.tx = std::make_unique<sec::FrameCipher>(keys.tx);
    s.rx = std::make_unique<sec::FrameCipher>(keys.rx);
    s.peer_id = s.handshake->peer_id();
    s.handshake.reset();
    s.window = sec::ReplayWindow{};
    if (is_router) {
      s.state = Session::State::kReady;
      ++stats.handshakes;
      send_control(peer, Kind::kAccept, {}, std::nullopt, s.attempt);
      COHORT_LOG(Debug) << url << ": secure session with " << s.peer_id;
    } else {
      s.state = Session::State::kAwaitAccept;
    }
  }

  void on_accept(const RecordHeader& h) {
    if (is_router) return;
    Session& s = sessions[""];
    if (s.state != Session::State::kAwaitAccept || h.counter != s.attempt) return;
    s.state = Session::State::kReady;
    ++stats.handshakes;
    COHORT_LOG(Debug) << url << ": secure session with " << s.peer_id;
  }

  void on_hello(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    if (!is_router) return;
    if (!secure) {
      refuse(peer, "this endpoint runs without TLS (--insecure); start both sides the same way");
      return;
    }
    if (f.size() != 3) {
      ++stats.dropped_malformed;
      return;
    }
    const std::string claimed = text_of(f[1], 128);
    if (!is_valid_node_id(claimed)) {
      refuse(peer, "hello carries an invalid node id");
      return;
    }
    Session& s = sessions[peer];
    s = Session{};
    s.attempt = h.counter;
    try {
      s.handshake = std::make_unique<sec::Handshake>(*tls, sec::Role::kServer, claimed);
      auto out = s.handshake->step(bytes_of(f[2]));
      if (!out.empty()) send_control(peer, Kind::kHandshake, out, std::nullopt, s.attempt);
      if (s.handshake->done()) finish_handshake(peer, s);
    } catch (const TransportError& e) {
      sessions.erase(peer);
      refuse(peer, std::string("TLS handshake failed: ") + e.what(), h.counter);
    }
  }

  void on_handshake(const PeerHandle& peer, const RecordHeader& h,
                    std::vector<zmq::message_t>& f) {
    auto it = sessions.find(peer);
    if (it == sessions.end() || it->second.state != Session::State::kHandshaking ||
        !it->second.handshake || f.size() != 2 || h.counter != it->second.attempt) {
      return;  // an answer to an abandoned attempt, or noise
    }
    Session& s = it->second;
    try {
      auto out = s.handshake->step(bytes_of(f[1]));
      if (!out.empty()) send_control(peer, Kind::kHandshake, out, std::nullopt, s.attempt);
      if (s.handshake->done()) finish_handshake(peer, s);
    } catch (const TransportError& e) {
      const std::string reason = std::string("TLS handshake failed: ") + e.what();
      if (is_router) {
        const std::uint64_t attempt = s.attempt;
        sessions.erase(it);
        refuse(peer, reason, attempt);
      } else {
        s.state = Session::State::kFailed;
        s.failure = reason;
        ++stats.refused_peers;
        send_control(peer, Kind::kRefuse, std::as_bytes(std::span(reason.data(), reason.size())),
                     std::nullopt, s.attempt);
      }
    }
  }

  void on_refuse(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    const std::string reason = f.size() >= 2 ? text_of(f[1]) : std::string("no reason given");
    if (is_router) {
      sessions.erase(peer);
      warn_limited("peer refused us: " + reason);
      return;
    }
    Session& s = sessions[""];
    if (h.counter != 0 && h.counter != s.attempt) return;  // about an abandoned attempt
    s.state = Session::State::kFailed;
    s.failure = "peer " + url + " refused the connection: " + reason;
  }

  // ---- data records -------------------------------------------------------------------------

  void on_data(const PeerHandle& peer, const RecordHeader& h, std::vector<zmq::message_t>& f) {
    if (f.size() != 2 && f.size() != 3) {
      ++stats.dropped_malformed;
      return;
    }
    if (h.kind == Kind::kPlain && secure) {
      refuse(peer, "this endpoint requires TLS; the peer sent plaintext (is it running --insecure?)");
      return;
    }
    if (h.kind == Kind::kSealed && !secure) {
      refuse(peer, "this endpoint runs without TLS (--insecure); the peer sent sealed records");
      return;
    }
    auto it = sessions.find(peer);
    if (h.kind == Kind::kPlain && it == sessions.end()) {
      it = sessions.emplace(peer, Session{}).first;
      it->second.state = Session::State::kReady;
    }
    if (it == sessions.end() || it->second.state != Session::State::kReady) {
      // A sealed record for a session we do not know: the peer must handshake again.
      if (is_router) send_control(peer, Kind::kReset, {});
      ++stats.dropped_auth;
      return;
    }
    Session& s = it->second;
    Envelope env;
    std::vector<std::byte> plain_env;
    std::span<const std::byte> env_bytes;
    if (h.kind == Kind::kSealed) {
      auto sealed = bytes_of(f[1]);
      if (sealed.size() < sec::FrameCipher::kTagBytes) {
        ++stats.dropped_auth;
        return;
      }
      plain_env.resize(sealed.size() - sec::FrameCipher::kTagBytes);
      if (!s.rx->open(h.counter, 0, bytes_of(f[0]), sealed, plain_env)) {
        ++stats.dropped_auth;
        warn_limited("dropped a record that failed authentication from " + s.peer_id);
        return;
      }
      env_bytes = plain_env;
    } else {
      env_bytes = bytes_of(f[1]);
    }
    try {
      env = decode(env_bytes);
    } catch (const ProtocolError& e) {
      reject(peer, s, h, std::string("malformed envelope: ") + e.what(), 0);
      return;
    }
    if (secure && env.sender != s.peer_id) {
      reject(peer, s, h, "sender '" + env.sender + "' does not match the certificate ('" +
                             s.peer_id + "')", env.seq);
      return;
    }
    if (!secure) s.peer_id = env.sender;
    s.last_seen = Clock::now();
    try {
      deliver(peer, s, h, env, env_bytes, f.size() == 3 ? &f[2] : nullptr);
    } catch (const ProtocolError& e) {
      reject(peer, s, h, e.what(), env.seq);
    }
  }

  void reject(const PeerHandle& peer, Session& s, const RecordHeader& h, const std::string& why,
              std::uint64_t ref_seq) {
    ++stats.dropped_malformed;
    warn_limited("dropped a message from " + (s.peer_id.empty() ? std::string("?") : s.peer_id) +
                 ": " + why);
    if (h.kind == Kind::kSealed) (void)s.window.accept(h.counter);  // authentic, so consume it
    Envelope e;
    e.body = ErrorBody{ErrorCode::kMalformed, why.substr(0, 1024), ref_seq};
    try {
      send_message(peer, std::move(e), {});
    } catch (const Error&) {
      // The peer is unreachable or blocked; the drop alone is enough.
    }
  }

  // Moves (or opens) one bulk frame into `dest`; false if it failed authentication.
  bool unpack_bulk(Session& s, const RecordHeader& h, std::span<const std::byte> aad,
                   const zmq::message_t& bulk, std::span<std::byte> dest) {
    auto in = bytes_of(bulk);
    if (h.kind == Kind::kSealed) return s.rx->open(h.counter, 1, aad, in, dest);
    std::memcpy(dest.data(), in.data(), in.size());
    return true;
  }

  std::size_t bulk_plain_size(const RecordHeader& h, const zmq::message_t& bulk) {
    if (h.kind != Kind::kSealed) return bulk.size();
    if (bulk.size() < sec::FrameCipher::kTagBytes) throw ProtocolError("bulk frame too short");
    return bulk.size() - sec::FrameCipher::kTagBytes;
  }

  void deliver(const PeerHandle& peer, Session& s, const RecordHeader& h, Envelope& env,
               std::span<const std::byte> aad, zmq::message_t* bulk) {
    const bool sealed = h.kind == Kind::kSealed;
    auto commit = [&]() -> bool {
      if (sealed && !s.window.accept(h.counter)) {
        ++stats.dropped_replay;
        warn_limited("dropped a replayed record from " + s.peer_id);
        return false;
      }
      ++stats.records_received;
      return true;
    };

    if (auto* c = std::get_if<ChunkHeader>(&env.body)) {
      auto t = s.transfers.find(c->transfer_id);
      if (t == s.transfers.end()) {
        if (sealed && !s.window.accept(h.counter)) {
          ++stats.dropped_replay;
          return;
        }
        throw ProtocolError("chunk of unknown transfer " + std::to_string(c->transfer_id));
      }
      Transfer& tr = t->second;
      const std::uint64_t total = tr.head.payload_bytes;
      const std::uint64_t chunk = tr.head.chunk_bytes;
      const std::uint64_t offset = std::uint64_t{c->index} * chunk;
      if (c->index != tr.next_index || c->count != tr.count || c->offset != offset || !bulk) {
        s.transfers.erase(t);
        throw ProtocolError("chunk out of sequence: transfer dropped");
      }
      const std::uint64_t len = std::min<std::uint64_t>(chunk, total - offset);
      if (bulk_plain_size(h, *bulk) != len) {
        s.transfers.erase(t);
        throw ProtocolError("chunk has the wrong length");
      }
      if (options.deliver_chunks) {
        auto piece = buffers->acquire(len);
        if (!unpack_bulk(s, h, aad, *bulk, piece.span())) {
          ++stats.dropped_auth;
          return;
        }
        if (!commit()) return;
        ++tr.next_index;
        const bool last = tr.next_index == tr.count;
        inbox.push_back(Message{peer, s.peer_id, tr.head, offset, std::move(piece), last});
      } else {
        if (!unpack_bulk(s, h, aad, *bulk, tr.buffer.span().subspan(offset, len))) {
          ++stats.dropped_auth;
          return;
        }
        if (!commit()) return;
        ++tr.next_index;
        if (tr.next_index == tr.count) {
          inbox.push_back(Message{peer, s.peer_id, std::move(tr.head), 0, std::move(tr.buffer), true});
        }
      }
      stats.bytes_received += len;
      if (tr.next_index == tr.count) s.transfers.erase(t);
      return;
    }

    // A head message (any other body).
    const std::uint64_t total = env.payload_bytes;
    if (total == 0) {
      if (bulk) throw ProtocolError("bulk frame without a payload announced");
      if (!commit()) return;
      inbox.push_back(Message{peer, s.peer_id, std::move(env), 0, PooledBuffer{}, true});
      return;
    }
    if (total > options.max_payload_bytes) {
      throw ProtocolError("payload of " + std::to_string(total) + " bytes exceeds the limit of " +
                          std::to_string(options.max_payload_bytes));
    }
    if (env.chunk_bytes == 0 || env.chunk_bytes > (std::uint64_t{64} << 20)) {
      throw ProtocolError("chunk size " + std::to_string(env.chunk_bytes) + " is out of range");
    }
    if (!bulk) throw ProtocolError("payload announced but no bulk frame");
    const std::uint64_t chunk = env.chunk_bytes;
    const std::uint64_t count64 = (total + chunk - 1) / chunk;
    if (count64 > 0xffffffffu) throw ProtocolError("too many chunks");
    const auto count = static_cast<std::uint32_t>(count64);
    const std::uint64_t first = std::min(chunk, total);
    if (bulk_plain_size(h, *bulk) != first) throw ProtocolError("first chunk has the wrong length");
    if (count > 1 && s.transfers.size() >= options.max_open_transfers) {
      throw ProtocolError("too many unfinished transfers from this peer");
    }
    if (count > 1 && s.transfers.contains(env.seq)) throw ProtocolError("duplicate transfer id");

    if (options.deliver_chunks || count == 1) {
      auto piece = buffers->acquire(first);
      if (!unpack_bulk(s, h, aad, *bulk, piece.span())) {
        ++stats.dropped_auth;
        return;
      }
      if (!commit()) return;
      stats.bytes_received += first;
      if (count > 1) s.transfers.emplace(env.seq, Transfer{env, PooledBuffer{}, 1, count, Clock::now()});
      inbox.push_back(Message{peer, s.peer_id, std::move(env), 0, std::move(piece), count == 1});
      return;
    }
    auto whole = buffers->acquire(total);
    if (!unpack_bulk(s, h, aad, *bulk, whole.span().subspan(0, first))) {
      ++stats.dropped_auth;
      return;
    }
    if (!commit()) return;
    stats.bytes_received += first;
    const std::uint64_t id = env.seq;
    s.transfers.emplace(id, Transfer{std::move(env), std::move(whole), 1, count, Clock::now()});
  }

  // ---- the receive loop ---------------------------------------------------------------------

  // Reads one multipart message from the socket (non-blocking); false if none was waiting.
  bool read_record() {
    frames.clear();
    for (;;) {
      zmq::message_t m;
      auto got = socket.recv(m, frames.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
      if (!got) return false;
      const bool more = m.more();
      if (frames.size() < 8) frames.push_back(std::move(m));
      if (!more) break;
    }
    PeerHandle peer;
    std::size_t first = 0;
    if (is_router) {
      if (frames.empty()) return true;
      peer.assign(static_cast<const char*>(frames[0].data()), frames[0].size());
      first = 1;
    }
    std::vector<zmq::message_t> f;
    f.reserve(frames.size() - first);
    for (std::size_t i = first; i < frames.size(); ++i) f.push_back(std::move(frames[i]));
    if (f.empty() || f.size() > 3) {
      ++stats.dropped_malformed;
      return true;
    }
    auto h = parse_header(f[0]);
    if (!h) {
      ++stats.dropped_malformed;
      warn_limited("dropped a record with a bad header (not a Cohort peer?)");
      return true;
    }
    try {
      switch (h->kind) {
        case Kind::kHello: on_hello(peer, *h, f); break;
        case Kind::kHandshake: on_handshake(peer, *h, f); break;
        case Kind::kRefuse: on_refuse(peer, *h, f); break;
        case Kind::kAccept: on_accept(*h); break;
        case Kind::kReset:
          if (!is_router && secure && is_ready()) {
            COHORT_LOG(Info) << url << ": peer lost our session; handshaking again";
            start_client_handshake();
          }
          break;
        case Kind::kPlain:
        case Kind::kSealed: on_data(peer, *h, f); break;
      }
    } catch (const ProtocolError& e) {
      ++stats.dropped_malformed;
      warn_limited(std::string("dropped a malformed record: ") + e.what());
    }
    return true;
  }

  void read_monitor() {
    for (;;) {
      zmq::message_t event;
      if (!monitor.recv(event, zmq::recv_flags::dontwait)) return;
      zmq::message_t address;
      if (event.more()) (void)monitor.recv(address, zmq::recv_flags::none);
      if (event.size() < 6) continue;
      std::uint16_t id = 0;
      std::memcpy(&id, event.data(), sizeof id);
      if (id == ZMQ_EVENT_CONNECTED) {
        COHORT_LOG(Debug) << url << ": connected";
        start_client_handshake();
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        COHORT_LOG(Debug) << url << ": disconnected";
        Session& s = sessions[""];
        if (secure && s.state != Session::State::kFailed) s.state = Session::State::kHandshaking;
        s.transfers.clear();
      }
    }
  }

  void sweep() {
    const auto now = Clock::now();
    if (now - last_sweep < std::chrono::seconds(1)) return;
    last_sweep = now;
    for (auto it = sessions.begin(); it != sessions.end();) {
      Session& s = it->second;
      for (auto t = s.transfers.begin(); t != s.transfers.end();) {
        if (now - t->second.started > options.transfer_timeout) {
          warn_limited("dropped an unfinished transfer from " + s.peer_id);
          t = s.transfers.erase(t);
        } else {
          ++t;
        }
      }
      const bool stale_handshake = s.state == Session::State::kHandshaking &&
                                   now - s.started > options.handshake_timeout;
      const bool idle = now - s.last_seen > kSessionIdleTimeout;
      if (is_router && (stale_handshake || idle)) {
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Waits up to `timeout` for socket input and processes what arrives. Returns when the inbox
  // has something, `until()` holds, or time is up.
  template <typename Pred>
  void pump(std::chrono::milliseconds timeout, Pred until) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      while (read_record()) {
        if (!inbox.empty() || until()) break;
      }
      if (monitor) read_monitor();
      sweep();
      if (!inbox.empty() || until()) return;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return;
      zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                  {monitor ? monitor.handle() : nullptr, 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, monitor ? 2 : 1, std::min(left, std::chrono::milliseconds(250)));
    }
  }

  bool is_ready() const {
    if (is_router) return true;
    auto it = sessions.find("");
    return it != sessions.end() && it->second.state == Session::State::kReady;
  }

  void wait_ready(std::chrono::milliseconds timeout) {
    if (is_router) return;
    auto failed = [&] {
      auto it = sessions.find("");
      return it != sessions.end() && it->second.state == Session::State::kFailed;
    };
    const auto deadline = Clock::now() + timeout;
    while (!is_ready() && !failed()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        throw TimeoutError("no secure session with " + url + " after " +
                           std::to_string(timeout.count()) + " ms (is the peer running?)");
      }
      pump(left, [&] { return is_ready() || failed(); });
    }
    if (failed()) {
      const std::string why = sessions[""].failure;
      throw TransportError(why);
    }
  }

  void configure_socket() {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndtimeo, static_cast<int>(options.send_timeout.count()));
    socket.set(zmq::sockopt::sndhwm, 4096);
    socket.set(zmq::sockopt::rcvhwm, 4096);
    // Refuse absurd frames inside ZeroMQ, before any allocation of ours.
    const std::int64_t max_frame =
        static_cast<std::int64_t>(std::max<std::size_t>(options.chunk_bytes, 64 << 20)) + 65536;
    socket.set(zmq::sockopt::maxmsgsize, max_frame);
    if (options.heartbeat_ms > 0) {
      socket.set(zmq::sockopt::heartbeat_ivl, options.heartbeat_ms);
      socket.set(zmq::sockopt::heartbeat_timeout, options.heartbeat_ms * 5);
      socket.set(zmq::sockopt::heartbeat_ttl, options.heartbeat_ms * 5);
    }
  }
};

namespace {

std::unique_ptr<Endpoint::Impl> make_impl(const std::string& url, EndpointOptions options,
                                          bool router) {
  validate_node_id(options.node_id);
  if (options.chunk_bytes < 4096 || options.chunk_bytes > (std::size_t{64} << 20)) {
    throw ConfigError("transport chunk size must be between 4 KiB and 64 MiB, got " +
                      std::to_string(options.chunk_bytes));
  }
  auto impl = std::make_unique<Endpoint::Impl>();
  impl->is_router = router;
  impl->url = url;
  impl->secure = !options.security.insecure && !is_inproc(url);
  impl->buffers = options.buffers ? options.buffers : BufferPool::create();
  if (impl->secure) {
    if (options.security.ca_file.empty() || options.security.cert_file.empty() ||
        options.security.key_file.empty()) {
      throw ConfigError("TLS is on by default: set tls.ca_file, tls.cert_file and tls.key_file "
                        "(make them with cohort-keygen), or pass --insecure for plaintext");
    }
    impl->tls = std::make_unique<security::TlsContext>(security::TlsFiles{
        options.security.ca_file, options.security.cert_file, options.security.key_file});
    if (impl->tls->local_id() != options.node_id) {
      throw ConfigError("node id '" + options.node_id + "' does not match the certificate " +
                        options.security.cert_file + " (CN '" + impl->tls->local_id() + "')");
    }
  } else if (!is_inproc(url)) {
    COHORT_LOG(Warn) << "plaintext transport on " << url
                     << ": anyone on the network can read and forge messages (--insecure)";
  }
  impl->options = std::move(options);
  return impl;
}

std::string zmq_failure(const char* what, const std::string& url, const zmq::error_t& e) {
  return std::string(what) + " " + url + " failed: " + e.what();
}

}  // namespace

zmq::context_t& Context::zmq_context() { return impl_->ctx; }

Endpoint Endpoint::bind(Context& ctx, const std::string& url, EndpointOptions options) {
  auto impl = make_impl(url, std::move(options), /*router=*/true);
  try {
    impl->socket = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::router);
    impl->configure_socket();
    impl->socket.set(zmq::sockopt::router_mandatory, 1);
    impl->socket.bind(url);
    impl->url = impl->socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    throw TransportError(zmq_failure("bind to", url, e));
  }
  return Endpoint(std::move(impl));
}

Endpoint Endpoint::connect(Context& ctx, const std::string& url, EndpointOptions options) {
  auto impl = make_impl(url, std::move(options), /*router=*/false);
  static std::atomic<std::uint64_t> monitor_ids{0};
  try {
    impl->socket = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::dealer);
    impl->configure_socket();
    impl->socket.set(zmq::sockopt::reconnect_ivl, 100);
    impl->socket.set(zmq::sockopt::reconnect_ivl_max, 2000);
    if (impl->secure) {
      // Connect events start each handshake, so a restarted peer is met with a new one.
      const std::string mon = "inproc://cohort-monitor-" + std::to_string(++monitor_ids);
      if (zmq_socket_monitor(impl->socket.handle(), mon.c_str(),
                             ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
        throw zmq::error_t();
      }
      impl->monitor = zmq::socket_t(ctx.zmq_context(), zmq::socket_type::pair);
      impl->monitor.set(zmq::sockopt::linger, 0);
      impl->monitor.connect(mon);
      impl->sessions[""].state = Session::State::kHandshaking;
    } else {
      impl->sessions[""].state = Session::State::kReady;
    }
    impl->socket.connect(url);
  } catch (const zmq::error_t& e) {
    throw TransportError(zmq_failure("connect to", url, e));
  }
  return Endpoint(std::move(impl));
}

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::Endpoint(Endpoint&&) noexcept = default;
Endpoint& Endpoint::operator=(Endpoint&&) noexcept = default;
Endpoint::~Endpoint() {
  if (impl_ && impl_->monitor) {
    zmq_socket_monitor(impl_->socket.handle(), nullptr, 0);
  }
}

const std::string& Endpoint::url() const { return impl_->url; }
bool Endpoint::is_secure() const { return impl_->secure; }
const NodeId& Endpoint::node_id() const { return impl_->options.node_id; }

std::optional<std::uint64_t> Endpoint::send(const PeerHandle& peer, Envelope envelope,
                                            Payload payload) {
  return impl_->send_message(peer, std::move(envelope), std::move(payload));
}

std::optional<Message> Endpoint::receive(std::chrono::milliseconds timeout) {
  if (impl_->inbox.empty()) impl_->pump(timeout, [] { return false; });
  if (impl_->inbox.empty()) return std::nullopt;
  Message m = std::move(impl_->inbox.front());
  impl_->inbox.pop_front();
  return m;
}

int Endpoint::poll(std::span<Endpoint* const> endpoints, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    // Drain what the sockets already hold into the inboxes (handshakes happen here too).
    for (std::size_t i = 0; i < endpoints.size(); ++i) {
      Impl& e = *endpoints[i]->impl_;
      if (e.inbox.empty()) e.pump(std::chrono::milliseconds(0), [] { return false; });
      if (!e.inbox.empty()) return static_cast<int>(i);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return -1;
    items.clear();
    for (Endpoint* ep : endpoints) {
      items.push_back({ep->impl_->socket.handle(), 0, ZMQ_POLLIN, 0});
      if (ep->impl_->monitor) items.push_back({ep->impl_->monitor.handle(), 0, ZMQ_POLLIN, 0});
    }
    zmq::poll(items.data(), items.size(), std::min(left, std::chrono::milliseconds(250)));
  }
}

void Endpoint::wait_ready(std::chrono::milliseconds timeout) { impl_->wait_ready(timeout); }
bool Endpoint::is_ready() const { return impl_->is_ready(); }

std::optional<NodeId> Endpoint::peer_id(const PeerHandle& peer) const {
  auto it = impl_->sessions.find(peer);
  if (it == impl_->sessions.end() || it->second.state != Session::State::kReady) return std::nullopt;
  return it->second.peer_id;
}

EndpointStats Endpoint::stats() const { return impl_->stats; }
const std::shared_ptr<BufferPool>& Endpoint::buffers() const { return impl_->buffers; }

void Endpoint::send_raw_for_testing(const PeerHandle& peer, const Frames& frames) {
  impl_->raw_send(peer, frames);
}

void Endpoint::set_outgoing_hook_for_testing(std::function<std::vector<Frames>(Frames)> hook) {
  impl_->hook = std::move(hook);
}

}  // namespace cohort::transport
