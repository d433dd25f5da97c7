// A simulated population (population.h) registers in bulk: the coordinator's cohorts, evaluators
// and RoundStarts are those of the same clients registered one Register each, and its pool's
// sampling is the list sampler's, draw for draw. No sockets.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>

#include "coordinator.h"
#include "population_pool.h"
#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using testing::RecordingOutbox;
using transport::RoundStart;

constexpr std::uint64_t kModelSize = 6;  // mlp:2-2
const std::string kRouting = "fleet-connection";

// `count` members of 100 samples, every 7th absent.
std::shared_ptr<VirtualPopulation> population(std::uint32_t count) {
  auto p = std::make_shared<VirtualPopulation>();
  p->count = count;
  p->width = VirtualPopulation::width_for(count);
  p->absent.resize(count);
  for (std::uint32_t i = 0; i < count; ++i) p->absent[i] = i % 7 == 3;
  p->size_all = 100;
  return p;
}

// As a multiplexed ROUTER hands it over: the peer names the member on the fleet's connection.
transport::Message from(const NodeId& id, transport::Body body, std::uint64_t round = 0,
                        std::uint64_t seq = 1) {
  auto m = testing::message(id, std::move(body), round, seq);
  m.peer = transport::multiplexed_peer(std::string("x") + '\0' + kRouting, id);
  return m;
}

struct Federation {
  Federation(std::vector<std::string> overrides, std::shared_ptr<const VirtualPopulation> members)
      : options(testing::make_options(std::move(overrides))),
        registries(builtin_registries()),
        metrics(""),
        shard(options, registries, out, nullptr) {
    shard.setup("mlp:2-2", kModelSize);
    coordinator.emplace(options, shard, out, clock, "coordinator", "inproc://test", metrics,
                        std::move(members));
  }
  void deliver(transport::Message m) {
    if (shard.handle(m)) return;
    REQUIRE(coordinator->handle(m));
  }
  void register_client(const NodeId& id) {
    deliver(from(id, transport::Register{.role = transport::Role::kClient, .dataset_size = 100}));
  }
  void train(const NodeId& id, std::uint64_t round) {
    std::vector<float> update(shard.size(), 0.5f);
    auto [push, report] =
        testing::trained_round(id, round, seq, shard.begin(), shard.end(), update);
    deliver(std::move(push));
    report.peer = from(id, transport::Heartbeat{}).peer;
    deliver(std::move(report));
  }
  // Who each RoundStart sent since `from_index` went to, and whether it asked for an evaluation.
  std::vector<std::pair<std::string, bool>> starts_since(std::size_t from_index) const {
    std::vector<std::pair<std::string, bool>> names;
    for (std::size_t i = from_index; i < out.sent.size(); ++i) {
      const auto* rs = std::get_if<RoundStart>(&out.sent[i].envelope.body);
      if (rs == nullptr) continue;
      names.emplace_back(out.sent[i].peer, rs->evaluate_only);
    }
    return names;
  }

  ServerOptions options;
  Registries registries;
  RecordingOutbox out;
  ManualClock clock;
  MetricsSink metrics;
  Shard shard;
  std::optional<Coordinator> coordinator;
  std::uint64_t seq = 100;
};

