// Endpoint and Context: construction (bind, connect, option checks), the public calls, and the
// receive loop with what it looks after between records: the socket monitor that restarts a
// DEALER's handshake on reconnect, the ROUTER's receive budget, and the sweep of stale sessions
// and transfers. See endpoint_impl.h for how the Endpoint's files divide the work.
#include "cohort/transport/endpoint.h"

#include <sched.h>

#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "aead.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"
#include "endpoint_impl.h"

namespace cohort::transport {

struct Context::Impl {
  zmq::context_t ctx;
  explicit Impl(int io_threads) : ctx(io_threads) {
    // Before the first socket: ZeroMQ starts its I/O threads then (see cohort/core/scheduling.h).
    if (const int policy = io_thread_policy(io_scheduling()); policy != sched_getscheduler(0)) {
      ctx.set(zmq::ctxopt::thread_sched_policy, policy);
    }
  }
};

// The allocator tuning that frames want is the program's call (cohort/transport/allocator.h).
Context::Context(int io_threads) : impl_(std::make_unique<Impl>(io_threads)) {}
Context::~Context() = default;

// At most 5 warnings a second: a flood of bad records from one peer must not flood the log.
void Endpoint::Impl::warn_limited(const std::string& text) {
  const auto now_s = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count());
  if (now_s != warn_budget_reset) {
    warn_budget_reset = now_s;
    warnings_this_second = 0;
  }
  if (++warnings_this_second <= 5) {
    COHORT_LOG(Warn) << url << ": " << text;
  }
}

