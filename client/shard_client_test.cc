// The client protocol without sockets: message builders and checks, the resend schedule, and
// exchange / pull_all / push_all over fake shard links driven by a ManualClock.
#include <doctest/doctest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "cohort/client/shard_client.h"
#include "cohort/core/error.h"

namespace {

using namespace std::chrono_literals;
using cohort::Duration;
using cohort::ManualClock;
using cohort::TimePoint;
using cohort::client::ExchangeOptions;
using cohort::client::PushFields;
using cohort::client::ResendSchedule;
namespace tp = cohort::transport;

std::vector<tp::ShardInfo> two_shards() {
  return {tp::ShardInfo{.index = 0, .url = "", .node_id = "shard-0", .begin = 0, .end = 3},
          tp::ShardInfo{.index = 1, .url = "", .node_id = "shard-1", .begin = 3, .end = 5}};
}

std::shared_ptr<cohort::BufferPool> pool() {
  static const auto p = cohort::BufferPool::create(std::size_t{1} << 20);
  return p;
}

tp::Message message(tp::Envelope e, std::span<const float> values = {}) {
  tp::Message m;
  m.sender = "shard";
  m.envelope = std::move(e);
  m.payload = pool()->acquire(values.size_bytes());
  m.payload.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(m.payload.data(), values.data(), values.size_bytes());
  return m;
}

// Shards as functions of the requests they get: `answer(shard, request)` returns the replies (none
// to stay silent). Time passes only while the exchange waits in receive().
class FakeLinks final : public cohort::client::ShardLinks {
 public:
  using Answer = std::function<std::vector<tp::Message>(std::size_t, const tp::Envelope&)>;
  FakeLinks(std::size_t n, ManualClock& clock, Answer answer)
      : n_(n), clock_(clock), answer_(std::move(answer)), inbox_(n) {}

  [[nodiscard]] std::size_t size() const override { return n_; }
  void send(std::size_t shard, tp::Envelope envelope, tp::Payload payload) override {
    sends[shard].push_back(clock_.now());
    payload_bytes[shard] = payload.bytes.size();
    if (unreachable.contains(shard)) throw cohort::TransportError("connection refused");
    for (auto& m : answer_(shard, envelope)) inbox_[shard].push_back(std::move(m));
  }
  std::optional<tp::Message> receive(std::size_t shard, std::chrono::milliseconds wait) override {
    if (inbox_[shard].empty()) {
      clock_.advance(wait);
      return std::nullopt;
    }
    auto m = std::move(inbox_[shard].front());
    inbox_[shard].pop_front();
    return m;
  }
  int wait_any(std::span<const std::size_t> shards, std::chrono::milliseconds wait) override {
    for (const std::size_t s : shards) {
      if (!inbox_[s].empty()) return static_cast<int>(s);
    }
    clock_.advance(wait);
    return -1;
  }
  void deliver(std::size_t shard, tp::Message m) { inbox_[shard].push_back(std::move(m)); }
  // A slow link: what was sent stays queued here until `unsent_until`.
  [[nodiscard]] std::uint64_t unsent_bytes(std::size_t /*shard*/) const override {
    return clock_.now() < unsent_until ? 1 : 0;
  }
  [[nodiscard]] bool receiving(std::size_t /*shard*/) const override {
    return clock_.now() < receiving_until;
  }
  TimePoint unsent_until{}, receiving_until{};

  std::map<std::size_t, std::vector<TimePoint>> sends;
  std::map<std::size_t, std::size_t> payload_bytes;
  std::set<std::size_t> unreachable;

 private:
  std::size_t n_;
  ManualClock& clock_;
  Answer answer_;
  std::vector<std::deque<tp::Message>> inbox_;
};

tp::Envelope ack(std::uint64_t round, bool accepted, std::string reason = "") {
  tp::Envelope e;
  e.round = round;
  e.body = tp::PushAck{.accepted = accepted, .reason = std::move(reason), .version = 1};
  return e;
}

}  // namespace

