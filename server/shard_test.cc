// The shard driven directly: messages in, a recording outbox out, no sockets.
#include <doctest/doctest.h>

#include <cmath>

#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

using testing::RecordingOutbox;
using transport::PushAck;

constexpr std::uint64_t kModelSize = 6;  // mlp:2-2

struct Fixture {
  explicit Fixture(std::vector<std::string> overrides, std::uint32_t index = 0,
                   std::uint32_t shards = 1)
      : options(with_layout(testing::make_options(std::move(overrides)), index, shards)),
        registries(builtin_registries()),
        shard(options, registries, out, nullptr) {
    shard.setup("mlp:2-2", kModelSize);
  }
  // A delta push of the whole range (one shard).
  transport::Push delta(std::uint64_t samples = 10) const {
    return transport::Push{.shard = 0,
                           .begin = shard.begin(),
                           .end = shard.end(),
                           .num_samples = samples,
                           .kind = transport::PushKind::kDelta,
                           .elements = shard.size()};
  }
  // The last PushAck sent, to `sender`.
  PushAck last_ack(const NodeId& sender) const {
    const auto acks = out.of<PushAck>();
    for (auto it = acks.rbegin(); it != acks.rend(); ++it) {
      if (it->first.peer == "peer:" + sender) return it->second;
    }
    FAIL("no PushAck to " << sender);
    return {};
  }
  std::vector<float> params() const { return {shard.params().begin(), shard.params().end()}; }

  // Shard `index` of `shards`, whatever server.shard and server.shards say.
  static ServerOptions with_layout(ServerOptions o, std::uint32_t index, std::uint32_t shards) {
    o.node.index = index;
    o.node.shards = shards;
    return o;
  }

  ServerOptions options;
  Registries registries;
  RecordingOutbox out;
  Shard shard;
};

TEST_CASE(
    "federated shard: late, duplicate, wrong-round and unselected pushes get a refusal with a "
    "reason") {
  Fixture f({"server.mode=federated"});
  std::vector<float> update(kModelSize, 0.5f);
  f.shard.open_round(1, {"a", "b"});

  SUBCASE("not selected") {
    auto m = testing::push_all("c", f.delta(), 1, 1, update);
    REQUIRE(f.shard.handle(m));
    const auto ack = f.last_ack("c");
    CHECK_FALSE(ack.accepted);
    CHECK(ack.reason == "c was not selected for round 1");
  }
  SUBCASE("a round not opened yet") {
    auto m = testing::push_all("a", f.delta(), 2, 1, update);
    REQUIRE(f.shard.handle(m));
    CHECK_FALSE(f.last_ack("a").accepted);
    CHECK(f.last_ack("a").reason == "round 2 has not opened on this shard");
  }
  SUBCASE("duplicate, then late") {
    auto first = testing::push_all("a", f.delta(), 1, 1, update);
    REQUIRE(f.shard.handle(first));
    CHECK(f.last_ack("a").accepted);
    auto again = testing::push_all("a", f.delta(), 1, 2, update);  // another transfer, same round
    REQUIRE(f.shard.handle(again));
    // An update already applied is acknowledged again (its ack may have been lost), not re-applied.
    CHECK(f.last_ack("a").accepted);
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.shard.prepare_round(1).ok);
    CHECK(f.shard.close_round(1, true) == 1);
    auto late = testing::push_all("b", f.delta(), 1, 3, update);
    REQUIRE(f.shard.handle(late));
    CHECK_FALSE(f.last_ack("b").accepted);
    CHECK(f.last_ack("b").reason == "round 1 is closed (late push)");
  }
  SUBCASE("a push refused mid-transfer, then resent: refused again") {
    auto head = testing::push_chunk("a", f.delta(), 1, 1, update, 0, 3, false);
    REQUIRE(f.shard.handle(head));
    std::vector<float> bad(kModelSize, std::nanf(""));
    auto tail = testing::push_chunk("a", f.delta(), 1, 1, bad, 3, 3, true);
    REQUIRE(f.shard.handle(tail));
    CHECK_FALSE(f.last_ack("a").accepted);
    auto again = testing::push_all("a", f.delta(), 1, 2, update);
    REQUIRE(f.shard.handle(again));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("a").reason == "duplicate push for this round");
  }
  SUBCASE("a push for another round than the open one") {
    f.shard.open_round(2, {"a", "b"});  // round 1's pushes still stream: round 1 stays open
    auto m1 = testing::push_chunk("a", f.delta(), 1, 1, update, 0, 3, false);
    f.shard.open_round(1, {"a"});  // ignored: older than the selection's round
    REQUIRE(f.shard.handle(m1));
    CHECK(f.out.count<PushAck>() == 0);
    auto m2 = testing::push_all("b", f.delta(), 2, 1, update);
    REQUIRE(f.shard.handle(m2));
    CHECK(f.last_ack("b").reason == "push for another round");
  }
  SUBCASE("wrong length and zero samples") {
    auto bad = testing::push_chunk("a", f.delta(), 1, 1, update, 0, 3, true);
    bad.envelope.payload_bytes = 3 * sizeof(float);
    REQUIRE(f.shard.handle(bad));
    CHECK(f.last_ack("a").reason == "wrong update length");
    auto zero = testing::push_all("b", f.delta(0), 1, 2, update);
    REQUIRE(f.shard.handle(zero));
    CHECK(f.last_ack("b").reason == "zero samples");
  }
}

