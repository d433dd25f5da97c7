// SecAgg+ neighbourhoods, unmasking by range and the ranged mask generator
// (docs/ALGORITHMS.md 8.1, 8.2).
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include "../test_util.h"
#include "cohort/aggregation/secure_aggregation.h"
#include "cohort/core/error.h"

using namespace cohort::aggregation::secagg;
using cohort::ClientId;
using cohort::aggregation::testing::TestRng;

namespace {

Key key_of(std::uint8_t tag) {
  Key k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint8_t>(tag * 31 + i);
  return k;
}

// what() of the ProtocolError `f` throws; fails the test if it throws nothing or something else.
template <typename F>
std::string protocol_error_of(F&& f) {
  try {
    f();
  } catch (const cohort::ProtocolError& e) {
    return e.what();
  } catch (...) {
    FAIL("threw something other than a ProtocolError");
  }
  FAIL("threw nothing");
  return {};
}

std::vector<ClientId> cohort_ids(std::size_t n) {
  std::vector<ClientId> ids;
  for (std::size_t i = 0; i < n; ++i) ids.push_back(static_cast<ClientId>(7 * i + 2));
  return ids;
}

// One SecAgg+ round driven like the server would: R0-R2, then the survivors' R4 responses.
struct PlusRound {
  Params params;
  std::vector<ClientId> u1;
  std::vector<std::unique_ptr<Client>> clients;  // in u1 order
  std::vector<std::vector<std::uint32_t>> inputs;
  std::vector<Advertisement> u2;
  std::map<ClientId, std::vector<std::uint32_t>> masked;  // y of every survivor
  std::vector<std::uint32_t> expected;                    // the survivors' plain sum
  std::map<ClientId, std::size_t> sealed_sent;            // sealed shares each client sent
};

// degree 0: default_degree(n); threshold 0: default_threshold(min(degree, n)).
PlusRound make_plus_round(std::size_t n, std::size_t d, std::uint64_t round, std::size_t degree = 0,
                          std::size_t threshold = 0) {
  PlusRound r;
  const std::size_t k = degree == 0 ? default_degree(n) : degree;
  r.params = {.round = round,
              .threshold = threshold == 0 ? default_threshold(std::min(k, n)) : threshold,
              .vector_size = d,
              .degree = k,
              .graph_seed = key_of(static_cast<std::uint8_t>(round))};
  r.u1 = cohort_ids(n);
  TestRng rng(round);
  for (ClientId id : r.u1) {
    r.clients.push_back(std::make_unique<Client>(id, r.params));
    std::vector<std::uint32_t> x(d);
    for (auto& v : x) v = static_cast<std::uint32_t>(rng.next());
    r.inputs.push_back(std::move(x));
  }
  return r;
}

// R0-R2 for every client; those in `drop_after` mask, but their y never arrives.
void share_and_mask(PlusRound& r, const std::set<ClientId>& drop_after) {
  std::vector<Advertisement> u1;
  for (auto& c : r.clients) u1.push_back(c->advertise());
  std::vector<SealedShares> routed;
  for (auto& c : r.clients) {
    auto sealed = c->share_keys(u1);
    r.sealed_sent[c->id()] = sealed.size();
    routed.insert(routed.end(), sealed.begin(), sealed.end());
    r.u2.push_back(c->advertise());
  }
  r.expected.assign(r.params.vector_size, 0);
  for (std::size_t i = 0; i < r.clients.size(); ++i) {
    auto& c = r.clients[i];
    std::vector<SealedShares> mine;
    for (const auto& s : routed) {
      if (s.to == c->id()) mine.push_back(s);
    }
    auto y = c->masked_input(r.inputs[i], mine);
    if (drop_after.contains(c->id())) continue;
    r.masked[c->id()] = std::move(y);
    for (std::size_t j = 0; j < r.expected.size(); ++j) r.expected[j] += r.inputs[i][j];
  }
}

std::vector<ClientId> survivors_of(const PlusRound& r) {
  std::vector<ClientId> u3;
  for (const auto& [id, y] : r.masked) u3.push_back(id);
  return u3;
}

// R4 responses of every survivor but the `silent` ones.
std::vector<UnmaskingShares> responses_of(PlusRound& r, const std::set<ClientId>& silent = {}) {
  const auto u3 = survivors_of(r);
  std::vector<UnmaskingShares> out;
  for (auto& c : r.clients) {
    if (r.masked.contains(c->id()) && !silent.contains(c->id())) out.push_back(c->unmask(u3));
  }
  return out;
}

// The ids at the given ring positions (mod n).
std::set<ClientId> at_positions(const std::vector<ClientId>& ring, std::initializer_list<int> ps) {
  std::set<ClientId> out;
  const int n = static_cast<int>(ring.size());
  for (int p : ps) out.insert(ring[static_cast<std::size_t>(((p % n) + n) % n)]);
  return out;
}

}  // namespace