void Endpoint::Impl::read_monitor() {
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

void Endpoint::Impl::sweep() {
  const auto now = Clock::now();
  if (now - last_sweep < std::chrono::seconds(1)) return;
  last_sweep = now;
  if (!is_router && secure) {
    // A DEALER with no session for longer than a handshake may take: its handshake was lost
    // (the server dropped a session that stalled, or answered an attempt it had given up on),
    // and nothing else would start another until the connection drops. Try again; the server
    // takes a new hello from a known peer as a new session.
    auto it = sessions.find("");
    if (it != sessions.end() &&
        (it->second.state == Session::State::kHandshaking ||
         it->second.state == Session::State::kAwaitAccept) &&
        now - it->second.started > options.handshake_timeout) {
      COHORT_LOG(Info) << url << ": no secure session after " << options.handshake_timeout.count()
                       << " ms: handshaking again";
      start_client_handshake();
    }
  }
  for (auto it = sessions.begin(); it != sessions.end();) {
    Session& s = it->second;
    for (auto t = s.transfers.begin(); t != s.transfers.end();) {
      // Only a transfer that stopped moving: one that streams slowly (many peers sharing the
      // receive budget) completes however long it takes.
      if (now - t->second.last_active > options.transfer_timeout) {
        warn_limited("dropped an unfinished transfer from " + s.peer_id + ": no chunk for " +
                     std::to_string(options.transfer_timeout.count()) + " ms");
        t = s.transfers.erase(t);
      } else {
        ++t;
      }
    }
    const bool stale_handshake =
        s.state == Session::State::kHandshaking && now - s.started > options.handshake_timeout;
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
void Endpoint::Impl::pump(std::chrono::milliseconds timeout, Pred until) {
  const auto deadline = Clock::now() + timeout;
  struct Abandon {  // pending records never outlive a pump, even one left by an exception
    Impl& impl;
    ~Abandon() {
      if (!impl.opening.empty()) impl.abandon_opening();
    }
  } abandon{*this};
  for (;;) {
    for (;;) {
      if (read_record()) {
        while (opening.size() > open_window()) complete_front();
      } else if (!opening.empty()) {
        complete_front();  // nothing to read: wait for (or do) the oldest open
      } else {
        break;
      }
      if (!inbox.empty() || until()) break;
    }
    settle_opening();
    if (monitor) read_monitor();
    sweep();
    if (!inbox.empty() || until()) return;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return;
    zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                {monitor ? monitor.handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    (void)poll_sockets(items, monitor ? 2 : 1, std::min(left, std::chrono::milliseconds(250)));
  }
}

bool Endpoint::Impl::is_ready() const {
  if (is_router) return true;
  auto it = sessions.find("");
  return it != sessions.end() && it->second.state == Session::State::kReady;
}

void Endpoint::Impl::wait_ready(std::chrono::milliseconds timeout) {
  if (is_router) return;
  auto failed = [&] {
    auto it = sessions.find("");
    return it != sessions.end() && it->second.state == Session::State::kFailed;
  };
  const auto deadline = Clock::now() + timeout;
  while (!is_ready() && !failed()) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
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

void Endpoint::Impl::configure_socket() {
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndtimeo, static_cast<int>(options.send_timeout.count()));
  socket.set(zmq::sockopt::sndhwm, 4096);
  stats.receive_queue = std::max(1, options.receive_queue);
  socket.set(zmq::sockopt::rcvhwm, stats.receive_queue);
  // Refuse absurd frames inside ZeroMQ, before any allocation of ours.
  const std::int64_t max_frame =
      static_cast<std::int64_t>(std::max<std::size_t>(options.chunk_bytes, 64 << 20)) + 65536;
  socket.set(zmq::sockopt::maxmsgsize, max_frame);
  if (options.heartbeat_ms > 0) {
    if (is_router) {
      // No ZMTP heartbeats on a ROUTER. Its peers wait behind a short ZMQ_RCVHWM while it
      // works through others' data, and a connection held
      // back longer than 5 heartbeats is ended by the peer (its heartbeat timeout, or its
      // kernel's TCP_USER_TIMEOUT under a zero window). libzmq 4.3.4 marks the held-back engine
      // with an I/O error when that reset arrives, and its next heartbeat timer then fails an
      // assertion (stream_engine_base.cpp:331, out_event: !_io_error) and aborts the process:
      // a shard with 50 clients pushing died that way. Without the timer nothing writes on
      // such an engine; when the queue drains it reads the error and closes. A ROUTER still
      // answers its peers' PINGs; a dead peer's connection is found by TCP keepalive while idle
      // and by TCP_USER_TIMEOUT below while replies are unacknowledged.
      const int seconds = std::max(1, options.heartbeat_ms / 1000);
      socket.set(zmq::sockopt::tcp_keepalive, 1);
      socket.set(zmq::sockopt::tcp_keepalive_idle, 5 * seconds);
      socket.set(zmq::sockopt::tcp_keepalive_intvl, seconds);
      socket.set(zmq::sockopt::tcp_keepalive_cnt, 5);
    } else {
      socket.set(zmq::sockopt::heartbeat_ivl, options.heartbeat_ms);
      socket.set(zmq::sockopt::heartbeat_timeout, options.heartbeat_ms * 5);
      socket.set(zmq::sockopt::heartbeat_ttl, options.heartbeat_ms * 5);
    }
    // ZMTP heartbeats alone did not notice a silent link: behind a link cut for 10 s, a client
    // noticed only when TCP's retransmission backoff next fired after the link was back (13 s
    // after the cut; 25 s had the cut lasted a little longer). TCP_USER_TIMEOUT aborts a
    // connection whose sent bytes stay unacknowledged for 5 heartbeats, so the DEALER starts
    // reconnecting while the link is still down (the heartbeats keep bytes in flight).
    socket.set(zmq::sockopt::tcp_maxrt, options.heartbeat_ms * 5);
  }
}
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
      throw ConfigError(
          "TLS is on by default: set tls.ca_file, tls.cert_file and tls.key_file "
          "(make them with cohort-keygen), or pass --insecure for plaintext");
    }
    impl->aead = detail::aead_backend(options.security.aead);
    (void)sec::FrameCipher::backend(impl->aead);  // ConfigError if it cannot run here
    impl->tls = std::make_unique<security::TlsContext>(security::TlsFiles{
        options.security.ca_file, options.security.cert_file, options.security.key_file});
    if (impl->tls->local_id() != options.node_id) {
      throw ConfigError("node id '" + options.node_id + "' does not match the certificate " +
                        options.security.cert_file + " (CN '" + impl->tls->local_id() + "')");
    }
  }
  if (options.multiplex && (impl->secure || !is_inproc(url))) {
    throw ConfigError("multiplexed endpoints are for plaintext inproc:// urls only, not " + url);
  }
  if (!impl->secure && !is_inproc(url)) {
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
    if (impl->options.heartbeat_ms > 0) {
      // A connect attempt made while the link is down would wait out SYN retransmissions that
      // back off to minutes; abandoned after 2 heartbeats, it is retried every reconnect_ivl_max
      // at most, so a returning link is found within about 3 s.
      impl->socket.set(zmq::sockopt::connect_timeout, impl->options.heartbeat_ms * 2);
    }
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

namespace {
// A multiplexing ROUTER's handle: "sender\0routing id" (node ids hold no NUL byte).
PeerHandle join_handle(const PeerHandle& routing, const NodeId& sender) {
  return sender + '\0' + routing;
}
std::pair<PeerHandle, NodeId> split_handle(const PeerHandle& handle) {
  const auto nul = handle.find('\0');
  if (nul == std::string::npos) return {handle, NodeId{}};
  return {handle.substr(nul + 1), handle.substr(0, nul)};
}
}  // namespace

PeerHandle multiplexed_peer(const PeerHandle& handle, const NodeId& sender) {
  return join_handle(split_handle(handle).first, sender);
}

std::optional<std::uint64_t> Endpoint::send(const PeerHandle& peer, Envelope envelope,
                                            Payload payload) {
  if (impl_->is_router && impl_->options.multiplex) {
    auto [routing, recipient] = split_handle(peer);
    envelope.recipient = std::move(recipient);
    return impl_->send_message(routing, std::move(envelope), std::move(payload));
  }
  return impl_->send_message(peer, std::move(envelope), std::move(payload));
}

std::optional<Message> Endpoint::receive(std::chrono::milliseconds timeout) {
  if (impl_->inbox.empty()) impl_->pump(timeout, [] { return false; });
  if (impl_->inbox.empty()) return std::nullopt;
  Message m = std::move(impl_->inbox.front());
  impl_->inbox.pop_front();
  if (impl_->is_router && impl_->options.multiplex) m.peer = join_handle(m.peer, m.sender);
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
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return -1;
    items.clear();
    for (Endpoint* ep : endpoints) {
      items.push_back({ep->impl_->socket.handle(), 0, ZMQ_POLLIN, 0});
      if (ep->impl_->monitor) items.push_back({ep->impl_->monitor.handle(), 0, ZMQ_POLLIN, 0});
    }
    // A signal (SIGTERM asking a shard to checkpoint and stop) interrupts the wait: report
    // "nothing ready" so that the caller sees its stop flag now, not at its next timeout.
    if (!poll_sockets(items.data(), items.size(), std::min(left, std::chrono::milliseconds(250)))) {
      return -1;
    }
  }
}

void Endpoint::wait_ready(std::chrono::milliseconds timeout) { impl_->wait_ready(timeout); }
bool Endpoint::is_ready() const { return impl_->is_ready(); }

std::optional<NodeId> Endpoint::peer_id(const PeerHandle& peer) const {
  const bool mux = impl_->is_router && impl_->options.multiplex;
  auto it = impl_->sessions.find(mux ? split_handle(peer).first : peer);
  if (it == impl_->sessions.end() || it->second.state != Session::State::kReady)
    return std::nullopt;
  if (mux) return split_handle(peer).second;
  return it->second.peer_id;
}

EndpointStats Endpoint::stats() const { return impl_->stats; }
std::uint64_t Endpoint::unsent_bytes() const {
  return impl_->unsent->load(std::memory_order_relaxed);
}
bool Endpoint::receiving() const {
  const auto recent = Clock::now() - std::chrono::seconds(1);
  for (const auto& [peer, s] : impl_->sessions) {
    for (const auto& [seq, t] : s.transfers) {
      if (t.last_active > recent) return true;
    }
  }
  return false;
}
const std::shared_ptr<BufferPool>& Endpoint::buffers() const { return impl_->buffers; }

void Endpoint::send_raw_for_testing(const PeerHandle& peer, const Frames& frames) {
  impl_->raw_send(peer, frames);
}

void Endpoint::set_outgoing_hook_for_testing(std::function<std::vector<Frames>(Frames)> hook) {
  impl_->hook = std::move(hook);
}

}  // namespace cohort::transport