TEST_CASE("federated shard: a resend of a push still streaming continues it and counts once") {
  Fixture f({"server.mode=federated", "server_optimizer.lr=1.0"});
  const auto before = f.params();
  std::vector<float> ua(kModelSize, 0.5f), ub(kModelSize, 2.0f);
  f.shard.open_round(1, {"a", "b"});
  auto first = testing::push_chunk("a", f.delta(), 1, 1, ua, 0, 3, false);
  REQUIRE(f.shard.handle(first));

  SUBCASE("the first transfer broke off: the resend brings the rest and is answered") {
    // Its chunks in the same size as the first's: the first one was taken, the second is next.
    auto r0 = testing::push_chunk("a", f.delta(), 1, 2, ua, 0, 3, false);
    REQUIRE(f.shard.handle(r0));
    CHECK(f.out.count<PushAck>() == 0);
    auto r1 = testing::push_chunk("a", f.delta(), 1, 2, ua, 3, 3, true);
    REQUIRE(f.shard.handle(r1));
    REQUIRE(f.out.count<PushAck>() == 1);
    CHECK(f.last_ack("a").accepted);
  }
  SUBCASE(
      "both transfers arrive whole: the one ahead finishes it, the other's end is answered too") {
    auto again = testing::push_all("a", f.delta(), 1, 2, ua);  // one chunk: its first half is taken
    REQUIRE(f.shard.handle(again));
    REQUIRE(f.out.count<PushAck>() == 1);
    CHECK(f.last_ack("a").accepted);
    auto tail = testing::push_chunk("a", f.delta(), 1, 1, ua, 3, 3, true);
    REQUIRE(f.shard.handle(tail));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("a").accepted);
  }
  SUBCASE("a resend that is not the same push is refused; the first goes on") {
    auto other = testing::push_all("a", f.delta(11), 1, 2, ua);
    REQUIRE(f.shard.handle(other));
    REQUIRE(f.out.count<PushAck>() == 1);
    CHECK_FALSE(f.last_ack("a").accepted);
    CHECK(f.last_ack("a").reason ==
          "a different update for round 1 while the first still streams in");
    auto tail = testing::push_chunk("a", f.delta(), 1, 1, ua, 3, 3, true);
    REQUIRE(f.shard.handle(tail));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("a").accepted);
  }
  auto b = testing::push_all("b", f.delta(), 1, 3, ub);
  REQUIRE(f.shard.handle(b));
  REQUIRE(f.shard.prepare_round(1).ok);
  CHECK(f.shard.close_round(1, true) == 1);
  // a and b once each, equal samples: the mean of 0.5 and 2 (a's first half taken twice would
  // move its first three coordinates elsewhere).
  const auto after = f.params();
  for (std::size_t i = 0; i < kModelSize; ++i)
    CHECK(after[i] == doctest::Approx(before[i] + 1.25f));
}

