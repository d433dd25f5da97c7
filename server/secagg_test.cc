// Secure aggregation without sockets: the coordinator's SecAggRound, two secure shards and ten
// clients (client::SecAggSession), every message routed by hand as node.cc and the participant
// would route it. The test is the transport: it hands each shard the masked inputs and keeps a
// copy of every one, so it can show that no shard ever holds a client's update in the clear.
#include <doctest/doctest.h>

#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "cohort/client/secagg_session.h"
#include "cohort/transport/secagg_messages.h"
#include "secagg_round.h"
#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

namespace secagg = aggregation::secagg;
using testing::RecordingOutbox;
using transport::Message;
using transport::SecAgg;
using transport::SecAggData;
using transport::SecAggStage;

constexpr const char* kSpec = "mlp:8-6-4";
constexpr std::uint64_t kSize = 8 * 6 + 6 + 6 * 4 + 4;
constexpr std::uint64_t kRound = 1;

PooledBuffer lend_bytes(std::vector<std::byte>& bytes) {
  return PooledBuffer::wrap(
      bytes.data(), bytes.size(), [](void*) noexcept {}, nullptr);
}

// What each client does, or where it stops (drops out) in the round.
enum class Fate { kSurvives, kSilent, kNoShares, kNoInput, kNoUnmask };

struct Client {
  std::uint32_t id = 0;
  NodeId node;
  double weight = 0;
  Fate fate = Fate::kSurvives;
  std::vector<float> update;
  std::unique_ptr<client::SecAggSession> session;
};

struct Harness {
  explicit Harness(std::size_t n, std::vector<std::string> extra = {}) : clock() {
    std::vector<std::string> overrides{"model.spec=" + std::string(kSpec),
                                       "server.secure_aggregation=secagg+", "server.shards=2",
                                       "server.clients_per_round=" + std::to_string(n)};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> value(-0.5f, 0.5f);
    double samples = 0;
    for (std::uint32_t i = 0; i < n; ++i) samples += 10.0 * (i + 1);
    std::vector<NodeId> nodes;
    for (std::uint32_t i = 0; i < n; ++i) {
      Client c{.id = i, .node = "client-" + std::to_string(i), .weight = 10.0 * (i + 1) / samples};
      for (std::uint64_t j = 0; j < kSize; ++j) c.update.push_back(value(rng));
      nodes.push_back(c.node);
      clients.push_back(std::move(c));
    }
    for (std::uint32_t i = 0; i < 2; ++i) {
      options[i] = testing::make_options(overrides);
      options[i].node.index = i;
      options[i].node.shards = 2;
      shards[i] = std::make_unique<Shard>(options[i], registries, shard_out[i], nullptr, clock);
      shards[i]->setup(kSpec, kSize);
      shards[i]->open_round(kRound, nodes);
      start[i] = {shards[i]->params().begin(), shards[i]->params().end()};
    }
    SecAggRound::Shards s;
    s.count = 2;
    s.node = [](std::size_t i) { return "shard-" + std::to_string(i); };
    s.local_held = [this](std::uint64_t r) { return shards[0]->secagg_held(r); };
    s.local_seeds = [this](std::uint64_t r, const SecAggData& d) { shards[0]->secagg_seeds(r, d); };
    s.send = [this](std::size_t i, transport::Envelope e, transport::Payload p) {
      REQUIRE(i == 1);
      const auto& sa = std::get<SecAgg>(e.body);
      if (sa.stage == SecAggStage::kHeld) {
        SecAggData held;
        for (auto& node : shards[1]->secagg_held(sa.round)) held.members.push_back({.node = node});
        to_coordinator("shard-1", sa, held);
      } else if (sa.stage == SecAggStage::kSeeds) {
        shards[1]->secagg_seeds(sa.round, transport::decode_secagg(p.bytes));
      }
      return true;
    };
    round = std::make_unique<SecAggRound>(options[0].secagg, out, clock, std::move(s));
  }

  void to_coordinator(const NodeId& from, const SecAgg& sa, const SecAggData& d,
                      std::uint64_t round_of_envelope = kRound) {
    auto m = testing::message(from, sa, round_of_envelope, ++seq);
    payloads.push_back(transport::encode_secagg(d));
    m.payload = lend_bytes(payloads.back());
    inbox.push_back(std::move(m));
  }

  void begin() {
    std::vector<SecAggRound::Member> members;
    for (auto& c : clients) {
      members.push_back({.id = c.id, .node = c.node, .peer = "peer:" + c.node, .weight = c.weight});
      c.session = std::make_unique<client::SecAggSession>(c.id, kRound, kSize);
    }
    round->begin(kRound, std::move(members), kSize);
    for (auto& c : clients) {
      if (c.fate != Fate::kSilent)
        to_coordinator(c.node, {kRound, SecAggStage::kAdvertise}, c.session->advertise());
    }
    pump();
  }

