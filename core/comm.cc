#include "cohort/core/comm.h"

#include <atomic>
#include <cstring>
#include <string>

#include "cohort/core/error.h"

namespace cohort {

void send_floats(Comm& comm, Rank to, std::uint64_t tag, std::span<const float> values) {
  comm.send(to, tag, std::as_bytes(values));
}

namespace {

std::optional<PooledBuffer> recv_exact(Comm& comm, Rank from, std::uint64_t tag, std::size_t floats,
                                       std::chrono::milliseconds timeout) {
  auto message = comm.recv(from, tag, timeout);
  if (!message) return std::nullopt;
  if (message->size() != floats * sizeof(float)) {
    throw ProtocolError("rank " + std::to_string(from) + " sent " +
                        std::to_string(message->size()) + " bytes for tag " + std::to_string(tag) +
                        ", expected " + std::to_string(floats * sizeof(float)));
  }
  return message;
}

}  // namespace

bool recv_floats(Comm& comm, Rank from, std::uint64_t tag, std::span<float> out,
                 std::chrono::milliseconds timeout) {
  auto message = recv_exact(comm, from, tag, out.size(), timeout);
  if (!message) return false;
  if (!out.empty()) std::memcpy(out.data(), message->data(), out.size_bytes());
  return true;
}

bool recv_add_floats(Comm& comm, Rank from, std::uint64_t tag, std::span<float> acc,
                     std::chrono::milliseconds timeout) {
  auto message = recv_exact(comm, from, tag, acc.size(), timeout);
  if (!message) return false;
  // Pool blocks are 64-byte aligned and received frames delivered in place 8-byte aligned
  // (transport/endpoint.cc, adoptable()), so the bytes may be read as floats.
  const auto* in = reinterpret_cast<const float*>(message->data());
  float* out = acc.data();
  const std::size_t n = acc.size();
  for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
  return true;
}

void Mailbox::put(Rank from, std::uint64_t tag, PooledBuffer message) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    queues_[{from, tag}].push_back(std::move(message));
  }
  cv_.notify_all();
}

std::optional<PooledBuffer> Mailbox::try_take(Rank from, std::uint64_t tag) {
  std::lock_guard lock(mu_);
  auto it = queues_.find({from, tag});
  if (it == queues_.end() || it->second.empty()) return std::nullopt;
  PooledBuffer m = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return m;
}

std::optional<PooledBuffer> Mailbox::take(Rank from, std::uint64_t tag,
                                          std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const auto key = std::make_pair(from, tag);
  const bool got = cv_.wait_for(lock, timeout, [&] {
    if (closed_) return true;
    auto it = queues_.find(key);
    return it != queues_.end() && !it->second.empty();
  });
  if (!got) return std::nullopt;
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return std::nullopt;
  PooledBuffer m = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return m;
}

void Mailbox::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void Mailbox::drop_from(Rank from) {
  std::lock_guard lock(mu_);
  for (auto it = queues_.begin(); it != queues_.end();) {
    it = it->first.first == from ? queues_.erase(it) : std::next(it);
  }
}

void Mailbox::reopen() {
  std::lock_guard lock(mu_);
  queues_.clear();
  closed_ = false;
}

class InMemoryNetwork::Endpoint final : public Comm {
 public:
  Endpoint(InMemoryNetwork& net, Rank rank) : net_(net), rank_(rank) {}

  Rank rank() const override { return rank_; }
  Rank size() const override { return net_.size(); }

  void send(Rank to, std::uint64_t tag, std::span<const std::byte> bytes) override {
    if (!check_destination(to)) return;
    PooledBuffer copy = net_.buffers_->acquire(bytes.size());
    if (!bytes.empty()) std::memcpy(copy.data(), bytes.data(), bytes.size());
    sent_ += bytes.size();
    net_.comms_[to]->mailbox.put(rank_, tag, std::move(copy));
  }

  void send_shared(Rank to, std::uint64_t tag, std::span<const std::byte> bytes,
                   std::shared_ptr<const void> owner) override {
    if (!check_destination(to)) return;
    // The receiver reads the sender's bytes; the owner lives until it drops them.
    auto* held = new std::shared_ptr<const void>(std::move(owner));
    PooledBuffer lent = PooledBuffer::wrap(
        const_cast<std::byte*>(bytes.data()), bytes.size(),
        [](void* h) noexcept { delete static_cast<std::shared_ptr<const void>*>(h); }, held);
    sent_ += bytes.size();
    net_.comms_[to]->mailbox.put(rank_, tag, std::move(lent));
  }

  std::optional<PooledBuffer> recv(Rank from, std::uint64_t tag,
                                   std::chrono::milliseconds timeout) override {
    COHORT_CHECK(from < net_.size() && from != rank_) << "bad source rank " << from;
    auto m = mailbox.take(from, tag, timeout);
    if (m) received_ += m->size();
    return m;
  }

  std::uint64_t bytes_sent() const override { return sent_; }
  std::uint64_t bytes_received() const override { return received_; }

  Mailbox mailbox;
  std::atomic<bool> alive{true};

 private:
  // False when the message is to be dropped (a killed rank on either side).
  bool check_destination(Rank to) const {
    if (to >= net_.size()) {
      throw TransportError("rank " + std::to_string(rank_) + " sent to unknown rank " +
                           std::to_string(to) + " (group of " + std::to_string(net_.size()) + ")");
    }
    COHORT_CHECK(to != rank_) << "a rank may not send to itself";
    return alive.load() && net_.comms_[to]->alive.load();
  }

  InMemoryNetwork& net_;
  Rank rank_;
  std::uint64_t sent_ = 0;
  std::uint64_t received_ = 0;
};

InMemoryNetwork::InMemoryNetwork(Rank n, std::shared_ptr<BufferPool> buffers)
    : buffers_(buffers ? std::move(buffers) : BufferPool::create()) {
  if (n == 0) throw ConfigError("an in-memory network needs at least one rank");
  for (Rank r = 0; r < n; ++r) comms_.push_back(std::make_unique<Endpoint>(*this, r));
}

InMemoryNetwork::~InMemoryNetwork() = default;

Comm& InMemoryNetwork::comm(Rank r) {
  COHORT_CHECK(r < size()) << "rank " << r << " of " << size();
  return *comms_[r];
}

void InMemoryNetwork::kill(Rank r) {
  COHORT_CHECK(r < size()) << "rank " << r << " of " << size();
  comms_[r]->alive.store(false);
  comms_[r]->mailbox.close();
  for (auto& c : comms_) c->mailbox.drop_from(r);
}

void InMemoryNetwork::revive(Rank r) {
  COHORT_CHECK(r < size()) << "rank " << r << " of " << size();
  comms_[r]->mailbox.reopen();
  comms_[r]->alive.store(true);
}

bool InMemoryNetwork::alive(Rank r) const { return r < size() && comms_[r]->alive.load(); }

}  // namespace cohort