TEST_CASE("federated shard: a chunk past what an update has taken refuses it") {
  Fixture f({"server.mode=federated"});
  std::vector<float> u(kModelSize, 0.5f);
  f.shard.open_round(1, {"a"});
  auto head = testing::push_chunk("a", f.delta(), 1, 1, u, 0, 2, false);
  REQUIRE(f.shard.handle(head));
  auto resend = testing::push_chunk("a", f.delta(), 1, 2, u, 0, 1, false);
  REQUIRE(f.shard.handle(resend));
  auto skipped = testing::push_chunk("a", f.delta(), 1, 2, u, 4, 2, true);  // bytes 8-15 never came
  REQUIRE(f.shard.handle(skipped));
  REQUIRE(f.out.count<PushAck>() == 1);
  CHECK_FALSE(f.last_ack("a").accepted);
  CHECK(f.last_ack("a").reason == "chunk at byte 16 while 8 bytes are in");
}

TEST_CASE(
    "federated shard: the last chunk of an update whose round was dropped mid-transfer is "
    "refused") {
  Fixture f({"server.mode=federated"});
  std::vector<float> update(kModelSize, 0.5f);
  f.shard.open_round(1, {"a"});
  auto head = testing::push_chunk("a", f.delta(), 1, 7, update, 0, 3, false);
  REQUIRE(f.shard.handle(head));
  CHECK(f.out.count<PushAck>() == 0);
  (void)f.shard.close_round(1, false);  // the round failed while the update streamed in
  auto middle = testing::push_chunk("a", f.delta(), 1, 7, update, 3, 1, false);
  REQUIRE(f.shard.handle(middle));
  CHECK(f.out.count<PushAck>() == 0);  // only the last chunk is answered
  auto tail = testing::push_chunk("a", f.delta(), 1, 7, update, 4, 2, true);
  REQUIRE(f.shard.handle(tail));
  REQUIRE(f.out.count<PushAck>() == 1);
  const auto ack = f.last_ack("a");
  CHECK_FALSE(ack.accepted);
  CHECK(ack.reason == "round 1 closed during the transfer");
  CHECK(f.out.of<PushAck>().front().first.envelope.round == 1);
}

TEST_CASE("federated shard: two-phase close moves the model only on commit") {
  Fixture f({"server.mode=federated", "server_optimizer.lr=1.0"});
  const auto before = f.params();
  std::vector<float> update(kModelSize, 0.25f);

  SUBCASE("prepare without updates fails with the rule's reason") {
    f.shard.open_round(1, {"a"});
    const auto p = f.shard.prepare_round(1);
    CHECK_FALSE(p.ok);
    CHECK(p.reason.find("could not aggregate 0 complete update(s)") != std::string::npos);
    CHECK(f.shard.close_round(1, false) == 0);
    CHECK(f.shard.last_closed() == 1);
  }
  SUBCASE("prepare, then commit") {
    f.shard.open_round(1, {"a"});
    auto m = testing::push_all("a", f.delta(), 1, 1, update);
    REQUIRE(f.shard.handle(m));
    CHECK(f.last_ack("a").accepted);
    const auto p = f.shard.prepare_round(1);
    CHECK(p.ok);
    CHECK(f.shard.prepare_round(1).ok);  // a retry answers the same
    CHECK(f.params() == before);         // nothing applied in phase one
    CHECK(f.shard.version() == 0);
    CHECK(f.shard.close_round(1, true) == 1);
    const auto after = f.params();
    for (std::size_t i = 0; i < kModelSize; ++i)
      CHECK(after[i] == doctest::Approx(before[i] + 0.25f));
    CHECK(f.shard.close_round(1, true) == 1);  // a repeated close is a no-op
    CHECK(f.params() == after);
  }
  SUBCASE("prepare, then abort") {
    f.shard.open_round(1, {"a"});
    auto m = testing::push_all("a", f.delta(), 1, 1, update);
    REQUIRE(f.shard.handle(m));
    REQUIRE(f.shard.prepare_round(1).ok);
    CHECK(f.shard.close_round(1, false) == 0);
    CHECK(f.params() == before);
    CHECK(f.shard.last_closed() == 1);
    CHECK(f.shard.prepare_round(1).ok);  // closed already: a late retry is answered ok
  }
}