  // Delivers what the coordinator sent to the clients and what they answer, until quiet.
  void pump() {
    for (int pass = 0; pass < 100; ++pass) {
      while (!inbox.empty()) {
        Message m = std::move(inbox.front());
        inbox.pop_front();
        round->on_message(m, std::get<SecAgg>(m.envelope.body));
      }
      if (delivered == out.sent.size()) return;
      for (; delivered < out.sent.size(); ++delivered) deliver(out.sent[delivered]);
    }
    FAIL("the messages never settled");
  }

  void deliver(const testing::Sent& s) {
    if (const auto* err = std::get_if<transport::ErrorBody>(&s.envelope.body)) {
      refusals.push_back(err->message);
      return;
    }
    const auto& sa = std::get<SecAgg>(s.envelope.body);
    for (auto& c : clients) {
      if (s.peer != "peer:" + c.node) continue;
      const SecAggData d = transport::decode_secagg(s.payload);
      if (sa.stage == SecAggStage::kKeys && c.fate != Fate::kNoShares) {
        to_coordinator(c.node, {kRound, SecAggStage::kShares}, c.session->on_keys(d));
      } else if (sa.stage == SecAggStage::kForwarded) {
        c.session->on_forwarded(d);
      } else if (sa.stage == SecAggStage::kUnmask && c.fate != Fate::kNoUnmask) {
        to_coordinator(c.node, {kRound, SecAggStage::kUnmaskShares}, c.session->on_unmask(d));
      }
    }
  }

  // Every client that got its shares pushes its masked input to both shards (each its range).
  void push_inputs() {
    for (auto& c : clients) {
      if (c.fate == Fate::kNoInput || c.fate == Fate::kSilent || c.fate == Fate::kNoShares ||
          !c.session->masking())
        continue;
      const auto y = c.session->masked_input(c.update, 1000 + c.id);
      for (std::uint32_t i = 0; i < 2; ++i) REQUIRE(push(c, i, y) == "");
      complete.insert(c.node);
    }
  }

  // Pushes client c's masked words of shard i's range; the refusal, or "".
  std::string push(const Client& c, std::uint32_t i, const std::vector<std::uint32_t>& y) {
    const auto b = shards[i]->begin(), e = shards[i]->end();
    std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(y.data() + b),
                                 reinterpret_cast<const std::byte*>(y.data() + e));
    received[i].push_back(
        {y.begin() + static_cast<std::ptrdiff_t>(b), y.begin() + static_cast<std::ptrdiff_t>(e)});
    auto m = testing::message(c.node,
                              transport::Push{.shard = i,
                                              .begin = b,
                                              .end = e,
                                              .num_samples = 10,
                                              .encoding = transport::Encoding::kMaskedU32,
                                              .kind = transport::PushKind::kDelta,
                                              .elements = e - b},
                              kRound, ++seq);
    m.envelope.payload_bytes = bytes.size();
    m.payload = lend_bytes(bytes);
    REQUIRE(shards[i]->handle(m));
    const auto acks = shard_out[i].of<transport::PushAck>();
    REQUIRE(!acks.empty());
    return acks.back().second.accepted ? "" : acks.back().second.reason;
  }

  // Closes the round: the held stage, the unmasking (waiting out secagg.stage_ms when some
  // survivors never answer).
  void close() {
    round->close();
    pump();
    if (round->stage() == SecAggRound::Stage::kUnmask) {
      clock.advance(options[0].secagg.stage + std::chrono::milliseconds(1));
      round->tick();
      pump();
    }
  }

  // The mean the shards committed (new params less the old, both shards).
  std::vector<double> committed_mean() {
    std::vector<double> mean;
    for (std::uint32_t i = 0; i < 2; ++i) {
      const auto p = shards[i]->prepare_round(kRound);
      CAPTURE(p.reason);
      REQUIRE(p.ok);
      shards[i]->close_round(kRound, true);
      for (std::size_t j = 0; j < shards[i]->size(); ++j)
        mean.push_back(static_cast<double>(shards[i]->params()[j]) - start[i][j]);
    }
    return mean;
  }

  // The weighted mean of the updates of `who`, and the bound on its fixed-point error.
  std::pair<std::vector<double>, double> expected(const std::set<NodeId>& who) const {
    std::vector<double> sum(kSize, 0.0);
    double weight = 0;
    for (const auto& c : clients) {
      if (!who.contains(c.node)) continue;
      weight += c.weight;
      for (std::size_t j = 0; j < kSize; ++j) sum[j] += c.weight * c.update[j];
    }
    for (auto& v : sum) v /= weight;
    const auto& s = options[0].secagg;
    const double step = 2 * s.clip / s.levels;
    return {sum, static_cast<double>(who.size()) * step / weight + 1e-6};
  }

  ManualClock clock;
  Registries registries = builtin_registries();
  ServerOptions options[2];
  RecordingOutbox shard_out[2];
  std::unique_ptr<Shard> shards[2];
  std::vector<float> start[2];
  RecordingOutbox out;
  std::unique_ptr<SecAggRound> round;
  std::vector<Client> clients;
  std::deque<Message> inbox;
  std::deque<std::vector<std::byte>> payloads;
  std::vector<std::vector<std::uint32_t>> received[2];
  std::set<NodeId> complete;
  std::vector<std::string> refusals;
  std::size_t delivered = 0;
  std::uint64_t seq = 0;
};