TEST_CASE("the ranged mask generator equals the slice of the whole keystream") {
  const Key seed = key_of(3);
  std::vector<std::uint32_t> whole(20000);
  expand_mask(seed, whole);
  for (std::size_t first : {0, 1, 2, 3, 5, 7, 4095, 4097, 9999, 15001}) {
    for (std::size_t len : {0, 1, 3, 5, 7, 4099, 4999}) {
      CAPTURE(first);
      CAPTURE(len);
      std::vector<std::uint32_t> part(len);
      expand_mask(seed, first, part);
      REQUIRE(std::equal(part.begin(), part.end(), whole.begin() + first));
      std::vector<std::uint32_t> y(len, 11);
      add_mask(seed, -1, first, y);
      for (std::size_t i = 0; i < len; ++i) {
        REQUIRE(y[i] == static_cast<std::uint32_t>(11 - whole[first + i]));
      }
      add_mask(seed, +1, first, y);
      REQUIRE(y == std::vector<std::uint32_t>(len, 11));
    }
  }
  // Beyond 2^32 AES blocks: the skip inside the block still lines up with the block start.
  const std::size_t far = (std::size_t{1} << 36) + 4;
  std::vector<std::uint32_t> block(8), tail(5);
  expand_mask(seed, far, block);
  expand_mask(seed, far + 3, tail);
  CHECK(std::equal(tail.begin(), tail.end(), block.begin() + 3));
  CHECK(block != std::vector<std::uint32_t>(whole.begin(), whole.begin() + 8));
}

TEST_CASE("default degree: 2 ceil(log2 n) + 1, n when that reaches n; threshold a majority") {
  CHECK(default_degree(1) == 1);
  CHECK(default_degree(2) == 2);  // complete graph
  CHECK(default_degree(7) == 7);
  CHECK(default_degree(8) == 7);
  CHECK(default_degree(50) == 13);
  CHECK(default_degree(1000) == 21);
  CHECK(default_degree(1025) == 23);
  CHECK(default_degree(std::size_t{1} << 20) == 41);
  CHECK_THROWS_AS((void)default_degree(0), cohort::ConfigError);
  CHECK(default_threshold(13) == 7);
  CHECK(default_threshold(21) == 11);
  CHECK(default_threshold(4) == 3);
  CHECK(default_threshold(2) == 2);
  CHECK(default_threshold(13, 0.75) == 10);
  CHECK(default_threshold(3, 0.99) == 3);  // capped at k
  CHECK_THROWS_AS((void)default_threshold(13, 0.4), cohort::ConfigError);
  CHECK_THROWS_AS((void)default_threshold(13, 1.0), cohort::ConfigError);
  CHECK_THROWS_AS((void)default_threshold(1), cohort::ConfigError);
}