TEST_CASE(
    "shard: a restarted coordinator's welcome commits a prepared round it committed, else drops "
    "it") {
  Fixture f({"server.mode=federated", "server_optimizer.lr=1.0"});
  std::vector<float> update(kModelSize, 0.25f);
  f.shard.on_welcome(11, 0);
  f.shard.open_round(1, {"a"});
  auto m = testing::push_all("a", f.delta(), 1, 1, update);
  REQUIRE(f.shard.handle(m));
  REQUIRE(f.shard.prepare_round(1).ok);

  SUBCASE("the new coordinator committed round 1") {
    f.shard.on_welcome(22, 1);
    CHECK(f.shard.last_closed() == 1);
    CHECK(f.shard.version() == 1);
  }
  SUBCASE("the new coordinator is at round 0: round 1 is dropped, to be reopened") {
    f.shard.on_welcome(22, 0);
    CHECK(f.shard.last_closed() == 0);
    CHECK(f.shard.version() == 0);
    auto resend = testing::push_all("a", f.delta(), 1, 2, update);
    REQUIRE(f.shard.handle(resend));
    CHECK(f.last_ack("a").reason == "round 1 has not opened on this shard");
  }
  SUBCASE("a welcome from the same coordinator (a reconnect) keeps the round") {
    f.shard.on_welcome(11, 0);
    CHECK(f.shard.close_round(1, true) == 1);
  }
}

// ---- data-parallel ------------------------------------------------------------------------

transport::Push gradient(const Fixture& f, std::uint64_t clock) {
  return transport::Push{.shard = 0,
                         .begin = f.shard.begin(),
                         .end = f.shard.end(),
                         .kind = transport::PushKind::kGradient,
                         .clock = clock};
}

transport::Message pull(const Fixture& f, const NodeId& worker, std::uint64_t clock) {
  return testing::message(
      worker,
      transport::Pull{
          .shard = 0, .begin = f.shard.begin(), .end = f.shard.end(), .min_version = clock});
}

// PullReplies sent to `worker`.
std::size_t replies_to(const Fixture& f, const NodeId& worker) {
  std::size_t n = 0;
  for (const auto& [sent, reply] : f.out.of<transport::PullReply>())
    n += sent.peer == "peer:" + worker ? 1 : 0;
  return n;
}

TEST_CASE(
    "SSP shard: a pull is answered only while the puller's clock is within s of the slowest") {
  Fixture f({"server.mode=dataparallel", "server.consistency=ssp", "server.staleness=1",
             "server.clients_per_round=2"});
  std::vector<float> g(kModelSize, 0.1f);
  std::uint64_t seq = 0;
  auto push = [&](const NodeId& w, std::uint64_t clock) {
    auto m = testing::push_all(w, gradient(f, clock), 1, ++seq, g);
    REQUIRE(f.shard.handle(m));
    REQUIRE(f.last_ack(w).accepted);
  };
  auto ask = [&](const NodeId& w, std::uint64_t clock) {
    auto m = pull(f, w, clock);
    REQUIRE(f.shard.handle(m));
  };
  ask("a", 0);
  CHECK(replies_to(f, "a") == 1);
  push("a", 0);
  ask("a", 1);  // 1 - 0 <= 1
  CHECK(replies_to(f, "a") == 2);
  push("a", 1);
  ask("a", 2);  // 2 - 0 > 1: waits for the slowest worker
  CHECK(replies_to(f, "a") == 2);
  push("b", 0);  // the slowest is at 1 now: 2 - 1 <= 1
  CHECK(replies_to(f, "a") == 3);
  CHECK(f.shard.version() == 3);

  SUBCASE("a gradient for the wrong clock is refused") {
    auto m = testing::push_all("b", gradient(f, 5), 1, ++seq, g);
    REQUIRE(f.shard.handle(m));
    CHECK_FALSE(f.last_ack("b").accepted);
    CHECK(f.last_ack("b").reason == "gradient for clock 5, expected 1");
  }
}