void check_mean(Harness& h, const std::set<NodeId>& who) {
  const auto got = h.committed_mean();
  const auto [want, bound] = h.expected(who);
  double worst = 0;
  for (std::size_t j = 0; j < kSize; ++j) worst = std::max(worst, std::abs(got[j] - want[j]));
  MESSAGE("largest error of the unmasked mean: " << worst << " (bound " << bound << ")");
  CHECK(worst <= bound);
}

std::set<NodeId> with_input(const Harness& h) { return h.complete; }

TEST_CASE(
    "secure aggregation: the shards' sums unmask to the weighted mean; no shard ever holds "
    "an update in the clear") {
  Harness h(10);
  h.begin();
  REQUIRE(h.round->stage() == SecAggRound::Stage::kMasking);
  h.push_inputs();
  h.close();
  REQUIRE(h.round->stage() == SecAggRound::Stage::kDone);
  CHECK(h.round->survivors() == 10);
  CHECK(h.refusals.empty());
  // Every vector a shard received, read as one fixed-point input, is far from every client's
  // weighted update over that range (the masks are uniform over 2^32).
  const secagg::FixedPoint fp(h.options[0].secagg.clip, h.options[0].secagg.levels);
  for (std::uint32_t i = 0; i < 2; ++i) {
    REQUIRE(h.received[i].size() == 10);
    for (const auto& words : h.received[i]) {
      std::vector<float> as_input(words.size());
      fp.decode_sum(words, 1, as_input);
      for (const auto& c : h.clients) {
        double closest = 0;
        for (std::size_t j = 0; j < words.size(); ++j) {
          const double clear = c.weight * c.update[h.shards[i]->begin() + j];
          closest = std::max(closest, std::abs(as_input[j] - clear));
        }
        CHECK(closest > 100 * fp.step());
      }
    }
  }
  check_mean(h, with_input(h));
}

TEST_CASE(
    "secure aggregation: 30% dropping after their masked input, and one before it, still "
    "unmask exactly") {
  Harness h(10);
  for (int i : {0, 4, 7}) h.clients[static_cast<std::size_t>(i)].fate = Fate::kNoUnmask;
  h.clients[9].fate = Fate::kNoInput;
  h.begin();
  h.push_inputs();
  CHECK(h.complete.size() == 9);
  h.close();
  CAPTURE(h.round->failure());
  REQUIRE(h.round->stage() == SecAggRound::Stage::kDone);
  // The aggregate is the sum of every input the shards hold, those of the three silent
  // survivors included (their self masks rebuilt from the others' shares), and nothing of the
  // one that never sent one (its pairwise masks rebuilt and removed).
  CHECK(h.round->survivors() == 9);
  check_mean(h, with_input(h));
}

TEST_CASE("secure aggregation: dropouts at the key stages, within the threshold, are recovered") {
  // Two never advertise, one advertises but sends no shares, one shares but sends no input, one
  // sends its input but never unmasks: the stages wait out secagg.stage_ms for the missing, and
  // the aggregate is the weighted mean of the seven inputs held.
  Harness h(11);
  h.clients[1].fate = Fate::kSilent;
  h.clients[6].fate = Fate::kSilent;
  h.clients[3].fate = Fate::kNoShares;
  h.clients[8].fate = Fate::kNoInput;
  h.clients[10].fate = Fate::kNoUnmask;
  h.begin();
  for (int stage = 0; stage < 2 && h.round->stage() != SecAggRound::Stage::kMasking; ++stage) {
    h.clock.advance(h.options[0].secagg.stage + std::chrono::milliseconds(1));
    h.round->tick();
    h.pump();
  }
  REQUIRE(h.round->stage() == SecAggRound::Stage::kMasking);
  h.push_inputs();
  CHECK(h.complete.size() == 7);
  h.close();
  CAPTURE(h.round->failure());
  REQUIRE(h.round->stage() == SecAggRound::Stage::kDone);
  CHECK(h.round->survivors() == 7);
  check_mean(h, with_input(h));
}

