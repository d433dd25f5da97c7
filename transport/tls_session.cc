// The TLS session of an Endpoint: hello, handshake, accept and refuse records, and the states a
// session goes through (handshaking, awaiting the server's accept, ready, failed).

#include "endpoint_impl.h"

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::transport {

void Endpoint::Impl::refuse(const PeerHandle& peer, const std::string& reason,
                            std::uint64_t attempt) {
  ++stats.refused_peers;
  warn_limited("refused peer: " + reason);
  send_control(peer, Kind::kRefuse, std::as_bytes(std::span(reason.data(), reason.size())),
               std::nullopt, attempt);
}

void Endpoint::Impl::start_client_handshake() {
  Session& s = sessions[""];
  s = Session{};
  s.attempt = ++attempts;
  if (!secure) {
    s.state = Session::State::kReady;
    return;
  }
  s.handshake =
      std::make_unique<sec::Handshake>(*tls, sec::Role::kClient,
                                       options.security.expected_peer.empty()
                                           ? std::nullopt
                                           : std::optional<NodeId>(options.security.expected_peer));
  auto first = s.handshake->step({});
  send_control("", Kind::kHello,
               std::as_bytes(std::span(options.node_id.data(), options.node_id.size())),
               std::span<const std::byte>(first), s.attempt);
}

// The client is done before the server has checked its certificate, so it waits for kAccept.
void Endpoint::Impl::finish_handshake(const PeerHandle& peer, Session& s) {
  const sec::SessionKeys keys = s.handshake->keys();
  s.tx = std::make_unique<sec::FrameCipher>(keys.tx, aead);
  s.rx = std::make_unique<sec::FrameCipher>(keys.rx, aead);
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

void Endpoint::Impl::on_accept(const RecordHeader& h) {
  if (is_router) return;
  Session& s = sessions[""];
  if (s.state != Session::State::kAwaitAccept || h.counter != s.attempt) return;
  s.state = Session::State::kReady;
  ++stats.handshakes;
  COHORT_LOG(Debug) << url << ": secure session with " << s.peer_id;
}

void Endpoint::Impl::on_hello(const PeerHandle& peer, const RecordHeader& h,
                              std::vector<zmq::message_t>& f) {
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

void Endpoint::Impl::on_handshake(const PeerHandle& peer, const RecordHeader& h,
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

void Endpoint::Impl::on_refuse(const PeerHandle& peer, const RecordHeader& h,
                               std::vector<zmq::message_t>& f) {
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
}  // namespace cohort::transport
