// The serial receive path of an Endpoint: reading records off the socket, checking them, and
// reassembling chunked payloads (or handing each chunk over, with deliver_chunks).

#include "endpoint_impl.h"

#include <cstring>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::transport {

void Endpoint::Impl::on_data(const PeerHandle& peer, const RecordHeader& h,
                             std::vector<zmq::message_t>& f) {
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
    // A sealed record for a session we do not know: the peer must handshake again. Its record
    // is lost: a request is answered only once the peer resends it.
    if (is_router) {
      send_control(peer, Kind::kReset, {});
      warn_limited(
          "dropped a record from a peer without a secure session (after a restart, or a "
          "session that expired): asked it to handshake again");
    }
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
    reject(peer, s, h,
           "sender '" + env.sender + "' does not match the certificate ('" + s.peer_id + "')",
           env.seq);
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

void Endpoint::Impl::reject(const PeerHandle& peer, Session& s, const RecordHeader& h,
                            const std::string& why, std::uint64_t ref_seq) {
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
bool Endpoint::Impl::unpack_bulk(Session& s, const RecordHeader& h, std::span<const std::byte> aad,
                                 const zmq::message_t& bulk, std::span<std::byte> dest) {
  auto in = bytes_of(bulk);
  if (h.kind == Kind::kSealed) return s.rx->open(h.counter, 1, aad, in, dest);
  std::memcpy(dest.data(), in.data(), in.size());
  return true;
}

std::size_t Endpoint::Impl::bulk_plain_size(const RecordHeader& h, const zmq::message_t& bulk) {
  if (h.kind != Kind::kSealed) return bulk.size();
  if (bulk.size() < sec::FrameCipher::kTagBytes) throw ProtocolError("bulk frame too short");
  return bulk.size() - sec::FrameCipher::kTagBytes;
}

void Endpoint::Impl::deliver(const PeerHandle& peer, Session& s, const RecordHeader& h,
                             Envelope& env, std::span<const std::byte> aad, zmq::message_t* bulk) {
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
      const bool adopt = !sealed && adoptable(*bulk);
      auto piece = adopt ? adopt_frame(*bulk) : buffers->acquire(len);
      if (!adopt && !unpack_bulk(s, h, aad, *bulk, piece.span())) {
        ++stats.dropped_auth;
        return;
      }
      if (!commit()) return;
      ++tr.next_index;
      tr.last_active = Clock::now();
      const bool last = tr.next_index == tr.count;
      inbox.push_back(Message{peer, s.peer_id, tr.head, offset, std::move(piece), last});
    } else {
      if (!unpack_bulk(s, h, aad, *bulk, tr.buffer.span().subspan(offset, len))) {
        ++stats.dropped_auth;
        return;
      }
      if (!commit()) return;
      ++tr.next_index;
      tr.last_active = Clock::now();
      if (tr.next_index == tr.count) {
        inbox.push_back(
            Message{peer, s.peer_id, std::move(tr.head), 0, std::move(tr.buffer), true});
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
    const bool adopt = !sealed && adoptable(*bulk);
    auto piece = adopt ? adopt_frame(*bulk) : buffers->acquire(first);
    if (!adopt && !unpack_bulk(s, h, aad, *bulk, piece.span())) {
      ++stats.dropped_auth;
      return;
    }
    if (!commit()) return;
    stats.bytes_received += first;
    if (count > 1)
      s.transfers.emplace(env.seq, Transfer{env, PooledBuffer{}, 1, count, Clock::now()});
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

std::vector<zmq::message_t> Endpoint::Impl::take_frames() {
  if (spare_frames.empty()) {
    std::vector<zmq::message_t> f;
    f.reserve(3);
    return f;
  }
  auto f = std::move(spare_frames.back());
  spare_frames.pop_back();
  return f;
}

void Endpoint::Impl::recycle_frames(std::vector<zmq::message_t>&& f) {
  f.clear();
  if (f.capacity() >= 3 && spare_frames.size() < kOpenWindow + 2) {
    spare_frames.push_back(std::move(f));
  }
}

// Reads one multipart message from the socket (non-blocking) and processes it, or starts to
// (defer_data); false if none was waiting.
bool Endpoint::Impl::read_record() {
  zmq::message_t head;
  if (!socket.recv(head, zmq::recv_flags::dontwait)) return false;
  PeerHandle peer;
  auto f = take_frames();
  bool more = head.more();
  if (is_router) {
    peer.assign(static_cast<const char*>(head.data()), head.size());
  } else {
    f.push_back(std::move(head));
  }
  bool too_many = false;
  while (more) {
    zmq::message_t m;
    (void)socket.recv(m, zmq::recv_flags::none);  // the rest of a multipart is already here
    more = m.more();
    if (f.size() < 3) {
      f.push_back(std::move(m));
    } else {
      too_many = true;
    }
  }
  if (f.empty() || too_many) {
    ++stats.dropped_malformed;
  } else if (auto h = parse_header(f[0]); !h) {
    ++stats.dropped_malformed;
    warn_limited("dropped a record with a bad header (not a Cohort peer?)");
  } else if (!defer_data(peer, *h, f)) {
    settle_opening();
    process_record(peer, *h, f);
  }
  recycle_frames(std::move(f));
  return true;
}

// The serial path: every record in order, after all pending ones are committed.
void Endpoint::Impl::process_record(const PeerHandle& peer, const RecordHeader& h,
                                    std::vector<zmq::message_t>& f) {
  try {
    switch (h.kind) {
      case Kind::kHello: on_hello(peer, h, f); break;
      case Kind::kHandshake: on_handshake(peer, h, f); break;
      case Kind::kRefuse: on_refuse(peer, h, f); break;
      case Kind::kAccept: on_accept(h); break;
      case Kind::kReset:
        if (!is_router && secure && is_ready()) {
          COHORT_LOG(Info) << url << ": peer lost our session; handshaking again";
          start_client_handshake();
        }
        break;
      case Kind::kPlain:
      case Kind::kSealed: on_data(peer, h, f); break;
    }
  } catch (const ProtocolError& e) {
    ++stats.dropped_malformed;
    warn_limited(std::string("dropped a malformed record: ") + e.what());
  }
}
}  // namespace cohort::transport
