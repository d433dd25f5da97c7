// Endpoint sending: records, chunking of large payloads, sealing ahead on the pool, pacing.
// See endpoint_impl.h for how the Endpoint's files divide the work.

#include "endpoint_impl.h"

#include <cerrno>
#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::transport {

// Sends one record; returns false if a ROUTER's peer is unreachable.
bool Endpoint::Impl::send_frames(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
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
    if (!socket.send(body, bulk ? more : zmq::send_flags::none))
      throw TimeoutError("send timed out");
    if (bulk && !socket.send(*bulk, zmq::send_flags::none)) throw TimeoutError("send timed out");
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return false;
    throw TransportError(std::string("send on ") + url + " failed: " + e.what());
  }
  ++stats.records_sent;
  return true;
}

bool Endpoint::Impl::send_hooked(const PeerHandle& peer, zmq::message_t header, zmq::message_t body,
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

void Endpoint::Impl::raw_send(const PeerHandle& peer, const Frames& record) {
  if (is_router) socket.send(message_from(std::string_view(peer)), zmq::send_flags::sndmore);
  for (std::size_t i = 0; i < record.size(); ++i) {
    socket.send(message_from(std::span<const std::byte>(record[i])),
                i + 1 < record.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  ++stats.records_sent;
}

void Endpoint::Impl::send_control(const PeerHandle& peer, Kind kind, std::span<const std::byte> a,
                                  std::optional<std::span<const std::byte>> b,
                                  std::uint64_t attempt) {
  auto h = make_header(kind, attempt);
  std::optional<zmq::message_t> second;
  if (b) second = message_from(*b);
  send_frames(peer, message_from(std::span<const std::byte>(h)), message_from(a),
              std::move(second));
}

Envelope detail::Outgoing::envelope_for(std::uint32_t i, std::uint64_t& seq) const {
  if (i == 0) return head;
  Envelope c;
  c.sender = head.sender;
  c.recipient = head.recipient;
  c.seq = ++seq;
  c.round = head.round;
  c.payload_bytes = total;
  c.chunk_bytes = head.chunk_bytes;
  c.body = ChunkHeader{head.seq, i, count, std::uint64_t{i} * chunk};
  return c;
}

std::span<const std::byte> detail::Outgoing::slice(std::uint32_t i) const {
  if (total == 0) return {};
  const std::size_t off = std::size_t{i} * chunk;
  return payload.bytes.subspan(off, std::min<std::size_t>(chunk, total - off));
}

std::optional<std::uint64_t> Endpoint::Impl::send_message(const PeerHandle& peer, Envelope env,
                                                          Payload payload) {
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
    throw TransportError("payload of " + std::to_string(total) +
                         " bytes exceeds max_payload_bytes");
  }
  detail::Outgoing out;
  out.total = total;
  out.chunk = options.chunk_bytes;
  out.count = total == 0 ? 1 : static_cast<std::uint32_t>((total + out.chunk - 1) / out.chunk);
  env.protocol_version = kProtocolVersion;
  if (!options.multiplex || is_router || env.sender.empty()) env.sender = options.node_id;
  env.seq = ++seq;
  env.payload_bytes = total;
  env.chunk_bytes = total == 0 ? 0 : static_cast<std::uint32_t>(out.chunk);
  out.head = std::move(env);
  out.payload = std::move(payload);
  const bool delivered = secure ? send_sealed(peer, *session, out) : send_plain(peer, out);
  if (!delivered) return std::nullopt;
  stats.bytes_sent += total;
  return out.head.seq;
}

bool Endpoint::Impl::send_plain(const PeerHandle& peer, const detail::Outgoing& out) {
  SendPacer pacer(paced() && out.count > kSendAhead);
  for (std::uint32_t i = 0; i < out.count; ++i) {
    auto header = make_header(Kind::kPlain, 0);
    auto body = encode(out.envelope_for(i, seq));
    std::optional<zmq::message_t> bulk;
    if (out.total > 0) {
      pacer.before(i);
      bulk = bulk_message(out.slice(i), out.payload.owner, pacer.progress());
    }
    if (!send_frames(peer, message_from(std::span<const std::byte>(header)),
                     message_from(std::span<const std::byte>(body)), std::move(bulk))) {
      return false;
    }
  }
  return true;
}

// Sealed: counters are assigned in order here; bulk chunks are sealed on the pool, up to
// kSealWindow ahead of the socket. The socket thread seals the oldest itself when no worker
// has started it yet.
bool Endpoint::Impl::send_sealed(const PeerHandle& peer, Session& session,
                                 const detail::Outgoing& out) {
  std::deque<std::unique_ptr<PendingRecord>> window;
  // Whatever happens (a send timing out), no worker may still write into a record we free.
  struct SettleWindow {
    std::deque<std::unique_ptr<PendingRecord>>& w;
    ~SettleWindow() {
      for (auto& rec : w) {
        if (rec->seal && !rec->seal->claim() && rec->seal->done.valid()) rec->seal->done.wait();
      }
    }
  } settle{window};
  const sec::FrameCipher& cipher = *session.tx;
  ThreadPool* pool = out.count > 1 ? crypto_pool() : nullptr;
  // Sealing here (no pool): paced like plaintext, which also keeps the buffers it seals into
  // few and warm. With a pool the seal window bounds what is ahead.
  SendPacer pacer(paced() && pool == nullptr && out.count > kSendAhead && out.total > 0);
  auto flush_front = [&]() -> bool {
    PendingRecord& rec = *window.front();
    std::optional<zmq::message_t> bulk;
    if (rec.seal) {
      const bool sealed = finish_job(*rec.seal);
      rec.seal.reset();  // done: nothing left to settle
      if (!sealed) throw TransportError("AES-256-GCM seal failed");
      bulk = pooled_message(std::move(rec.bulk), pacer.progress());
    }
    const bool ok =
        send_frames(peer, message_from(std::span<const std::byte>(rec.header)),
                    message_from(std::span<const std::byte>(rec.sealed_envelope)), std::move(bulk));
    window.pop_front();
    return ok;
  };
  bool delivered = true;
  for (std::uint32_t i = 0; i < out.count && delivered; ++i) {
    auto rec = std::make_unique<PendingRecord>();
    const std::uint64_t counter = ++session.tx_counter;
    rec->header = make_header(Kind::kSealed, counter);
    rec->envelope = encode(out.envelope_for(i, seq));
    rec->sealed_envelope.resize(rec->envelope.size() + sec::FrameCipher::kTagBytes);
    cipher.seal(counter, 0, rec->header, rec->envelope, rec->sealed_envelope);
    if (out.total > 0) {
      auto in = out.slice(i);
      pacer.before(i);
      rec->bulk = buffers->acquire(in.size() + sec::FrameCipher::kTagBytes);
      rec->seal = std::make_shared<CryptoJob>();
      CryptoJob& job = *rec->seal;
      job.op = CryptoJob::Op::kSeal;
      job.cipher = &cipher;
      job.counter = counter;
      job.aad = rec->envelope;
      job.in = in;
      job.out = rec->bulk.span();
      start_job(rec->seal, pool);
    }
    window.push_back(std::move(rec));
    // Sealed here, with no pool: out at once, so the socket starts on the first chunk while
    // this thread seals the next.
    if (window.size() >= (pool != nullptr ? kSealWindow : 1)) delivered = flush_front();
  }
  while (delivered && !window.empty()) delivered = flush_front();
  return delivered;
}

// A DEALER paces its messages to its one peer. A ROUTER does not: waiting on one slow peer
// would hold up every other. Over inproc:// a frame is let go of only when the receiver drops
// it, often on this thread.
bool Endpoint::Impl::paced() const { return !is_router && url.rfind("inproc://", 0) != 0; }

zmq::message_t Endpoint::Impl::pooled_message(PooledBuffer buf,
                                              const std::shared_ptr<SendProgress>& progress) {
  const std::size_t size = buf.size();
  void* data = buf.data();
  auto* hint = new BulkHint{buf.detach(), nullptr, progress, unsent, size};  // freed by ZeroMQ
  unsent->fetch_add(size, std::memory_order_relaxed);
  return zmq::message_t(data, size, free_bulk, hint);
}

zmq::message_t Endpoint::Impl::bulk_message(std::span<const std::byte> bytes,
                                            const std::shared_ptr<const void>& owner,
                                            const std::shared_ptr<SendProgress>& progress) {
  if (owner) {  // zero copy straight from the caller's memory
    auto* hint = new BulkHint{nullptr, owner, progress, unsent, bytes.size()};  // freed by ZeroMQ
    unsent->fetch_add(bytes.size(), std::memory_order_relaxed);
    return zmq::message_t(const_cast<std::byte*>(bytes.data()), bytes.size(), free_bulk, hint);
  }
  auto buf = buffers->acquire(bytes.size());
  if (!bytes.empty()) std::memcpy(buf.data(), bytes.data(), bytes.size());
  return pooled_message(std::move(buf), progress);
}
}  // namespace cohort::transport
