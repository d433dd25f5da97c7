#include "cohort/aggregation/secure_aggregation.h"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using namespace cohort::aggregation::secagg;
using cohort::ClientId;
using cohort::aggregation::testing::TestRng;

TEST_CASE("X25519 agreement is symmetric and bound to its context; masks are a keystream") {
  const auto a = generate_key_pair(), b = generate_key_pair();
  CHECK(public_key_of(a.private_key) == a.public_key);
  CHECK(agree(a.private_key, b.public_key, "mask round=1") ==
        agree(b.private_key, a.public_key, "mask round=1"));
  CHECK(agree(a.private_key, b.public_key, "mask round=1") !=
        agree(a.private_key, b.public_key, "mask round=2"));
  Key zero{};  // a low-order point: refused
  CHECK_THROWS_AS((void)agree(a.private_key, zero, "x"), cohort::ProtocolError);

  const Key seed = agree(a.private_key, b.public_key, "prg");
  std::vector<std::uint32_t> m1(10000), m2(10000);
  expand_mask(seed, m1);
  expand_mask(seed, m2);
  CHECK(m1 == m2);
  std::vector<std::uint32_t> y(10000, 5);
  add_mask(seed, +1, y);
  for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == static_cast<std::uint32_t>(5 + m1[i]));
  add_mask(seed, -1, y);
  CHECK(y == std::vector<std::uint32_t>(10000, 5));
}

TEST_CASE("fixed point: sums decode within n c / Q; the modulus bounds the number of inputs") {
  FixedPoint fp;  // c = 8, Q = 2^22
  CHECK(fp.max_summands() == 1023);
  TestRng rng(2);
  const std::size_t n = 7, d = 256;
  std::vector<std::uint32_t> sum(d, 0), q(d);
  std::vector<double> plain(d, 0);
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<float> x(d);
    for (auto& v : x) v = rng.between(-9, 9);  // some beyond the clip range
    fp.encode(x, q);
    for (std::size_t j = 0; j < d; ++j) {
      sum[j] += q[j];
      plain[j] += std::clamp(static_cast<double>(x[j]), -8.0, 8.0);
    }
  }
  std::vector<float> out(d);
  fp.decode_sum(sum, n, out);
  for (std::size_t j = 0; j < d; ++j)
    CHECK(std::fabs(out[j] - plain[j]) <= n * 8.0 / (1 << 22) + 1e-5);
  CHECK_THROWS_AS(fp.decode_sum(sum, 1024, out), cohort::ConfigError);
}

namespace {

struct Round {
  Params params;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::vector<std::uint32_t>> inputs;
};

Round make_round(std::size_t n, std::size_t t, std::size_t d, std::uint64_t round) {
  Round r;
  r.params = {round, t, d};
  TestRng rng(round);
  for (std::size_t i = 0; i < n; ++i) {
    r.clients.push_back(std::make_unique<Client>(static_cast<ClientId>(10 * i + 3), r.params));
    std::vector<std::uint32_t> x(d);
    for (auto& v : x) v = static_cast<std::uint32_t>(rng.next());
    r.inputs.push_back(std::move(x));
  }
  return r;
}

// Runs R0-R4. Clients in `no_shares` vanish before R1 (in U1, not U2); clients in `drop_after`
// send their shares and mask, but their y never arrives (in U2, not U3). Returns z and fills
// `expected` with the plain sum of the survivors.
std::vector<std::uint32_t> run_protocol(Round& r, std::vector<ClientId> no_shares,
                                        std::vector<ClientId> drop_after,
                                        std::vector<std::uint32_t>& expected) {
  auto in = [](const std::vector<ClientId>& v, ClientId c) {
    return std::find(v.begin(), v.end(), c) != v.end();
  };
  std::vector<Advertisement> u1;
  for (auto& c : r.clients) u1.push_back(c->advertise());
  std::vector<SealedShares> routed;
  std::vector<Advertisement> u2;
  for (auto& c : r.clients) {
    if (in(no_shares, c->id())) continue;
    auto sealed = c->share_keys(u1);
    routed.insert(routed.end(), sealed.begin(), sealed.end());
    u2.push_back(c->advertise());
  }
  std::map<ClientId, std::vector<std::uint32_t>> masked;
  expected.assign(r.params.vector_size, 0);
  for (std::size_t i = 0; i < r.clients.size(); ++i) {
    auto& c = r.clients[i];
    if (in(no_shares, c->id())) continue;
    std::vector<SealedShares> mine;  // the server forwards only shares from U2 members
    for (const auto& s : routed) {
      if (s.to == c->id()) mine.push_back(s);
    }
    auto y = c->masked_input(r.inputs[i], mine);
    if (in(drop_after, c->id())) continue;  // y lost: dropped after masking
    masked[c->id()] = std::move(y);
    for (std::size_t j = 0; j < expected.size(); ++j) expected[j] += r.inputs[i][j];
  }
  std::vector<ClientId> u3;
  for (const auto& [id, y] : masked) u3.push_back(id);
  std::vector<UnmaskingShares> responses;
  for (auto& c : r.clients) {
    if (masked.contains(c->id())) responses.push_back(c->unmask(u3));
  }
  return unmask_sum(r.params, u2, masked, responses);
}

}  // namespace