TEST_CASE("the neighbour graph is a symmetric ring, k - 1 neighbours each, fixed by its seed") {
  const auto ids = cohort_ids(50);
  const std::size_t k = default_degree(ids.size());
  const auto graph = neighbourhoods(ids, k, key_of(1));
  const auto ring = neighbour_ring(ids, key_of(1));
  REQUIRE(graph.size() == ids.size());
  auto sorted_ring = ring;
  std::sort(sorted_ring.begin(), sorted_ring.end());
  CHECK(sorted_ring == ids);  // a permutation of U1
  CHECK(ring != ids);         // and not the identity
  for (std::size_t p = 0; p < ring.size(); ++p) {
    const auto& mine = graph.at(ring[p]);
    REQUIRE(mine.size() == k - 1);  // k counts the client itself
    CHECK(std::is_sorted(mine.begin(), mine.end()));
    CHECK(std::find(mine.begin(), mine.end(), ring[p]) == mine.end());
    std::vector<ClientId> window;  // ring positions p - 6 .. p + 6 but p
    for (std::size_t j = 1; j <= k / 2; ++j) {
      window.push_back(ring[(p + j) % ring.size()]);
      window.push_back(ring[(p + ring.size() - j) % ring.size()]);
    }
    std::sort(window.begin(), window.end());
    CHECK(mine == window);
    for (ClientId v : mine) {
      const auto& theirs = graph.at(v);
      CHECK(std::binary_search(theirs.begin(), theirs.end(), ring[p]));  // symmetric
    }
  }
  // Deterministic for a seed, whatever order U1 comes in; another seed, another graph.
  auto reversed = ids;
  std::reverse(reversed.begin(), reversed.end());
  CHECK(neighbourhoods(reversed, k, key_of(1)) == graph);
  CHECK(neighbour_ring(reversed, key_of(1)) == ring);
  CHECK(neighbourhoods(ids, k, key_of(2)) != graph);
  // k >= n: everyone neighbours everyone.
  for (std::size_t big : {std::size_t{50}, std::size_t{51}, std::size_t{99}}) {
    const auto all = neighbourhoods(ids, big, key_of(1));
    for (const auto& [id, ns] : all) REQUIRE(ns.size() == ids.size() - 1);
  }
  CHECK_THROWS_AS((void)neighbourhoods(ids, 12, key_of(1)), cohort::ConfigError);  // even, < n
  CHECK_THROWS_AS((void)neighbourhoods(ids, 0, key_of(1)), cohort::ConfigError);
  const std::vector<ClientId> twice{1, 2, 2};
  CHECK_THROWS_AS((void)neighbour_ring(twice, key_of(1)), cohort::ProtocolError);
}

TEST_CASE("SecAgg+ with 50 clients and the default degree, no dropouts: the exact sum") {
  auto r = make_plus_round(50, 300, 11);
  REQUIRE(r.params.degree == 13);
  REQUIRE(r.params.threshold == 7);
  share_and_mask(r, {});
  for (const auto& [id, n] : r.sealed_sent) CHECK(n == 12);  // to its neighbours only
  const auto responses = responses_of(r);
  for (const auto& resp : responses) {
    CHECK(resp.self_mask.size() == 13);  // b_v shares of itself and its 12 neighbours
    CHECK(resp.mask_key.empty());
  }
  CHECK(unmask_sum(r.params, r.u1, r.u2, r.masked, responses) == r.expected);
  // The plain-SecAgg overload cannot draw the graph, so it refuses a SecAgg+ round.
  CHECK_THROWS_AS((void)unmask_sum(r.params, r.u2, r.masked, responses), cohort::ConfigError);
}

