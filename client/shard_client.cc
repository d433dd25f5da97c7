#include "cohort/client/shard_client.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::client {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;

Envelope pull_request(const transport::ShardInfo& shard, std::uint64_t round,
                      std::uint64_t min_version) {
  Envelope e;
  e.round = round;
  e.body = transport::Pull{
      .shard = shard.index, .begin = shard.begin, .end = shard.end, .min_version = min_version};
  return e;
}

Envelope push_request(const transport::ShardInfo& shard, const PushFields& f) {
  Envelope e;
  e.round = f.round;
  e.body = transport::Push{.shard = shard.index,
                           .begin = shard.begin,
                           .end = shard.end,
                           .num_samples = f.num_samples,
                           .base_version = f.base_version,
                           .encoding = f.encoding,
                           .kind = f.kind,
                           .train_loss = f.train_loss,
                           .clock = f.clock,
                           .elements = shard.end - shard.begin,
                           .local_work = f.local_work};
  return e;
}

const transport::PullReply* pull_reply_for(const transport::ShardInfo& shard, const Message& m) {
  const auto* r = std::get_if<transport::PullReply>(&m.envelope.body);
  if (r == nullptr || r->shard != shard.index) return nullptr;
  if (r->begin != shard.begin || r->end != shard.end ||
      m.payload.size() != (shard.end - shard.begin) * sizeof(float)) {
    throw ProtocolError("shard " + std::to_string(shard.index) +
                        " sent a reply of the wrong shape");
  }
  return r;
}

const transport::PushAck* push_ack_for(std::uint64_t round, const Message& m) {
  const auto* a = std::get_if<transport::PushAck>(&m.envelope.body);
  return a != nullptr && m.envelope.round == round ? a : nullptr;
}

ResendSchedule::ResendSchedule(std::size_t shards, Duration first, Duration max)
    : answered_(shards, false),
      sent_(shards, false),
      next_(shards),
      wait_(shards, first),
      first_(first),
      max_(max) {}

std::vector<std::size_t> ResendSchedule::due(TimePoint now) const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < answered_.size(); ++i) {
    if (!answered_[i] && (!sent_[i] || now >= next_[i])) out.push_back(i);
  }
  return out;
}

void ResendSchedule::sent(std::size_t shard, TimePoint at) {
  sent_[shard] = true;
  next_[shard] = at + wait_[shard];
  wait_[shard] = std::min(wait_[shard] * 2, max_);
}

bool ResendSchedule::all_answered() const {
  return std::all_of(answered_.begin(), answered_.end(), [](bool a) { return a; });
}

bool exchange(ShardLinks& links, const Clock& clock, const MakeRequest& make,
              const AcceptAnswer& accept, const ExchangeOptions& options) {
  const std::size_t n = links.size();
  // Without resends the first wait never ends (a quarter of the clock's range: no overflow).
  const Duration first = !options.resend   ? Duration::max() / 4
                         : options.patient ? Duration(30s)
                                           : Duration(3s);
  ResendSchedule schedule(n, first, std::max(first, Duration(20s)));
  auto send_due = [&] {
    for (const std::size_t i : schedule.due(clock.now())) {
      if (schedule.was_sent(i) && (links.unsent_bytes(i) > 0 || links.receiving(i))) {
        // The last copy is still queued here, or the answer is streaming in (a slow link): not
        // answered because not yet delivered. A resend would queue a whole copy of the request,
        // or have the shard send a whole copy of its reply, behind the first.
        schedule.postpone(i, clock.now());
        continue;
      }
      try {
        auto [envelope, payload] = make(i);
        links.send(i, std::move(envelope), std::move(payload));
      } catch (const TransportError& e) {
        // Without resends nothing would ever answer: the caller hears why now, not at its deadline.
        if (!options.resend) throw;
        COHORT_LOG(Info) << options.who << ": shard " << i << " unreachable: " << e.what();
      }
      schedule.sent(i, clock.now());
    }
  };
  send_due();
  std::vector<std::size_t> pending;
  for (;;) {
    pending.clear();
    for (std::size_t i = 0; i < n; ++i) {
      if (!schedule.is_answered(i)) pending.push_back(i);
    }
    if (pending.empty()) return true;
    if ((options.stop != nullptr && options.stop->load()) || clock.now() > options.deadline) {
      return false;
    }
    // Short waits: the stop flag, the deadline and the resends are checked between them.
    const int ready = links.wait_any(pending, 20ms);
    if (ready >= 0) {
      const auto i = static_cast<std::size_t>(ready);
      if (auto m = links.receive(i, 0ms)) {
        // The coordinator's own messages (shard 0 shares its connection): kept for the caller.
        if (std::holds_alternative<transport::RoundStart>(m->envelope.body) ||
            std::holds_alternative<transport::Bye>(m->envelope.body) ||
            std::holds_alternative<transport::SecAgg>(m->envelope.body)) {
          if (options.other) options.other(std::move(*m));
        } else if (accept(i, *m)) {
          schedule.mark_answered(i);
        }
      }
    }
    send_due();
  }
}

