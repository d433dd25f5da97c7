#include "cohort/transport/zmq_comm.h"

#include <map>
#include <set>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::transport {

using Clock = std::chrono::steady_clock;

struct ZmqComm::Impl {
  Context& ctx;
  Rank rank = 0;
  Rank size = 0;
  EndpointOptions options;
  Endpoint router;
  std::vector<PeerAddress> peers;
  std::map<Rank, Endpoint> dealers;
  std::set<Rank> was_ready;  // ranks whose session completed once
  std::uint64_t dropped = 0;
  Clock::time_point last_full_pump{};
  Mailbox mailbox;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;

  Impl(Context& c, Rank r, Rank n, const std::string& bind_url, EndpointOptions o)
      : ctx(c),
        rank(r),
        size(n),
        options(std::move(o)),
        router(Endpoint::bind(ctx, bind_url, options)) {
    if (!options.buffers) options.buffers = router.buffers();  // one pool for every socket
  }

  Endpoint& dealer(Rank to) {
    auto it = dealers.find(to);
    if (it != dealers.end()) return it->second;
    if (to >= peers.size() || peers[to].url.empty()) {
      throw TransportError("rank " + std::to_string(rank) + " has no address for rank " +
                           std::to_string(to));
    }
    EndpointOptions o = options;
    o.security.expected_peer = peers[to].node_id;
    return dealers.emplace(to, Endpoint::connect(ctx, peers[to].url, std::move(o))).first->second;
  }

  // Files one received message under its sender's rank, after checking who sent it.
  void file(Message m) {
    const auto* g = std::get_if<GossipExchange>(&m.envelope.body);
    if (g == nullptr) {
      COHORT_LOG(Warn) << "comm rank " << rank << ": dropped a '" << body_name(m.envelope.body)
                       << "' message from " << m.sender;
      return;
    }
    const Rank from = g->from_rank;
    if (from >= peers.size() || from == rank) {
      COHORT_LOG(Warn) << "comm rank " << rank << ": dropped a message from unknown rank " << from;
      return;
    }
    if (router.is_secure() && m.sender != peers[from].node_id) {
      COHORT_LOG(Warn) << "comm rank " << rank << ": dropped a message claiming rank " << from
                       << " from node " << m.sender << " (rank " << from << " is "
                       << peers[from].node_id << ")";
      return;
    }
    received += m.payload.size();
    mailbox.put(from, g->step, std::move(m.payload));
  }

  // One round of reading: waits up to `timeout` for any socket, then drains what is ready.
  // Once every DEALER's session is up, data only ever arrives on the ROUTER: read it alone (one
  // socket, no poll set) and look at the DEALERs (re-handshakes, resets) every 50 ms only.
  void pump(std::chrono::milliseconds timeout) {
    const auto now = Clock::now();
    bool ready = true;
    for (auto& [r, ep] : dealers) ready = ready && ep.is_ready();
    if (ready && now - last_full_pump < std::chrono::milliseconds(50)) {
      if (auto m = router.receive(std::min(timeout, std::chrono::milliseconds(50)))) {
        file(std::move(*m));
        while (auto more = router.receive(std::chrono::milliseconds(0))) file(std::move(*more));
      }
      return;
    }
    last_full_pump = now;
    std::vector<Endpoint*> eps;
    eps.push_back(&router);
    for (auto& [r, ep] : dealers) eps.push_back(&ep);
    int i = Endpoint::poll(eps, timeout);
    while (i >= 0) {
      if (auto m = eps[i]->receive(std::chrono::milliseconds(0))) {
        if (i == 0) {
          file(std::move(*m));
        }  // a DEALER only ever receives handshake records, handled inside the Endpoint
      }
      i = Endpoint::poll(eps, std::chrono::milliseconds(0));
    }
  }