TEST_CASE("BSP shard: a step waits for every worker and applies the sum in worker order") {
  Fixture f({"server.mode=dataparallel", "server.consistency=bsp", "server.clients_per_round=3",
             "server_optimizer.name=sgd", "server_optimizer.lr=1.0"});
  const auto before = f.params();
  // Summed in arrival order (c, a, b) the step would be (1 + 1e8) - 1e8 = 0 in fp32; in worker
  // order (a, b, c) it is (1e8 - 1e8) + 1 = 1.
  std::vector<float> ga(kModelSize, 1e8f), gb(kModelSize, -1e8f), gc(kModelSize, 1.0f);
  std::uint64_t seq = 0;
  auto push = [&](const NodeId& w, std::vector<float>& g) {
    auto m = testing::push_all(w, gradient(f, 0), 1, ++seq, g);
    REQUIRE(f.shard.handle(m));
    CHECK(f.last_ack(w).accepted);
  };
  push("c", gc);
  push("a", ga);
  CHECK(f.shard.version() == 0);
  CHECK(f.params() == before);
  push("b", gb);
  CHECK(f.shard.version() == 1);
  const auto after = f.params();
  for (std::size_t i = 0; i < kModelSize; ++i) CHECK(after[i] == doctest::Approx(before[i] - 1.0f));

  SUBCASE("a resent gradient of the clock just taken is acknowledged again, not applied twice") {
    auto again = testing::push_all("a", gradient(f, 0), 1, ++seq, ga);
    REQUIRE(f.shard.handle(again));
    CHECK(f.last_ack("a").accepted);
    CHECK(f.shard.version() == 1);
    CHECK(f.params() == after);
    // Once the worker has moved on, a gradient of an older clock than its last is refused.
    auto next = testing::push_all("a", gradient(f, 1), 1, ++seq, ga);
    REQUIRE(f.shard.handle(next));
    CHECK(f.last_ack("a").accepted);
    auto old = testing::push_all("a", gradient(f, 0), 1, ++seq, ga);
    REQUIRE(f.shard.handle(old));
    CHECK_FALSE(f.last_ack("a").accepted);
    CHECK(f.last_ack("a").reason == "gradient for clock 0, expected 2");
  }
  SUBCASE("a non-finite gradient is refused and the model stays") {
    std::vector<float> bad(kModelSize, 0.0f);
    bad[2] = std::nanf("");
    auto m = testing::push_all("a", gradient(f, 1), 1, ++seq, bad);
    REQUIRE(f.shard.handle(m));
    CHECK_FALSE(f.last_ack("a").accepted);
    CHECK(f.last_ack("a").reason == "gradient has non-finite values");
    CHECK(f.params() == after);
  }
}

TEST_CASE("ASP shard: gradients apply as they stream, chunk by chunk, and a pull never waits") {
  Fixture f({"server.mode=dataparallel", "server.consistency=asp", "server.clients_per_round=2",
             "server_optimizer.name=sgd", "server_optimizer.lr=1.0"});
  const auto before = f.params();
  std::vector<float> g(kModelSize, 1.0f);
  auto head = testing::push_chunk("a", gradient(f, 0), 1, 1, g, 0, 3, false);
  REQUIRE(f.shard.handle(head));
  auto mid = f.params();
  CHECK(mid[0] == doctest::Approx(before[0] - 1.0f));  // the first chunk is applied already
  CHECK(mid[5] == before[5]);
  CHECK(f.shard.version() == 0);
  auto tail = testing::push_chunk("a", gradient(f, 0), 1, 1, g, 3, 3, true);
  REQUIRE(f.shard.handle(tail));
  CHECK(f.last_ack("a").accepted);
  CHECK(f.shard.version() == 1);
  auto far_ahead = pull(f, "a", 10);
  REQUIRE(f.shard.handle(far_ahead));
  CHECK(replies_to(f, "a") == 1);
}