TEST_CASE("SecAgg+: 30% of the cohort drop after masking; the exact sum of the survivors") {
  auto r = make_plus_round(50, 300, 12);
  const auto ring = neighbour_ring(r.u1, r.params.graph_seed);
  std::set<ClientId> dropped;  // 15 of 50, spread over the ring: positions 1, 4, 7 mod 10
  for (std::size_t p = 0; p < ring.size(); ++p) {
    if (p % 10 == 1 || p % 10 == 4 || p % 10 == 7) dropped.insert(ring[p]);
  }
  REQUIRE(dropped.size() == 15);
  // Precondition, so the case tests what it says: every reconstruction has >= t holders left.
  const auto graph = neighbourhoods(r.u1, r.params.degree, r.params.graph_seed);
  std::size_t pairs = 0;
  for (const auto& [v, ns] : graph) {
    const auto alive = static_cast<std::size_t>(
        std::count_if(ns.begin(), ns.end(), [&](ClientId u) { return !dropped.contains(u); }));
    REQUIRE(alive + (dropped.contains(v) ? 0 : 1) >= r.params.threshold);
    if (dropped.contains(v)) pairs += alive;
  }
  share_and_mask(r, dropped);
  REQUIRE(r.masked.size() == 35);
  auto responses = responses_of(r);
  CHECK(unmask_sum(r.params, r.u1, r.u2, r.masked, responses) == r.expected);

  // A responder that is no neighbour of a client holds no share of its secrets: what it claims to
  // reveal for one (here put first, so it would be used) is ignored.
  const ClientId v = *dropped.begin();
  const auto& vn = graph.at(v);
  auto w = std::find_if(responses.begin(), responses.end(), [&](const UnmaskingShares& u) {
    return !std::binary_search(vn.begin(), vn.end(), u.from);
  });
  REQUIRE(w != responses.end());
  Share bogus = w->self_mask.at(0).second;  // at w's own evaluation point
  for (auto& limb : bogus.y) limb = (limb + 12345) % kShamirPrime;
  w->mask_key.insert(w->mask_key.begin(), {v, bogus});
  for (ClientId u : r.u1) {
    const auto& un = graph.at(u);
    if (r.masked.contains(u) && u != w->from &&
        !std::binary_search(un.begin(), un.end(), w->from)) {
      w->self_mask.insert(w->self_mask.begin(), {u, bogus});
    }
  }
  std::rotate(responses.begin(), w, w + 1);
  CHECK(unmask_sum(r.params, r.u1, r.u2, r.masked, responses) == r.expected);

  // What was rebuilt: b_u per survivor, and s_uv only for neighbouring (survivor, dropped) pairs.
  const auto rec = reconstruct(r.params, r.u1, r.u2, survivors_of(r), responses);
  CHECK(rec.survivors == survivors_of(r));
  CHECK(rec.self_seeds.size() == 35);
  CHECK(rec.pair_seeds.size() == pairs);
  for (const auto& p : rec.pair_seeds) {
    CHECK(dropped.contains(p.dropped));
    CHECK(r.masked.contains(p.survivor));
    const auto& ns = graph.at(p.dropped);
    CHECK(std::binary_search(ns.begin(), ns.end(), p.survivor));
    CHECK(p.sign == (p.survivor < p.dropped ? 1 : -1));
  }
}

TEST_CASE("SecAgg+: drops beyond the threshold around one client are refused, naming it") {
  // v at ring position 0 drops after masking with six of its twelve neighbours (positions
  // +-2, +-4, +-6): six holders of v's key are left, one short of t = 7, while every other
  // reconstruction keeps >= 7 (survivor 1 keeps exactly 7: 13 minus 0, +-2, +-4, 6).
  auto r = make_plus_round(50, 64, 13);
  REQUIRE(r.params.threshold == 7);
  const auto ring = neighbour_ring(r.u1, r.params.graph_seed);
  const auto dropped = at_positions(ring, {0, 2, -2, 4, -4, 6, -6});
  share_and_mask(r, dropped);
  const auto responses = responses_of(r);  // every survivor still has >= t holders alive
  const auto reason =
      protocol_error_of([&] { (void)unmask_sum(r.params, r.u1, r.u2, r.masked, responses); });
  CHECK(reason.find("mask key of client " + std::to_string(ring[0])) != std::string::npos);
  CHECK(reason.find("fewer than the threshold 7") != std::string::npos);
  CHECK_THROWS_AS((void)reconstruct(r.params, r.u1, r.u2, survivors_of(r), responses),
                  cohort::ProtocolError);

  // A survivor that would be left with fewer than t holders alive refuses to reveal anything:
  // position 1 loses position 3 as well.
  auto u3 = survivors_of(r);
  u3.erase(std::find(u3.begin(), u3.end(), ring[3]));
  Client& one = *r.clients[static_cast<std::size_t>(std::find(r.u1.begin(), r.u1.end(), ring[1]) -
                                                    r.u1.begin())];
  const auto refusal = protocol_error_of([&] { (void)one.unmask(u3); });
  CHECK(refusal.find("client " + std::to_string(ring[1])) != std::string::npos);

  // Missing R4 responses count too: with v's key holders all present but one survivor silent,
  // that survivor's own b_u still rebuilds from its neighbours, and the sum is exact.
  auto ok = make_plus_round(50, 64, 14);
  const auto ring2 = neighbour_ring(ok.u1, ok.params.graph_seed);
  share_and_mask(ok, at_positions(ring2, {0, 2, -2, 4, -4, 6}));  // v keeps exactly 7 holders
  CHECK(unmask_sum(ok.params, ok.u1, ok.u2, ok.masked, responses_of(ok)) == ok.expected);
  const auto silent = at_positions(ring2, {20});
  CHECK(unmask_sum(ok.params, ok.u1, ok.u2, ok.masked, responses_of(ok, silent)) == ok.expected);
  // Seven silent survivors at positions 17, 19, .., 29 leave only position 23 (whose window is
  // 17..29) with six holders: named.
  const auto seven = at_positions(ring2, {17, 19, 21, 23, 25, 27, 29});
  const auto short_b = protocol_error_of(
      [&] { (void)unmask_sum(ok.params, ok.u1, ok.u2, ok.masked, responses_of(ok, seven)); });
  CHECK(short_b.find("self-mask seed of client " + std::to_string(ring2[23])) != std::string::npos);
}