// Runs `rounds` rounds in both federations, every selected client training, and checks that
// both send the same RoundStarts (training and evaluation) to the same peers.
void check_same_rounds(const std::vector<std::string>& overrides, std::uint32_t count,
                       std::uint64_t rounds) {
  const auto members = population(count);
  std::vector<std::string> with_min = overrides;
  std::uint32_t present = 0;
  for (std::uint32_t i = 0; i < count; ++i) present += members->present(i) ? 1 : 0;
  // Both start with everyone registered; the gone members (below) leave the pool.
  with_min.push_back("server.min_clients=" + std::to_string(present / 2));
  Federation bulk(with_min, members);
  Federation each(with_min, nullptr);
  // Members whose connections are gone: their first RoundStart fails, in both, and they leave
  // the pool.
  for (std::uint32_t i = 5; i < count; i += 10) {
    const auto gone =
        transport::multiplexed_peer(std::string("x") + '\0' + kRouting, members->name(i));
    bulk.out.gone.insert(gone);
    each.out.gone.insert(gone);
  }

  bulk.register_client(members->name(0));
  for (std::uint32_t i = 0; i < count; ++i) {
    if (members->present(i)) each.register_client(members->name(i));
  }
  REQUIRE(bulk.out.count<RoundStart>() == 0);        // no tick yet
  CHECK(bulk.out.count<transport::Welcome>() == 1);  // the knocker's, only
  CHECK(each.out.count<transport::Welcome>() == present);
  std::size_t seen_bulk = bulk.out.sent.size(), seen_each = each.out.sent.size();
  std::size_t evaluations = 0, gone_selected = 0;
  for (std::uint64_t r = 1; r <= rounds; ++r) {
    CAPTURE(r);
    bulk.coordinator->tick();
    each.coordinator->tick();
    const auto a = bulk.starts_since(seen_bulk);
    const auto b = each.starts_since(seen_each);
    REQUIRE(a == b);
    seen_bulk = bulk.out.sent.size();
    seen_each = each.out.sent.size();
    for (const auto& [peer, eval] : a) {
      const auto name = peer.substr(0, peer.find('\0'));
      if (eval) {
        ++evaluations;
        continue;
      }
      if (bulk.out.gone.contains(peer)) {
        ++gone_selected;
        continue;
      }
      bulk.train(name, r);
      each.train(name, r);
    }
    bulk.clock.advance(10ms);
    each.clock.advance(10ms);
  }
  bulk.coordinator->tick();
  each.coordinator->tick();
  CHECK(bulk.starts_since(seen_bulk) == each.starts_since(seen_each));
  CHECK(bulk.shard.version() == each.shard.version());
  CHECK(bulk.shard.version() == rounds);
  CHECK(evaluations > 0);
  CHECK(gone_selected > 0);
  MESSAGE("evaluations " << evaluations << ", gone members selected " << gone_selected);
}

TEST_CASE("population: one Register admits every present member; cohorts as with one each") {
  const std::vector<std::string> common{
      "server.mode=federated",          "server.rounds=12",    "server.clients_per_round=10",
      "server.min_updates=1",           "server.eval_every=3", "server.round_deadline_ms=1000",
      "server.client_timeout_ms=600000"};
  SUBCASE("uniform selection") { check_same_rounds(common, 1000, 12); }
  SUBCASE("speed-aware selection") {
    auto o = common;
    o.push_back("server.selection=speed_aware");
    check_same_rounds(o, 300, 12);
  }
  SUBCASE("over-selection") {
    auto o = common;
    o.push_back("server.overselect=1.5");
    check_same_rounds(o, 200, 12);
  }
}