TEST_CASE("push_request and pull_request fill the shard's range and the named fields") {
  const auto shards = two_shards();
  const auto push = cohort::client::push_request(
      shards[1], PushFields{.round = 7, .num_samples = 60, .base_version = 4,
                            .kind = tp::PushKind::kGradient, .train_loss = 0.5f, .clock = 9});
  CHECK(push.round == 7);
  const auto& p = std::get<tp::Push>(push.body);
  CHECK(p.shard == 1);
  CHECK(p.begin == 3);
  CHECK(p.end == 5);
  CHECK(p.elements == 2);
  CHECK(p.num_samples == 60);
  CHECK(p.base_version == 4);
  CHECK(p.encoding == tp::Encoding::kDenseF32);
  CHECK(p.kind == tp::PushKind::kGradient);
  CHECK(p.train_loss == 0.5f);
  CHECK(p.clock == 9);
  const auto pull = cohort::client::pull_request(shards[0], 7, 3);
  const auto& q = std::get<tp::Pull>(pull.body);
  CHECK(pull.round == 7);
  CHECK(q == tp::Pull{.shard = 0, .begin = 0, .end = 3, .min_version = 3});
}

TEST_CASE("pull_reply_for takes only its shard's reply and refuses a reply of the wrong shape") {
  const auto shards = two_shards();
  const std::vector<float> three{1, 2, 3}, two{4, 5};
  tp::Envelope e;
  e.body = tp::PullReply{.shard = 0, .begin = 0, .end = 3, .version = 2};
  const auto good = message(e, three);
  CHECK(cohort::client::pull_reply_for(shards[0], good) != nullptr);
  CHECK(cohort::client::pull_reply_for(shards[1], good) == nullptr);  // another shard's
  const auto short_payload = message(e, two);
  CHECK_THROWS_AS((void)cohort::client::pull_reply_for(shards[0], short_payload), cohort::ProtocolError);
  e.body = tp::PushAck{};
  CHECK(cohort::client::pull_reply_for(shards[0], message(e)) == nullptr);
  CHECK(cohort::client::push_ack_for(0, message(e)) != nullptr);
  CHECK(cohort::client::push_ack_for(1, message(e)) == nullptr);  // an ack of another round
}

TEST_CASE("the resend schedule doubles each shard's wait up to the cap and forgets answered shards") {
  const TimePoint t0{};
  ResendSchedule s(2, 3s, 10s);
  CHECK(s.due(t0) == std::vector<std::size_t>{0, 1});
  s.sent(0, t0);
  s.sent(1, t0 + 1s);
  CHECK(s.due(t0 + 2s).empty());
  CHECK(s.due(t0 + 3s) == std::vector<std::size_t>{0});
  s.sent(0, t0 + 3s);  // next wait 6 s
  CHECK(s.due(t0 + 8s) == std::vector<std::size_t>{1});
  CHECK(s.due(t0 + 9s) == std::vector<std::size_t>{0, 1});
  s.sent(0, t0 + 9s);   // wait 12 s, capped at 10
  s.mark_answered(1);
  CHECK_FALSE(s.all_answered());
  CHECK(s.due(t0 + 18s).empty());
  CHECK(s.due(t0 + 19s) == std::vector<std::size_t>{0});
  s.mark_answered(0);
  CHECK(s.all_answered());
  CHECK(s.due(t0 + 100s).empty());
}