TEST_CASE("unmasking by range: three uneven ranges concatenated equal the whole vector") {
  const std::size_t d = 1001;
  auto r = make_plus_round(20, d, 15);
  const auto ring = neighbour_ring(r.u1, r.params.graph_seed);
  share_and_mask(r, at_positions(ring, {0, 7, 13}));
  const auto responses = responses_of(r);
  const auto whole = unmask_sum(r.params, r.u1, r.u2, r.masked, responses);
  REQUIRE(whole == r.expected);
  const Reconstructed rec = reconstruct(r.params, r.u1, r.u2, survivors_of(r), responses);
  REQUIRE(!rec.pair_seeds.empty());
  // Each "shard" sums only its range of the survivors' y and removes only that range's masks.
  const std::vector<std::pair<std::size_t, std::size_t>> ranges{{0, 1}, {1, 518}, {518, 1001}};
  std::vector<std::uint32_t> joined;
  for (const auto& [lo, hi] : ranges) {
    std::vector<std::uint32_t> part(hi - lo, 0);
    for (const auto& [u, y] : r.masked) {
      for (std::size_t i = lo; i < hi; ++i) part[i - lo] += y[i];
    }
    remove_masks(rec, lo, part);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  CHECK(joined == whole);
}

TEST_CASE("a client masks by range exactly the slices of its whole masked input") {
  const std::size_t d = 1001;
  auto a = make_plus_round(9, d, 16, 5);
  std::vector<Advertisement> u1;
  for (auto& c : a.clients) u1.push_back(c->advertise());
  std::vector<SealedShares> routed;
  for (auto& c : a.clients) {
    auto s = c->share_keys(u1);
    routed.insert(routed.end(), s.begin(), s.end());
  }
  std::vector<SealedShares> to0, to1;
  for (const auto& s : routed) {
    if (s.to == a.u1[0]) to0.push_back(s);
    if (s.to == a.u1[1]) to1.push_back(s);
  }
  const auto y = a.clients[0]->masked_input(a.inputs[0], to0);
  CHECK(y != a.inputs[0]);
  for (const auto& [lo, hi] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, 3}, {3, 500}, {500, 1001}, {333, 334}}) {
    std::vector<std::uint32_t> part(a.inputs[0].begin() + lo, a.inputs[0].begin() + hi);
    a.clients[0]->mask_range(lo, part);
    CHECK(std::equal(part.begin(), part.end(), y.begin() + lo));
  }
  // open_shares() + mask_range() is masked_input() split in two.
  a.clients[1]->open_shares(to1);
  std::vector<std::uint32_t> y1 = a.inputs[1];
  a.clients[1]->mask_range(0, y1);
  CHECK(y1 != a.inputs[1]);
  std::vector<std::uint32_t> tail(a.inputs[1].begin() + 17, a.inputs[1].end());
  a.clients[1]->mask_range(17, tail);
  CHECK(std::equal(tail.begin(), tail.end(), y1.begin() + 17));
}