  void connect(std::span<const Rank> ranks, std::chrono::milliseconds timeout) {
    for (Rank r : ranks) (void)dealer(r);
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      std::optional<Rank> waiting;
      for (Rank r : ranks) {
        if (!dealers.at(r).is_ready()) {
          waiting = r;
          break;
        }
      }
      if (!waiting) return;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        // Surfaces the peer's refusal reason when there is one, else a TimeoutError.
        dealers.at(*waiting).wait_ready(std::chrono::milliseconds(1));
        throw TimeoutError("rank " + std::to_string(*waiting) + " at " + peers[*waiting].url +
                           " did not answer within " + std::to_string(timeout.count()) + " ms");
      }
      pump(std::min(left, std::chrono::milliseconds(20)));
    }
  }
};

ZmqComm::ZmqComm(Context& ctx, Rank rank, Rank size, const std::string& bind_url,
                 EndpointOptions options)
    : impl_(std::make_unique<Impl>(ctx, rank, size, bind_url, std::move(options))) {
  if (rank >= size) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside a group of " +
                      std::to_string(size));
  }
}

ZmqComm::~ZmqComm() = default;

const std::string& ZmqComm::url() const { return impl_->router.url(); }

void ZmqComm::set_peers(std::vector<PeerAddress> peers) {
  for (auto it = impl_->dealers.begin(); it != impl_->dealers.end();) {
    const Rank r = it->first;
    const bool changed =
        r >= peers.size() || r >= impl_->peers.size() || !(peers[r] == impl_->peers[r]);
    if (changed) impl_->was_ready.erase(r);
    it = changed ? impl_->dealers.erase(it) : std::next(it);
  }
  impl_->size = std::max<Rank>(impl_->size, static_cast<Rank>(peers.size()));
  impl_->peers = std::move(peers);
}

void ZmqComm::connect(std::span<const Rank> ranks, std::chrono::milliseconds timeout) {
  impl_->connect(ranks, timeout);
}

void ZmqComm::forget(Rank r) {
  impl_->dealers.erase(r);
  impl_->was_ready.erase(r);
  impl_->mailbox.drop_from(r);
}

void ZmqComm::set_rank(Rank r) { impl_->rank = r; }

Rank ZmqComm::rank() const { return impl_->rank; }
Rank ZmqComm::size() const { return impl_->size; }

void ZmqComm::send(Rank to, std::uint64_t tag, std::span<const std::byte> bytes) {
  send_shared(to, tag, bytes, nullptr);
}

void ZmqComm::send_shared(Rank to, std::uint64_t tag, std::span<const std::byte> bytes,
                          std::shared_ptr<const void> owner) {
  COHORT_CHECK(to != impl_->rank) << "a rank may not send to itself";
  Endpoint& ep = impl_->dealer(to);
  try {
    if (!ep.is_ready()) {
      const Rank one[] = {to};
      impl_->connect(one, impl_->was_ready.contains(to) ? std::chrono::milliseconds(200)
                                                        : impl_->options.handshake_timeout);
    }
    impl_->was_ready.insert(to);
    Envelope env;
    env.body = GossipExchange{tag, impl_->rank, 0.0, Encoding::kDenseF32, bytes.size() / 4};
    (void)ep.send({}, std::move(env), Payload{bytes, std::move(owner)});
    impl_->sent += bytes.size();
  } catch (const TransportError& e) {
    if (impl_->dropped++ % 100 == 0) {
      COHORT_LOG(Warn) << "comm rank " << impl_->rank << ": dropped a message to rank " << to
                       << " (" << e.what() << ")";
    }
  }
}

std::optional<PooledBuffer> ZmqComm::recv(Rank from, std::uint64_t tag,
                                          std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto m = impl_->mailbox.try_take(from, tag)) return m;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      impl_->pump(std::chrono::milliseconds(0));
      return impl_->mailbox.try_take(from, tag);
    }
    impl_->pump(left);
  }
}

void ZmqComm::pump(std::chrono::milliseconds timeout) { impl_->pump(timeout); }

std::uint64_t ZmqComm::bytes_sent() const { return impl_->sent; }
std::uint64_t ZmqComm::bytes_received() const { return impl_->received; }

}  // namespace cohort::transport