TEST_CASE("exchange resends to a silent shard after 3 s, doubling, and gives up at the deadline") {
  ManualClock clock;
  const auto shards = two_shards();
  // Shard 0 answers every push; shard 1 drops its first two requests, then answers.
  int shard1_requests = 0;
  FakeLinks links(2, clock, [&](std::size_t shard, const tp::Envelope& e) {
    std::vector<tp::Message> out;
    if (shard == 1 && ++shard1_requests <= 2) return out;
    out.push_back(message(ack(e.round, true)));
    return out;
  });
  const std::vector<float> update(5, 1.0f);
  const auto bytes = std::as_bytes(std::span<const float>(update));
  ExchangeOptions o{.deadline = clock.now() + 60s};
  const auto outcome = cohort::client::push_all(
      links, shards, clock, PushFields{.round = 3, .num_samples = 10},
      [&](std::size_t i) { return bytes.subspan(shards[i].begin * 4, (shards[i].end - shards[i].begin) * 4); },
      o);
  CHECK(outcome.answered);
  CHECK(outcome.accepted());
  CHECK(links.sends[0].size() == 1);
  REQUIRE(links.sends[1].size() == 3);
  CHECK(links.payload_bytes[1] == 8);
  // Resent 3 s after the first send, then 6 s after the second.
  const auto gap1 = links.sends[1][1] - links.sends[1][0];
  const auto gap2 = links.sends[1][2] - links.sends[1][1];
  CHECK(gap1 >= Duration(3s));
  CHECK(gap1 < Duration(3s + 100ms));
  CHECK(gap2 >= Duration(6s));
  CHECK(gap2 < Duration(6s + 100ms));

  // A shard that never answers: false once the deadline passes, after 1 + resends at 3, 9, 21 s.
  ManualClock clock2;
  FakeLinks silent(1, clock2, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  const auto start = clock2.now();
  const bool ok = cohort::client::exchange(
      silent, clock2,
      [&](std::size_t i) { return std::pair{cohort::client::pull_request(shards[i], 1, 0), tp::Payload{}}; },
      [](std::size_t, tp::Message&) { return true; }, ExchangeOptions{.deadline = start + 25s});
  CHECK_FALSE(ok);
  CHECK(silent.sends[0].size() == 4);
  CHECK(clock2.now() - start > Duration(25s));
  CHECK(clock2.now() - start < Duration(26s));
}

TEST_CASE("a resend waits until the last copy has left a slow link, then the usual wait") {
  ManualClock clock;
  const auto shards = two_shards();
  FakeLinks links(1, clock, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  const auto start = clock.now();
  links.unsent_until = start + 10s;  // the first copy takes 10 s to leave
  std::vector<float> delta(3, 1.0f);
  const bool ok = cohort::client::exchange(
      links, clock,
      [&](std::size_t i) {
        return std::pair{cohort::client::push_request(shards[i], PushFields{.round = 1, .num_samples = 1}),
                         tp::Payload{std::as_bytes(std::span<const float>(delta)), nullptr}};
      },
      [](std::size_t, tp::Message&) { return true; }, ExchangeOptions{.deadline = start + 20s});
  CHECK_FALSE(ok);
  // Sent at 0; due at 3, 6 and 9 s while still queued, so not resent; 3 s after the queue
  // drained (at 12 s, the next check) and then 6 s later. Without the check: 0, 3 and 9 s.
  const auto& s = links.sends[0];
  REQUIRE(s.size() == 3);
  CHECK(s[1] - start >= Duration(12s));
  CHECK(s[1] - start < Duration(12s + 100ms));
  CHECK(s[2] - s[1] >= Duration(6s));
  CHECK(s[2] - s[1] < Duration(6s + 100ms));

  // The same while a reply streams in: a pull is not asked again until it stops.
  ManualClock clock2;
  FakeLinks pulling(1, clock2, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  const auto start2 = clock2.now();
  pulling.receiving_until = start2 + 10s;
  CHECK_FALSE(cohort::client::exchange(
      pulling, clock2,
      [&](std::size_t i) { return std::pair{cohort::client::pull_request(shards[i], 1, 0), tp::Payload{}}; },
      [](std::size_t, tp::Message&) { return true; }, ExchangeOptions{.deadline = start2 + 20s}));
  REQUIRE(pulling.sends[0].size() == 3);
  CHECK(pulling.sends[0][1] - start2 >= Duration(12s));
}

TEST_CASE("a patient exchange (a data-parallel pull the shard holds on purpose) resends only after 30 s") {
  ManualClock clock;
  const auto shards = two_shards();
  FakeLinks links(2, clock, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  std::vector<float> params(5, 0.0f);
  const bool ok = cohort::client::pull_all(links, shards, clock, 1, 4, params,
                                           ExchangeOptions{.deadline = clock.now() + 29s, .patient = true})
                      .answered;
  CHECK_FALSE(ok);
  CHECK(links.sends[0].size() == 1);
  CHECK(links.sends[1].size() == 1);
  // Without resends a send that fails is the caller's error at once, not a wait until the deadline.
  FakeLinks down(1, clock, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  down.unreachable.insert(0);
  CHECK_THROWS_AS(cohort::client::exchange(
                      down, clock,
                      [&](std::size_t i) {
                        return std::pair{cohort::client::pull_request(shards[i], 1, 0), tp::Payload{}};
                      },
                      [](std::size_t, tp::Message&) { return true; },
                      ExchangeOptions{.deadline = clock.now() + 300s, .resend = false}),
                  cohort::TransportError);
  // Without resends: one request per shard however long the wait.
  FakeLinks quiet(2, clock, [](std::size_t, const tp::Envelope&) { return std::vector<tp::Message>{}; });
  CHECK_FALSE(cohort::client::pull_all(quiet, shards, clock, 1, 4, params,
                                       ExchangeOptions{.deadline = clock.now() + 300s, .resend = false}));
  CHECK(quiet.sends[0].size() == 1);
  CHECK(quiet.sends[1].size() == 1);
}

TEST_CASE("pull_all writes each shard's range into the model; RoundStart and Bye are handed over, not lost") {
  ManualClock clock;
  const auto shards = two_shards();
  const std::vector<float> model{1, 2, 3, 4, 5};
  FakeLinks links(2, clock, [&](std::size_t, const tp::Envelope& e) {
    const auto& p = std::get<tp::Pull>(e.body);
    CHECK(p.min_version == 6);
    tp::Envelope r;
    r.round = e.round;
    r.body = tp::PullReply{.shard = p.shard, .begin = p.begin, .end = p.end, .version = 6};
    std::vector<tp::Message> out;
    out.push_back(message(r, std::span<const float>(model).subspan(p.begin, p.end - p.begin)));
    return out;
  });
  // The coordinator's connection (shard 0's) carries a RoundStart and a Bye ahead of the reply.
  tp::Envelope start;
  start.body = tp::RoundStart{.round = 9};
  links.deliver(0, message(start));
  tp::Envelope bye;
  bye.body = tp::Bye{};
  links.deliver(0, message(bye));
  std::vector<tp::Message> handed;
  std::vector<float> params(5, 0.0f);
  const bool ok = cohort::client::pull_all(
      links, shards, clock, 2, 6, params,
      ExchangeOptions{.deadline = clock.now() + 10s, .other = [&](tp::Message&& m) { handed.push_back(std::move(m)); }})
      .answered;
  CHECK(ok);
  CHECK(params == model);
  REQUIRE(handed.size() == 2);
  CHECK(std::holds_alternative<tp::RoundStart>(handed[0].envelope.body));
  CHECK(std::holds_alternative<tp::Bye>(handed[1].envelope.body));
}

TEST_CASE("pull_all hands over shard 0's batch size (data-parallel speed batches), not another shard's") {
  ManualClock clock;
  const auto shards = two_shards();
  const std::vector<float> model{1, 2, 3, 4, 5};
  FakeLinks links(2, clock, [&](std::size_t shard, const tp::Envelope& e) {
    const auto& p = std::get<tp::Pull>(e.body);
    tp::Envelope r;
    r.round = e.round;
    r.body = tp::PullReply{.shard = p.shard, .begin = p.begin, .end = p.end, .version = 6,
                           .batch_size = shard == 0 ? 48U : 7U};
    std::vector<tp::Message> out;
    out.push_back(message(r, std::span<const float>(model).subspan(p.begin, p.end - p.begin)));
    return out;
  });
  std::vector<float> params(5, 0.0f);
  std::uint32_t batch = 0;
  REQUIRE(cohort::client::pull_all(links, shards, clock, 2, 6, params, ExchangeOptions{.deadline = clock.now() + 10s},
                                   &batch));
  CHECK(params == model);
  CHECK(batch == 48);
}

TEST_CASE("push_all collects refusals, ignores acks of other rounds and survives an unreachable shard") {
  ManualClock clock;
  const auto shards = two_shards();
  FakeLinks links(2, clock, [](std::size_t shard, const tp::Envelope& e) {
    std::vector<tp::Message> out;
    out.push_back(message(ack(e.round - 1, true)));  // a stale ack of the round before: ignored
    out.push_back(message(shard == 1 ? ack(e.round, false, "round 4 is closed (late push)")
                                     : ack(e.round, true)));
    return out;
  });
  links.unreachable.insert(1);  // the first send to shard 1 fails; the resend after 3 s goes out
  const std::vector<float> update(5, 1.0f);
  const auto bytes = std::as_bytes(std::span<const float>(update));
  std::vector<tp::Encoding> encodings;
  int calls = 0;
  const auto outcome = cohort::client::push_all(
      links, shards, clock, PushFields{.round = 4, .num_samples = 10},
      [&](std::size_t) {
        if (++calls == 3) links.unreachable.clear();
        return bytes;
      },
      ExchangeOptions{.deadline = clock.now() + 60s},
      [&](std::size_t i) {
        encodings.push_back(i == 0 ? tp::Encoding::kDenseF32 : tp::Encoding::kTopK);
        return encodings.back();
      });
  CHECK(outcome.answered);
  CHECK_FALSE(outcome.accepted());
  REQUIRE(outcome.refusals.size() == 1);
  CHECK(outcome.refusals[0] == "round 4 is closed (late push)");
  CHECK(links.sends[1].size() == 2);
}

TEST_CASE("pull_all and push_all time each shard from its first request to its answer") {
  ManualClock clock;
  const auto shards = two_shards();
  const std::vector<float> model{1, 2, 3, 4, 5};
  // Shard 0 takes 200 ms to answer a pull and 500 ms a push (time passes in its send); shard 1
  // drops its first pull, so its answer comes after the resend 3 s later.
  int shard1_pulls = 0;
  FakeLinks links(2, clock, [&](std::size_t shard, const tp::Envelope& e) {
    std::vector<tp::Message> out;
    if (const auto* p = std::get_if<tp::Pull>(&e.body)) {
      if (shard == 1 && ++shard1_pulls == 1) return out;
      if (shard == 0) clock.advance(200ms);
      tp::Envelope r;
      r.round = e.round;
      r.body = tp::PullReply{.shard = p->shard, .begin = p->begin, .end = p->end, .version = 1};
      out.push_back(message(r, std::span<const float>(model).subspan(p->begin, p->end - p->begin)));
      return out;
    }
    if (shard == 0) clock.advance(500ms);
    out.push_back(message(ack(e.round, true)));
    return out;
  });
  std::vector<float> params(5, 0.0f);
  const auto pulled = cohort::client::pull_all(links, shards, clock, 1, 1, params,
                                               ExchangeOptions{.deadline = clock.now() + 60s});
  CHECK(pulled.answered);
  REQUIRE(pulled.links.size() == 2);
  CHECK(pulled.links[0].shard == 0);
  CHECK(pulled.links[0].down_bytes == 12);
  CHECK(pulled.links[0].down_seconds == doctest::Approx(0.2));
  CHECK(pulled.links[0].up_seconds == 0);
  CHECK(pulled.links[1].shard == 1);
  CHECK(pulled.links[1].down_bytes == 8);
  CHECK(pulled.links[1].down_seconds >= 3.0f);  // from the first request, resend included
  CHECK(pulled.links[1].down_seconds < 3.1f);

  const auto bytes = std::as_bytes(std::span<const float>(model));
  const auto pushed = cohort::client::push_all(
      links, shards, clock, PushFields{.round = 1, .num_samples = 10, .local_work = 2.5f},
      [&](std::size_t i) {
        return bytes.subspan(shards[i].begin * 4, (shards[i].end - shards[i].begin) * 4);
      },
      ExchangeOptions{.deadline = clock.now() + 60s});
  CHECK(pushed.accepted());
  REQUIRE(pushed.links.size() == 2);
  CHECK(pushed.links[0].up_bytes == 12);
  CHECK(pushed.links[0].up_seconds == doctest::Approx(0.5));
  CHECK(pushed.links[1].up_bytes == 8);
  CHECK(pushed.links[1].up_seconds > 0);  // answered at once: measured, not "not measured"
  CHECK(pushed.links[1].up_seconds < 0.05f);
  CHECK(pushed.links[0].down_seconds == 0);

  // The report's samples: both directions per shard, a shard only one exchange reached kept.
  auto only_pull = pulled.links;
  only_pull.push_back(tp::LinkSample{.shard = 7, .down_bytes = 4, .down_seconds = 1});
  const auto merged = cohort::client::merge_link_samples(only_pull, pushed.links);
  REQUIRE(merged.size() == 3);
  CHECK(merged[0] == tp::LinkSample{.shard = 0,
                                    .down_bytes = 12,
                                    .down_seconds = pulled.links[0].down_seconds,
                                    .up_bytes = 12,
                                    .up_seconds = pushed.links[0].up_seconds});
  CHECK(merged[1].down_bytes == 8);
  CHECK(merged[1].up_bytes == 8);
  CHECK(merged[2].shard == 7);
  CHECK(merged[2].up_seconds == 0);
}

TEST_CASE("push_request carries FedNova's local work") {
  const auto push = cohort::client::push_request(two_shards()[0],
                                                 PushFields{.round = 2, .local_work = 4.25f});
  CHECK(std::get<tp::Push>(push.body).local_work == 4.25f);
}