TEST_CASE("secure aggregation: more dropouts than the threshold fail the round with the reason") {
  SUBCASE("too few advertise keys") {
    Harness h(10);
    for (std::size_t i = 0; i < 7; ++i) h.clients[i].fate = Fate::kSilent;
    h.begin();
    h.clock.advance(h.options[0].secagg.stage + std::chrono::milliseconds(1));
    h.round->tick();
    REQUIRE(h.round->stage() == SecAggRound::Stage::kFailed);
    CHECK(h.round->failure().find("3 of 10 clients advertised keys") != std::string::npos);
  }
  SUBCASE("too few survivors answer the unmasking") {
    Harness h(10);
    for (std::size_t i = 0; i < 6; ++i) h.clients[i].fate = Fate::kNoUnmask;
    h.begin();
    h.push_inputs();
    h.close();
    REQUIRE(h.round->stage() == SecAggRound::Stage::kFailed);
    CHECK(h.round->failure().find("fewer than the threshold") != std::string::npos);
    // Nothing was unmasked: the shards cannot prepare the round, so it is not committed.
    for (auto& s : h.shards) CHECK_FALSE(s->prepare_round(kRound).ok);
  }
}

TEST_CASE(
    "secure aggregation: malformed, replayed and wrong-round messages and a second masked "
    "input are refused without harm") {
  Harness h(10);
  h.begin();
  REQUIRE(h.round->stage() == SecAggRound::Stage::kMasking);
  const std::size_t before = h.refusals.size();
  // A replayed advertisement, shares for another round, garbage stage data, an unknown sender.
  h.to_coordinator("client-3", {kRound, SecAggStage::kAdvertise},
                   h.clients[3].session->advertise());
  h.to_coordinator("client-3", {kRound + 1, SecAggStage::kShares}, SecAggData{}, kRound + 1);
  auto garbage =
      testing::message("client-5", SecAgg{kRound, SecAggStage::kUnmaskShares}, kRound, 99);
  h.payloads.push_back(std::vector<std::byte>(24, std::byte{0x7f}));
  garbage.payload = lend_bytes(h.payloads.back());
  h.inbox.push_back(std::move(garbage));
  h.to_coordinator("client-42", {kRound, SecAggStage::kAdvertise}, SecAggData{});
  h.pump();
  CHECK(h.refusals.size() == before + 4);
  CHECK(h.round->stage() == SecAggRound::Stage::kMasking);
  h.push_inputs();
  // A second masked input from a client is refused by both shards; the first stands.
  const auto again = h.clients[1].session->masked_input(h.clients[1].update, 77);
  for (std::uint32_t i = 0; i < 2; ++i) {
    CHECK(h.push(h.clients[1], i, again).find("a second masked input") != std::string::npos);
  }
  h.close();
  REQUIRE(h.round->stage() == SecAggRound::Stage::kDone);
  // A client asked to unmask twice refuses the second time (two answers could reveal both of a
  // client's secrets).
  SecAggData ask;
  ask.survivors = {0, 1, 2};
  CHECK_THROWS_AS((void)h.clients[2].session->on_unmask(ask), ProtocolError);
  check_mean(h, with_input(h));
}

TEST_CASE("secure aggregation options: refused where they cannot run, named in the error") {
  using testing::validate_error;
  CHECK(validate_error({"server.secure_aggregation=secagg+", "aggregator.name=median"})
            .find("needs aggregator.name = fedavg") != std::string::npos);
  CHECK(validate_error({"server.secure_aggregation=secagg", "server.normalization=fednova"})
            .find("fednova") != std::string::npos);
  CHECK(validate_error({"server.secure_aggregation=secagg", "server.clients_per_round=2000"})
            .find("overflow the 32-bit sum") != std::string::npos);
  CHECK(validate_error({"server.secure_aggregation=maybe"}).find("none, secagg or secagg+") !=
        std::string::npos);
  CHECK(validate_error({"secagg.clip=4"}).find("applies with server.secure_aggregation") !=
        std::string::npos);
  CHECK(validate_error({"server.mode=fedbuff", "server.secure_aggregation=secagg"})
            .find("server.mode = federated") != std::string::npos);
  CHECK(validate_error({"server.secure_aggregation=secagg", "secagg.degree=5"})
            .find("secagg+ only") != std::string::npos);
  CHECK(validate_error({"server.secure_aggregation=secagg+", "server.clients_per_round=10"}) == "");
}

}  // namespace
}  // namespace cohort::server