namespace {

// Per shard of an exchange: when its first request went out and, once answered, the sample.
class LinkTimer {
 public:
  LinkTimer(const std::vector<transport::ShardInfo>& shards, const Clock& clock)
      : shards_(shards),
        clock_(clock),
        first_(shards.size()),
        sent_(shards.size(), false),
        done_(shards.size()) {}
  // Before each (re)send of shard i's request: only the first counts.
  void sending(std::size_t i) {
    if (sent_[i]) return;
    sent_[i] = true;
    first_[i] = clock_.now();
  }
  // Shard i answered with `bytes` of payload (pull) or after sending them (push).
  void answered(std::size_t i, std::uint64_t bytes, bool down) {
    const float s = std::chrono::duration<float>(clock_.now() - first_[i]).count();
    // A zero time means "not measured" on the wire: an answer within the clock's tick is not that.
    const float seconds = std::max(s, 1e-6f);
    auto& d = done_[i];
    d = transport::LinkSample{.shard = shards_[i].index};
    if (down) {
      d->down_bytes = bytes;
      d->down_seconds = seconds;
    } else {
      d->up_bytes = bytes;
      d->up_seconds = seconds;
    }
  }
  [[nodiscard]] LinkSamples samples() const {
    LinkSamples out;
    for (const auto& d : done_)
      if (d) out.push_back(*d);
    return out;
  }

 private:
  const std::vector<transport::ShardInfo>& shards_;
  const Clock& clock_;
  std::vector<TimePoint> first_;
  std::vector<bool> sent_;
  std::vector<std::optional<transport::LinkSample>> done_;
};

}  // namespace

PullOutcome pull_all(ShardLinks& links, const std::vector<transport::ShardInfo>& shards,
                     const Clock& clock, std::uint64_t round, std::uint64_t min_version,
                     std::span<float> params, const ExchangeOptions& options,
                     std::uint32_t* batch_size) {
  LinkTimer timer(shards, clock);
  PullOutcome out;
  out.answered = exchange(
      links, clock,
      [&](std::size_t i) {
        timer.sending(i);
        return std::pair{pull_request(shards[i], round, min_version), transport::Payload{}};
      },
      [&](std::size_t i, Message& m) {
        const auto* r = pull_reply_for(shards[i], m);
        if (r == nullptr) return false;
        if (r->end > params.size()) {
          throw ProtocolError("shard " + std::to_string(i) +
                              " holds parameters past the model's end");
        }
        std::memcpy(params.data() + r->begin, m.payload.data(), m.payload.size());
        if (batch_size != nullptr && i == 0) *batch_size = r->batch_size;
        timer.answered(i, m.payload.size(), /*down=*/true);
        return true;
      },
      options);
  out.links = timer.samples();
  return out;
}

PushOutcome push_all(ShardLinks& links, const std::vector<transport::ShardInfo>& shards,
                     const Clock& clock, const PushFields& fields,
                     const std::function<std::span<const std::byte>(std::size_t)>& bytes_of,
                     const ExchangeOptions& options,
                     const std::function<transport::Encoding(std::size_t)>& encoding_of) {
  LinkTimer timer(shards, clock);
  std::vector<std::uint64_t> sizes(shards.size(), 0);
  PushOutcome out;
  out.answered = exchange(
      links, clock,
      [&](std::size_t i) {
        PushFields f = fields;
        if (encoding_of) f.encoding = encoding_of(i);
        const auto bytes = bytes_of(i);
        sizes[i] = bytes.size();
        timer.sending(i);
        return std::pair{push_request(shards[i], f), transport::Payload{bytes, nullptr}};
      },
      [&](std::size_t i, Message& m) {
        const auto* a = push_ack_for(fields.round, m);
        if (a == nullptr) return false;
        if (!a->accepted) out.refusals.push_back(a->reason);
        timer.answered(i, sizes[i], /*down=*/false);
        return true;
      },
      options);
  out.links = timer.samples();
  return out;
}