TEST_CASE(
    "a shard serves every pull of one version from one copy, which later pushes leave alone") {
  Fixture f({"server.mode=dataparallel", "server.consistency=asp", "server.clients_per_round=2",
             "server_optimizer.name=sgd", "server_optimizer.lr=1.0"});
  auto lent = [&] { return f.out.sent.back().lent; };
  auto handle = [&](transport::Message m) { return f.shard.handle(m); };
  REQUIRE(handle(pull(f, "a", 0)));
  const transport::Payload first = lent();
  REQUIRE(handle(pull(f, "b", 0)));
  const transport::Payload second = lent();
  REQUIRE(first.owner != nullptr);
  CHECK(first.owner == second.owner);  // no change in between: the same snapshot, no copy
  const std::vector<float> before = f.params();
  std::vector<float> g(kModelSize, 1.0f);
  REQUIRE(handle(testing::push_chunk("a", gradient(f, 0), 1, 1, g, 0, kModelSize, true)));
  REQUIRE(handle(pull(f, "a", 1)));
  const transport::Payload third = lent();
  CHECK(third.owner != first.owner);
  const auto* old_bytes = reinterpret_cast<const float*>(first.bytes.data());
  const auto* new_bytes = reinterpret_cast<const float*>(third.bytes.data());
  for (std::size_t i = 0; i < kModelSize; ++i) {
    CHECK(old_bytes[i] == before[i]);  // what the first pulls were sent is unchanged
    CHECK(new_bytes[i] == doctest::Approx(before[i] - 1.0f));
  }
}

// ---- FedBuff --------------------------------------------------------------------------------

TEST_CASE("FedBuff shard: a step needs K buffered updates, and an abort puts them back") {
  Fixture f({"server.mode=fedbuff", "server.buffer_size=2", "server_optimizer.lr=1.0"});
  const auto before = f.params();
  std::vector<float> u1(kModelSize, 1.0f), u2(kModelSize, 3.0f);
  auto m1 = testing::push_all("a", f.delta(), 1, 1, u1);
  REQUIRE(f.shard.handle(m1));
  CHECK(f.last_ack("a").accepted);
  CHECK(f.shard.buffered() == 1);

  const auto short_of_k = f.shard.prepare_round(1);
  CHECK_FALSE(short_of_k.ok);
  CHECK(short_of_k.reason == "shard 0 holds 1 of 2 updates");
  (void)f.shard.close_round(1, false);

  auto m2 = testing::push_all("b", f.delta(), 2, 2, u2);
  REQUIRE(f.shard.handle(m2));
  CHECK(f.shard.buffered() == 2);
  REQUIRE(f.shard.prepare_round(1).ok);
  CHECK(f.shard.buffered() == 0);
  CHECK(f.shard.prepared_count() == 2);

  (void)f.shard.close_round(1, false);  // abort: the step's updates go back into the buffer
  CHECK(f.shard.buffered() == 2);
  CHECK(f.shard.version() == 0);
  CHECK(f.params() == before);

  REQUIRE(f.shard.prepare_round(1).ok);
  CHECK(f.shard.close_round(1, true) == 1);
  CHECK(f.shard.buffered() == 0);
  CHECK(f.shard.last_closed() == 1);
  // Both updates are fresh (staleness 0, weight 1): the step moves by their mean.
  const auto after = f.params();
  for (std::size_t i = 0; i < kModelSize; ++i) CHECK(after[i] == doctest::Approx(before[i] + 2.0f));

  SUBCASE("an update from a future version is refused") {
    auto future = f.delta();
    future.base_version = 5;
    auto m = testing::push_all("c", future, 3, 3, u1);
    REQUIRE(f.shard.handle(m));
    CHECK(f.last_ack("c").reason == "update from a future version");
  }
}