TEST_CASE("secure aggregation: the sum equals the plain sum exactly, no dropouts") {
  auto r = make_round(5, 3, 1000, 1);
  std::vector<std::uint32_t> expected;
  CHECK(run_protocol(r, {}, {}, expected) == expected);
}

TEST_CASE("secure aggregation: one of five clients drops after masking; sum of the other four") {
  auto r = make_round(5, 3, 1000, 2);
  std::vector<std::uint32_t> expected;
  const auto z = run_protocol(r, {}, {r.clients[2]->id()}, expected);
  CHECK(z == expected);
}

TEST_CASE("secure aggregation: drops before sharing and after masking in one round") {
  auto r = make_round(6, 3, 257, 3);
  std::vector<std::uint32_t> expected;
  const auto z =
      run_protocol(r, {r.clients[5]->id()}, {r.clients[0]->id(), r.clients[3]->id()}, expected);
  CHECK(z == expected);
}

TEST_CASE("secure aggregation of float updates through fixed point: within n c/Q of the sum") {
  const std::size_t n = 5, d = 300;
  Params params{9, 3, d};
  FixedPoint fp;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::vector<float>> x(n, std::vector<float>(d));
  TestRng rng(4);
  for (std::size_t i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<Client>(static_cast<ClientId>(i), params));
    for (auto& v : x[i]) v = static_cast<float>(rng.normal());
  }
  std::vector<Advertisement> u1;
  for (auto& c : clients) u1.push_back(c->advertise());
  std::vector<SealedShares> routed;
  for (auto& c : clients) {
    auto s = c->share_keys(u1);
    routed.insert(routed.end(), s.begin(), s.end());
  }
  std::map<ClientId, std::vector<std::uint32_t>> masked;
  std::vector<double> plain(d, 0);
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<SealedShares> mine;
    for (const auto& s : routed) {
      if (s.to == clients[i]->id()) mine.push_back(s);
    }
    std::vector<std::uint32_t> q(d);
    fp.encode(x[i], q);
    auto y = clients[i]->masked_input(q, mine);
    if (i == 4) continue;  // client 4 drops after masking
    masked[clients[i]->id()] = y;
    for (std::size_t j = 0; j < d; ++j) plain[j] += x[i][j];
  }
  const std::vector<ClientId> u3{0, 1, 2, 3};
  std::vector<UnmaskingShares> responses;
  for (ClientId id : u3) responses.push_back(clients[id]->unmask(u3));
  const auto z = unmask_sum(params, u1, masked, responses);
  std::vector<float> sum(d);
  fp.decode_sum(z, 4, sum);
  for (std::size_t j = 0; j < d; ++j)
    CHECK(std::fabs(sum[j] - plain[j]) <= 4 * 8.0 / (1 << 22) + 1e-5);
}