LinkSamples merge_link_samples(const LinkSamples& pulled, const LinkSamples& pushed) {
  std::map<std::uint32_t, transport::LinkSample> by_shard;
  for (const auto& p : pulled) {
    auto& s = by_shard[p.shard];
    s.shard = p.shard;
    s.down_bytes = p.down_bytes;
    s.down_seconds = p.down_seconds;
  }
  for (const auto& p : pushed) {
    auto& s = by_shard[p.shard];
    s.shard = p.shard;
    s.up_bytes = p.up_bytes;
    s.up_seconds = p.up_seconds;
  }
  LinkSamples out;
  out.reserve(by_shard.size());
  for (const auto& [shard, s] : by_shard) out.push_back(s);
  return out;
}

ShardClient::ShardClient(transport::Context& ctx, transport::Endpoint& coordinator,
                         std::function<transport::EndpointOptions(const std::string&)> options_for)
    : ctx_(ctx), coordinator_(coordinator), options_for_(std::move(options_for)) {}

std::optional<transport::Welcome> ShardClient::register_once(
    const transport::Register& r, std::chrono::milliseconds wait,
    const std::function<void(Message&&)>& other, std::string* refusal) {
  Envelope e;
  e.body = r;
  coordinator_.send({}, std::move(e));
  const auto until = steady_clock().now() + wait;
  while (steady_clock().now() < until) {
    auto m = coordinator_.receive(100ms);
    if (!m) continue;
    if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) return std::move(*w);
    if (auto* err = std::get_if<transport::ErrorBody>(&m->envelope.body)) {
      if (refusal != nullptr) *refusal = err->message;
      return std::nullopt;
    }
    if (std::holds_alternative<transport::RoundStart>(m->envelope.body) && other)
      other(std::move(*m));
  }
  return std::nullopt;
}

void ShardClient::connect(const std::vector<transport::ShardInfo>& shards) {
  endpoints_.clear();
  shards_ = shards;
  for (const auto& s : shards_) {
    if (s.index == 0) {
      endpoints_.push_back(nullptr);  // the coordinator's own connection
      continue;
    }
    endpoints_.push_back(std::make_unique<transport::Endpoint>(
        transport::Endpoint::connect(ctx_, s.url, options_for_(s.node_id))));
  }
}

transport::Endpoint& ShardClient::endpoint(std::size_t shard) {
  return endpoints_[shard] ? *endpoints_[shard] : coordinator_;
}

void ShardClient::wait_ready(std::chrono::milliseconds timeout) {
  for (auto& ep : endpoints_) {
    if (ep) ep->wait_ready(timeout);
  }
}

bool ShardClient::report(const transport::ClientReport& r, const std::string& who) {
  Envelope e;
  e.round = r.round;
  e.body = r;
  try {
    coordinator_.send({}, std::move(e));
    return true;
  } catch (const TransportError& err) {
    COHORT_LOG(Warn) << who << ": report lost: " << err.what();
    return false;
  }
}

std::uint64_t ShardClient::bytes_sent() const {
  std::uint64_t b = coordinator_.stats().bytes_sent;
  for (const auto& e : endpoints_) {
    if (e) b += e->stats().bytes_sent;
  }
  return b;
}

std::uint64_t ShardClient::bytes_received() const {
  std::uint64_t b = coordinator_.stats().bytes_received;
  for (const auto& e : endpoints_) {
    if (e) b += e->stats().bytes_received;
  }
  return b;
}

std::uint64_t ShardClient::unsent_bytes(std::size_t shard) const {
  return endpoints_[shard] ? endpoints_[shard]->unsent_bytes() : coordinator_.unsent_bytes();
}

bool ShardClient::receiving(std::size_t shard) const {
  return endpoints_[shard] ? endpoints_[shard]->receiving() : coordinator_.receiving();
}

void ShardClient::send(std::size_t shard, Envelope envelope, transport::Payload payload) {
  (void)endpoint(shard).send({}, std::move(envelope), std::move(payload));
}

std::optional<Message> ShardClient::receive(std::size_t shard, std::chrono::milliseconds wait) {
  return endpoint(shard).receive(wait);
}

int ShardClient::wait_any(std::span<const std::size_t> shards, std::chrono::milliseconds wait) {
  std::vector<transport::Endpoint*> eps;
  eps.reserve(shards.size());
  for (const std::size_t s : shards) eps.push_back(&endpoint(s));
  const int k = transport::Endpoint::poll(eps, wait);
  return k < 0 ? -1 : static_cast<int>(shards[static_cast<std::size_t>(k)]);
}

}  // namespace cohort::client