TEST_CASE("population: weighted selection, a stranger refused, a member that leaves and returns") {
  const auto members = population(50);
  Federation f({"server.mode=federated", "server.rounds=100", "server.clients_per_round=5",
                "server.min_updates=1", "server.selection=weighted", "server.min_clients=41",
                "server.round_deadline_ms=1000"},
               members);
  f.deliver(from("someone", transport::Register{.role = transport::Role::kClient}));
  REQUIRE(f.out.count<transport::ErrorBody>() == 1);
  CHECK(f.out.of<transport::ErrorBody>()[0].second.message.find("not one of its members") !=
        std::string::npos);
  f.register_client(members->name(3));  // absent: refused too
  CHECK(f.out.count<transport::ErrorBody>() == 2);
  f.coordinator->tick();
  CHECK(f.out.count<RoundStart>() == 0);  // nobody registered yet
  f.register_client(members->name(1));    // 42 present members
  // c00000 leaves: it is never selected, until it registers again.
  f.deliver(from(members->name(0), transport::Bye{"leaving"}));
  std::size_t seen = f.out.sent.size();
  f.coordinator->tick();
  REQUIRE(f.out.count<RoundStart>() == 5);  // 41 of min_clients = 41: round 1 started
  std::map<std::string, int> picked;
  for (std::uint64_t r = 1; r <= 40; ++r) {
    for (const auto& [peer, eval] : f.starts_since(seen)) {
      picked[peer.substr(0, peer.find('\0'))]++;
      f.train(peer.substr(0, peer.find('\0')), r);
    }
    seen = f.out.sent.size();
    f.coordinator->tick();
  }
  CHECK(picked.size() > 30);
  CHECK_FALSE(picked.contains(members->name(0)));
  CHECK_FALSE(picked.contains(members->name(3)));
  f.register_client(members->name(0));
  std::size_t back = 0;
  for (std::uint64_t r = 41; r <= 100 && back == 0; ++r) {
    for (const auto& [peer, eval] : f.starts_since(seen)) {
      back += peer.substr(0, peer.find('\0')) == members->name(0) ? 1 : 0;
      f.train(peer.substr(0, peer.find('\0')), r);
    }
    seen = f.out.sent.size();
    f.coordinator->tick();
  }
  CHECK(back == 1);
}

TEST_CASE("population pool: uniform draws equal the list sampler's; weights pick by size") {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    VirtualPopulation p;
    p.count = 64 + static_cast<std::uint32_t>(seed % 50);
    p.absent.resize(p.count);
    std::mt19937_64 setup(seed);
    for (std::uint32_t i = 0; i < p.count; ++i) p.absent[i] = setup() % 5 == 0;
    PopulationPool pool(p, false);
    std::vector<std::uint32_t> list;  // the reference: the live members, in order
    for (std::uint32_t i = 0; i < p.count; ++i) {
      if (!p.present(i)) continue;
      if (setup() % 6 == 0) {
        pool.set_live(i, false);
      } else {
        list.push_back(i);
      }
    }
    REQUIRE(pool.live() == list.size());
    const std::size_t want = std::min<std::size_t>(list.size(), 1 + seed % 20);
    std::mt19937_64 a(seed * 31 + 7), b(seed * 31 + 7);
    const auto drawn = pool.sample(want, false, a);
    std::vector<std::uint32_t> expected;
    for (std::size_t k = 0; k < want; ++k) {
      const auto pick = std::uniform_int_distribution<std::size_t>(0, list.size() - 1)(b);
      expected.push_back(list[pick]);
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    CHECK(drawn == expected);
    CHECK(pool.live() == list.size() + want);  // put back
  }
  VirtualPopulation p;
  p.count = 4;
  p.sizes = {100, 300, 0, 600};  // a size of 0 weighs as 1
  PopulationPool pool(p, true);
  std::mt19937_64 rng(5);
  std::vector<int> first(4);
  for (int t = 0; t < 20000; ++t) ++first[pool.sample(1, true, rng)[0]];
  CHECK(first[1] > 2 * first[0]);
  CHECK(first[3] > first[1]);
  CHECK(first[2] < 40);
  CHECK(pool.sample(4, true, rng).size() == 4);  // without replacement: all of them
  pool.set_present(1, false);
  for (int t = 0; t < 200; ++t) CHECK_FALSE(pool.sample(3, true, rng).empty());
  CHECK(pool.present() == 3);
  CHECK(pool.kth_present(1) == 2);
}

TEST_CASE("population names: zero-padded, parsed back, strangers rejected") {
  VirtualPopulation p;
  p.count = 1000000;
  p.width = VirtualPopulation::width_for(p.count);
  CHECK(p.width == 6);
  CHECK(VirtualPopulation::width_for(100) == 5);
  CHECK(p.name(42) == "c000042");
  CHECK(p.index_of("c000042") == 42u);
  CHECK_FALSE(p.index_of("c42").has_value());
  CHECK_FALSE(p.index_of("c1000000").has_value());
  CHECK_FALSE(p.index_of("x000042").has_value());
}

}  // namespace
}  // namespace cohort::server