TEST_CASE("a masked update alone shows no correlation with its plaintext") {
  // x: a structured input (a ramp plus a sine); y = x + masks mod 2^32 from one client.
  // If the masks are uniform and independent of x, T = sum_i (x_i - mean x)(y_i - 2^31) is a sum
  // of independent zero-mean terms, term i within a range of |x_i - mean x| 2^32, so by Hoeffding
  // P(|T| >= c 2^32 ||x - mean x||) <= 2 exp(-2 c^2) = 1e-6 at c = 2.69. Without masks the
  // normalised T would be about sqrt(d / 12) = 91 here; we require below 2.69.
  const std::size_t d = 100000;
  Params params{5, 2, d};
  Client a(1, params), b(2, params);
  std::vector<Advertisement> u1{a.advertise(), b.advertise()};
  auto sa = a.share_keys(u1);
  auto sb = b.share_keys(u1);
  std::vector<std::uint32_t> x(d);
  for (std::size_t i = 0; i < d; ++i) {
    x[i] = static_cast<std::uint32_t>(i * 40000 + 1e9 * (1 + std::sin(i * 0.001)));
  }
  const auto y = a.masked_input(x, sb);
  double mean = 0;
  for (auto v : x) mean += v / static_cast<double>(d);
  double t = 0, norm2 = 0;
  for (std::size_t i = 0; i < d; ++i) {
    const double dx = x[i] - mean;
    t += dx * (static_cast<double>(y[i]) - 2147483648.0);
    norm2 += dx * dx;
  }
  CHECK(std::fabs(t) / (4294967296.0 * std::sqrt(norm2)) <= 2.69);
  CHECK(y != x);
}

TEST_CASE("secure aggregation refuses bad rounds") {
  auto r = make_round(4, 3, 16, 7);
  std::vector<Advertisement> u1;
  for (auto& c : r.clients) u1.push_back(c->advertise());
  // U1 below the threshold.
  CHECK_THROWS_AS((void)r.clients[0]->share_keys(std::span(u1).first(2)), cohort::ProtocolError);
  auto s0 = r.clients[0]->share_keys(u1);
  auto s1 = r.clients[1]->share_keys(u1);
  auto s2 = r.clients[2]->share_keys(u1);
  std::vector<SealedShares> to3;
  for (auto* v : {&s0, &s1, &s2}) {
    for (const auto& s : *v) {
      if (s.to == r.clients[3]->id()) to3.push_back(s);
    }
  }
  auto tampered = to3;
  tampered[0].ciphertext[5] ^= 1;
  auto c3 = r.clients[3].get();
  (void)c3->share_keys(u1);
  CHECK_THROWS_AS((void)c3->masked_input(r.inputs[3], tampered), cohort::ProtocolError);

  auto fresh = make_round(4, 3, 16, 8);
  std::vector<std::uint32_t> expected;
  std::vector<Advertisement> v1;
  for (auto& c : fresh.clients) v1.push_back(c->advertise());
  std::vector<SealedShares> routed;
  for (auto& c : fresh.clients) {
    auto s = c->share_keys(v1);
    routed.insert(routed.end(), s.begin(), s.end());
  }
  std::map<ClientId, std::vector<std::uint32_t>> masked;
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<SealedShares> mine;
    for (const auto& s : routed) {
      if (s.to == fresh.clients[i]->id()) mine.push_back(s);
    }
    masked[fresh.clients[i]->id()] = fresh.clients[i]->masked_input(fresh.inputs[i], mine);
  }
  const ClientId i0 = fresh.clients[0]->id(), i1 = fresh.clients[1]->id(),
                 i2 = fresh.clients[2]->id(), i3 = fresh.clients[3]->id();
  const std::vector<ClientId> too_few{i0, i1};
  CHECK_THROWS_AS((void)fresh.clients[0]->unmask(too_few), cohort::ProtocolError);
  const std::vector<ClientId> without0{i1, i2, i3};
  // A client declared dropped reveals nothing (it would otherwise give away both shares).
  CHECK_THROWS_AS((void)fresh.clients[0]->unmask(without0), cohort::ProtocolError);
  const std::vector<ClientId> outsider{i0, i1, i2, 999};
  CHECK_THROWS_AS((void)fresh.clients[0]->unmask(outsider), cohort::ProtocolError);
  // Too few responses to reconstruct.
  const std::vector<ClientId> all{i0, i1, i2, i3};
  std::vector<UnmaskingShares> two{fresh.clients[0]->unmask(all), fresh.clients[1]->unmask(all)};
  CHECK_THROWS_AS((void)unmask_sum(fresh.params, v1, masked, two), cohort::ProtocolError);
  two.push_back(fresh.clients[2]->unmask(all));
  std::vector<std::uint32_t> plain(16, 0);
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 16; ++j) plain[j] += fresh.inputs[i][j];
  }
  CHECK(unmask_sum(fresh.params, v1, masked, two) == plain);  // t = 3 responses suffice
}