TEST_CASE("FedBuff shard: a resent update counts once") {
  Fixture f({"server.mode=fedbuff", "server.buffer_size=2", "server.max_staleness=0",
             "server_optimizer.lr=1.0"});
  std::vector<float> u(kModelSize, 1.0f);
  const auto before = f.params();
  auto first = testing::push_all("a", f.delta(), 7, 1, u);
  REQUIRE(f.shard.handle(first));
  REQUIRE(f.out.count<PushAck>() == 1);
  CHECK(f.last_ack("a").accepted);

  SUBCASE("buffered already: acknowledged again, not buffered twice") {
    auto again = testing::push_all("a", f.delta(), 7, 2, u);  // a new transfer, same task
    REQUIRE(f.shard.handle(again));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("a").accepted);
    CHECK(f.shard.buffered() == 1);
    CHECK_FALSE(f.shard.prepare_round(1).ok);  // one update of K = 2
    (void)f.shard.close_round(1, false);

    auto b = testing::push_all("b", f.delta(), 8, 1, u);
    REQUIRE(f.shard.handle(b));
    REQUIRE(f.shard.prepare_round(1).ok);
    CHECK(f.shard.prepared_count() == 2);
    CHECK(f.shard.close_round(1, true) == 1);
    // And after the step (version 1, staleness 0 allowed): still an ack, not "too stale".
    auto late = testing::push_all("a", f.delta(), 7, 3, u);
    REQUIRE(f.shard.handle(late));
    CHECK(f.last_ack("a").accepted);
    CHECK(f.shard.buffered() == 0);
    const auto after = f.params();
    for (std::size_t i = 0; i < kModelSize; ++i)
      CHECK(after[i] == doctest::Approx(before[i] + 1.0f));
  }
  SUBCASE("still streaming: the resend continues it, and the update counts once") {
    auto b_head = testing::push_chunk("b", f.delta(), 8, 1, u, 0, 3, false);
    REQUIRE(f.shard.handle(b_head));
    auto b_resend = testing::push_all("b", f.delta(), 8, 2, u);  // its first half is taken
    REQUIRE(f.shard.handle(b_resend));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("b").accepted);
    CHECK(f.shard.buffered() == 2);
    auto b_tail = testing::push_chunk("b", f.delta(), 8, 1, u, 3, 3, true);  // the first's end
    REQUIRE(f.shard.handle(b_tail));
    CHECK(f.out.count<PushAck>() == 3);
    CHECK(f.last_ack("b").accepted);
    CHECK(f.shard.buffered() == 2);
    REQUIRE(f.shard.prepare_round(1).ok);
    CHECK(f.shard.close_round(1, true) == 1);
    const auto after = f.params();  // the mean of two updates of 1: b's first half once
    for (std::size_t i = 0; i < kModelSize; ++i)
      CHECK(after[i] == doctest::Approx(before[i] + 1.0f));
  }
  SUBCASE("the first transfer broke off: the resend's chunks bring the rest") {
    auto b_head = testing::push_chunk("b", f.delta(), 8, 1, u, 0, 3, false);
    REQUIRE(f.shard.handle(b_head));
    auto r0 = testing::push_chunk("b", f.delta(), 8, 2, u, 0, 3, false);
    REQUIRE(f.shard.handle(r0));
    CHECK(f.out.count<PushAck>() == 1);
    auto r1 = testing::push_chunk("b", f.delta(), 8, 2, u, 3, 3, true);
    REQUIRE(f.shard.handle(r1));
    CHECK(f.out.count<PushAck>() == 2);
    CHECK(f.last_ack("b").accepted);
    CHECK(f.shard.buffered() == 2);
  }
  SUBCASE("an older task's update is refused") {
    auto next = testing::push_all("a", f.delta(), 9, 2, u);
    REQUIRE(f.shard.handle(next));
    CHECK(f.shard.buffered() == 2);
    auto old = testing::push_all("a", f.delta(), 3, 3, u);
    REQUIRE(f.shard.handle(old));
    CHECK_FALSE(f.last_ack("a").accepted);
    CHECK(f.last_ack("a").reason == "update for task 3, older than task 9 already buffered");
    CHECK(f.shard.buffered() == 2);
  }
}

TEST_CASE("FedBuff shard: a restarted coordinator puts a prepared step back into the buffer") {
  Fixture f({"server.mode=fedbuff", "server.buffer_size=1"});
  std::vector<float> u(kModelSize, 1.0f);
  f.shard.on_welcome(11, 0);
  auto m = testing::push_all("a", f.delta(), 1, 1, u);
  REQUIRE(f.shard.handle(m));
  REQUIRE(f.shard.prepare_round(1).ok);
  CHECK(f.shard.buffered() == 0);
  f.shard.on_welcome(22, 0);
  CHECK(f.shard.buffered() == 1);
  CHECK(f.shard.version() == 0);
}

}  // namespace
}  // namespace cohort::server