TEST_CASE("a share sealed for round r is refused in round r + 1, even under the same keys") {
  const KeyPair ca = generate_key_pair(), ma = generate_key_pair();
  const KeyPair cb = generate_key_pair(), mb = generate_key_pair();
  auto pair_for = [&](std::uint64_t round) {
    const Params params{.round = round, .threshold = 2, .vector_size = 4};
    auto a = std::make_unique<Client>(1, params), b = std::make_unique<Client>(2, params);
    a->set_keys_for_testing(ca, ma);
    b->set_keys_for_testing(cb, mb);
    return std::pair(std::move(a), std::move(b));
  };
  auto [a5, b5] = pair_for(5);
  auto [a6, b6] = pair_for(6);
  const std::vector<Advertisement> u1{a5->advertise(), b5->advertise()};
  CHECK(u1[0].channel_public == a6->advertise().channel_public);  // the same keys
  const auto sealed5 = a5->share_keys(u1);
  REQUIRE(sealed5.size() == 1);
  (void)b6->share_keys(u1);
  const std::vector<std::uint32_t> x{1, 2, 3, 4};
  const auto reason = protocol_error_of([&] { (void)b6->masked_input(x, sealed5); });
  CHECK(reason.find("authentication") != std::string::npos);
  (void)b5->share_keys(u1);
  CHECK(b5->masked_input(x, sealed5).size() == 4);  // the same shares open in their own round
}

TEST_CASE("SecAgg+ refuses shares from a non-neighbour; a degree >= n is plain SecAgg") {
  auto r = make_plus_round(20, 8, 17, 5);
  std::vector<Advertisement> u1;
  for (auto& c : r.clients) u1.push_back(c->advertise());
  auto from0 = r.clients[0]->share_keys(u1);
  REQUIRE(from0.size() == 4);
  const auto graph = neighbourhoods(r.u1, 5, r.params.graph_seed);
  const auto& ns = graph.at(r.u1[0]);
  std::size_t stranger = 1;
  while (std::binary_search(ns.begin(), ns.end(), r.u1[stranger])) ++stranger;
  (void)r.clients[stranger]->share_keys(u1);
  auto forged = from0[0];
  forged.to = r.u1[stranger];
  const auto reason = protocol_error_of([&] {
    (void)r.clients[stranger]->masked_input(r.inputs[stranger], {&forged, 1});
  });
  CHECK(reason.find("not a neighbour") != std::string::npos);

  // Degree 7 over 6 clients: every other member is a neighbour, one drop, the exact sum.
  auto full = make_plus_round(6, 40, 18, 7, 3);
  share_and_mask(full, {full.u1[4]});
  for (const auto& [id, n] : full.sealed_sent) CHECK(n == 5);
  CHECK(unmask_sum(full.params, full.u1, full.u2, full.masked, responses_of(full)) ==
        full.expected);
  // Degree 0 and the plain overload give the same.
  auto plain = make_plus_round(6, 40, 19, 7, 3);
  plain.params.degree = 0;
  plain.clients.clear();
  for (ClientId id : plain.u1) plain.clients.push_back(std::make_unique<Client>(id, plain.params));
  share_and_mask(plain, {plain.u1[1]});
  for (const auto& [id, n] : plain.sealed_sent) CHECK(n == 5);
  CHECK(unmask_sum(plain.params, plain.u2, plain.masked, responses_of(plain)) == plain.expected);
  const Params above_degree{.round = 1, .threshold = 7, .vector_size = 1, .degree = 5};
  CHECK_THROWS_AS(Client(1, above_degree), cohort::ConfigError);
}
