// FedNova's normalised averaging on a federated shard (docs/ALGORITHMS.md 1.7, eq. 1.20-1.23),
// driven directly: messages in, a recording outbox out, no sockets.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cohort/aggregation/compressor.h"
#include "cohort/aggregation/privacy.h"
#include "cohort/aggregation/push_codec.h"
#include "cohort/client/push_encoding.h"
#include "cohort/core/error.h"

#include "options.h"
#include "shard.h"
#include "test_util.h"

namespace cohort::server {
namespace {

using testing::RecordingOutbox;
using transport::PushAck;

constexpr std::uint64_t kModelSize = 6;  // mlp:2-2

struct Fixture {
  explicit Fixture(std::vector<std::string> overrides)
      : options(testing::make_options(std::move(overrides))),
        registries(builtin_registries()),
        shard(options, registries, out, nullptr) {
    shard.setup("mlp:2-2", kModelSize);
  }
  // A dense delta push of the whole range with n_i = `samples` and a_i = `work`.
  transport::Push delta(std::uint64_t samples, float work) const {
    return transport::Push{.shard = 0,
                           .begin = shard.begin(),
                           .end = shard.end(),
                           .num_samples = samples,
                           .kind = transport::PushKind::kDelta,
                           .elements = shard.size(),
                           .local_work = work};
  }
  // Pushes `values` densely in one message for `round` and returns the ack.
  PushAck push(const NodeId& sender, std::uint64_t round, std::uint64_t samples, float work,
               std::vector<float> values) {
    auto m = testing::push_all(sender, delta(samples, work), round, ++seq, values);
    REQUIRE(shard.handle(m));
    return last_ack(sender);
  }
  // Prepares and commits `round`.
  void commit(std::uint64_t round) {
    const auto p = shard.prepare_round(round);
    REQUIRE_MESSAGE(p.ok, p.reason);
    const std::uint64_t version = shard.version();
    REQUIRE(shard.close_round(round, true) == version + 1);
  }
  PushAck last_ack(const NodeId& sender) const {
    const auto acks = out.of<PushAck>();
    for (auto it = acks.rbegin(); it != acks.rend(); ++it) {
      if (it->first.peer == "peer:" + sender) return it->second;
    }
    FAIL("no PushAck to " << sender);
    return {};
  }
  std::vector<float> params() const { return {shard.params().begin(), shard.params().end()}; }

  ServerOptions options;
  Registries registries;
  RecordingOutbox out;
  Shard shard;
  std::uint64_t seq = 0;
};

// The distance from v to the next float away from zero.
float ulp(float v) {
  const float a = std::fabs(v);
  return std::nextafter(a, std::numeric_limits<float>::infinity()) - a;
}

// ---- (a) equal local work: FedAvg's step ---------------------------------------------------

TEST_CASE("FedNova: with equal local work every round steps exactly as FedAvg does") {
  // Three clients of unequal n_i, each with the same a_i, over three rounds.
  const std::uint64_t samples[] = {3, 7, 10};
  auto update = [](std::size_t client, std::uint64_t round) {
    std::vector<float> u(kModelSize);
    for (std::size_t j = 0; j < kModelSize; ++j)
      u[j] = 0.1f * static_cast<float>(client + 1) * std::sin(static_cast<float>(round + 3 * j));
    return u;
  };
  for (const float a : {4.0f, 3.0f}) {
    INFO("a_i = " << a);
    Fixture avg({"server.mode=federated"});
    Fixture nova({"server.mode=federated", "server.normalization=fednova"});
    for (std::uint64_t round = 1; round <= 3; ++round) {
      for (Fixture* f : {&avg, &nova}) {
        f->shard.open_round(round, {"c0", "c1", "c2"});
        for (std::size_t c = 0; c < 3; ++c) {
          const auto ack = f->push("c" + std::to_string(c), round, samples[c], a, update(c, round));
          REQUIRE(ack.accepted);
        }
      }
      const auto before = avg.params();
      avg.commit(round);
      nova.commit(round);
      const auto want = avg.params(), got = nova.params();
      REQUIRE(want != before);  // the round moved the model
      if (a == 4.0f) {
        // a = 4 is a power of two: w_i = n_i / 4, sum_i w_i Delta_i and 1 / sum_i w_i are FedAvg's
        // values scaled by exact powers of two, and the rescale (S/4)(4S)/S^2 is exactly 1, so
        // every operation rounds as FedAvg's did: bit for bit (tolerance 0).
        CHECK(got == want);
      } else {
        // a = 3: n_i / 3 rounds in double, so the fp64 mean differs from FedAvg's by a few
        // units of 2^-53 relative, which can move its rounding to fp32 by at most one ulp of the
        // delta; the rescale (1 within a few 2^-53) cannot move an fp32 value. x + delta then
        // differs by at most ulp(delta) + ulp(x + delta): two ulps of the largest magnitude.
        for (std::size_t j = 0; j < kModelSize; ++j) {
          const float delta = want[j] - before[j];
          const float tol =
              2 * ulp(std::max({std::fabs(before[j]), std::fabs(want[j]), std::fabs(delta)}));
          CHECK(std::fabs(got[j] - want[j]) <= tol);
        }
      }
    }
  }
}

// ---- (b) the paper's quadratic example ------------------------------------------------------

// Two clients with F_i(x) = 1/2 ||x - c_i||^2, equal n_i, tau_1 = 1 and tau_2 = 10 local SGD
// steps at rate eta, run for `rounds` rounds through a shard with server.normalization =
// `normalization` (sgd, lr 1). The clients' SGD runs here, in double, from the shard's model.
std::vector<float> run_quadratics(const std::string& normalization, const std::vector<double>& c1,
                                  const std::vector<double>& c2, double eta, int rounds) {
  Fixture f({"server.mode=federated", "server.normalization=" + normalization});
  const int tau[] = {1, 10};
  const std::vector<double>* centre[] = {&c1, &c2};
  for (int r = 1; r <= rounds; ++r) {
    const auto round = static_cast<std::uint64_t>(r);
    f.shard.open_round(round, {"c1", "c2"});
    const auto x = f.params();
    for (int i = 0; i < 2; ++i) {
      std::vector<double> y(x.begin(), x.end());
      for (int step = 0; step < tau[i]; ++step) {
        for (std::size_t j = 0; j < kModelSize; ++j) y[j] -= eta * (y[j] - (*centre[i])[j]);
      }
      std::vector<float> delta(kModelSize);
      for (std::size_t j = 0; j < kModelSize; ++j) delta[j] = static_cast<float>(y[j] - x[j]);
      const auto ack = f.push(i == 0 ? "c1" : "c2", round, 100, static_cast<float>(tau[i]), delta);
      REQUIRE(ack.accepted);
    }
    f.commit(round);
    f.out.sent.clear();  // the acks of this round are read already
  }
  return f.params();
}

TEST_CASE(
    "FedNova: on two quadratics with 1 and 10 local steps it converges to the true optimum, "
    "plain averaging to a point biased toward the client with more steps") {
  const double eta = 1e-3;
  const int rounds = 5000;
  std::vector<double> c1(kModelSize), c2(kModelSize);
  for (std::size_t j = 0; j < kModelSize; ++j) {
    c1[j] = -1.0 + 0.1 * static_cast<double>(j);
    c2[j] = 1.0 - 0.05 * static_cast<double>(j);
  }
  // tau local steps on F_i map x to c_i + (1 - eta)^tau (x - c_i): Delta_i = alpha_i (c_i - x),
  // alpha_i = 1 - (1 - eta)^tau_i. Plain averaging (equal n_i) steps by mean_i alpha_i (c_i - x):
  // its fixed point is (alpha_1 c_1 + alpha_2 c_2) / (alpha_1 + alpha_2) (weight 0.909 on c_2
  // here) and its error contracts by rho = 1 - (alpha_1 + alpha_2) / 2 per round. FedNova steps
  // by tau_eff mean_i (alpha_i / tau_i)(c_i - x), tau_eff = 5.5: fixed point
  // (beta_1 c_1 + beta_2 c_2) / (beta_1 + beta_2), beta_i = alpha_i / tau_i, and
  // rho = 1 - tau_eff (beta_1 + beta_2) / 2.
  const double alpha[] = {1 - std::pow(1 - eta, 1), 1 - std::pow(1 - eta, 10)};
  const double beta[] = {alpha[0] / 1, alpha[1] / 10};
  const double rho_avg = 1 - (alpha[0] + alpha[1]) / 2;
  const double rho_nova = 1 - 5.5 * (beta[0] + beta[1]) / 2;
  // The error left after `rounds` from the start x0 (rho^rounds times the first error), plus
  // what fp32 rounding keeps: each round rounds x + step to fp32 (half an ulp: at most 2^-23
  // while |x| < 4; the clients' deltas and the mean round far below that, relative to steps
  // under 0.02, so u = 2^-22 covers all) and an error with e_{t+1} <= rho e_t + u settles
  // below u / (1 - rho). With eta = 1e-3: about 4.4e-5 for both rules.
  const double u = std::ldexp(1.0, -22);
  const auto x0 = Fixture({"server.mode=federated"}).params();  // every fixture starts there
  double start = 0;  // the largest first error, to either fixed point (both lie in [c_1, c_2])
  for (std::size_t j = 0; j < kModelSize; ++j) {
    REQUIRE(std::fabs(x0[j]) < 4);  // x stays within [-4, 4]: between x0 and [c_1, c_2]
    start = std::max({start, std::fabs(x0[j] - c1[j]), std::fabs(x0[j] - c2[j])});
  }
  const double tol_avg = start * std::pow(rho_avg, rounds) + u / (1 - rho_avg);
  const double tol_nova = start * std::pow(rho_nova, rounds) + u / (1 - rho_nova);
  // FedNova's fixed point is not exactly the midpoint: beta_1 = eta, and
  // beta_2 = (1 - (1 - eta)^10) / 10 lies in [eta (1 - 4.5 eta), eta] (the binomial series
  // alternates), so its weight on c_2, beta_2 / (beta_1 + beta_2), is within
  // 4.5 eta / (2 (2 - 4.5 eta)) <= 1.13 eta of 1/2: within 1.13 eta |c_2 - c_1| of the midpoint.
  const double bias = 1.13 * eta;

  const auto avg = run_quadratics("none", c1, c2, eta, rounds);
  const auto nova = run_quadratics("fednova", c1, c2, eta, rounds);
  for (std::size_t j = 0; j < kModelSize; ++j) {
    INFO("coordinate " << j);
    const double mid = (c1[j] + c2[j]) / 2, gap = c2[j] - c1[j];
    const double fixed_avg = (alpha[0] * c1[j] + alpha[1] * c2[j]) / (alpha[0] + alpha[1]);
    const double fixed_nova = (beta[0] * c1[j] + beta[1] * c2[j]) / (beta[0] + beta[1]);
    CHECK(std::fabs(avg[j] - fixed_avg) <= tol_avg);
    CHECK(avg[j] - mid >= 0.4 * gap);  // biased toward c_2 by 0.409 of the gap
    CHECK(std::fabs(nova[j] - fixed_nova) <= tol_nova);
    CHECK(std::fabs(nova[j] - mid) <= bias * gap + tol_nova);
  }
}

// ---- (c) compressed pushes ------------------------------------------------------------------

// Lends `bytes` as a received payload.
PooledBuffer lend_bytes(std::span<std::byte> bytes) {
  return PooledBuffer::wrap(
      bytes.data(), bytes.size(), [](void*) noexcept {}, nullptr);
}

TEST_CASE("FedNova: compressed pushes are decoded, then weighted, as dense ones are") {
  const auto builtins = builtin_registries();
  struct Case {
    const char* name;
    ConfigSection options;
  };
  const Case cases[] = {
      {"fp16", ConfigSection("compressor", {})},
      {"topk", ConfigSection("compressor", {{"k_fraction", 0.5}, {"error_feedback", false}})},
  };
  // Multiples of 1/64 below 4: exact in fp16, so fp16 decodes them unchanged.
  const std::vector<float> u1 = {0.5f, -1.25f, 0.015625f, 2.0f, -0.75f, 3.5f};
  const std::vector<float> u2 = {-0.25f, 0.125f, 1.5f, -3.0f, 0.0625f, 1.0f};
  const std::uint64_t n[] = {10, 30};
  const float a[] = {2.0f, 5.0f};
  for (const auto& c : cases) {
    INFO("compressor " << std::string(c.name));
    Fixture coded({"server.mode=federated", "server.normalization=fednova"});
    Fixture dense({"server.mode=federated", "server.normalization=fednova"});
    const auto before = coded.params();
    const auto compressor = builtins.compressors.create(c.name, c.options);
    coded.shard.open_round(1, {"a", "b"});
    dense.shard.open_round(1, {"a", "b"});
    std::vector<float> decoded[2];
    for (int i = 0; i < 2; ++i) {
      const NodeId who = i == 0 ? "a" : "b";
      aggregation::PushEncoder encoder(*compressor, kModelSize);
      std::vector<std::byte> bytes;
      encoder.encode(i == 0 ? u1 : u2, 1, bytes);
      // What the shard should take: the payload decoded on its own.
      decoded[i].assign(kModelSize, 0.0f);
      aggregation::PushDecoder decoder;
      decoder.reset(kModelSize, encoder.format());
      std::vector<float> scratch;
      REQUIRE(decoder.feed(bytes, scratch, [&](std::size_t at, std::span<const float> v) {
        std::copy(v.begin(), v.end(), decoded[i].begin() + static_cast<std::ptrdiff_t>(at));
        return true;
      }));
      decoder.finish();
      // The encoded push, in two chunks (the first cuts the piece's header).
      auto push = coded.delta(n[i], a[i]);
      push.encoding = client::push_encoding(encoder.format());
      const std::size_t cut = 5;
      for (int part = 0; part < 2; ++part) {
        auto m = testing::message(who, push, 1, 100 + i);
        m.envelope.payload_bytes = bytes.size();
        m.offset = part == 0 ? 0 : cut;
        auto piece = part == 0 ? std::span(bytes).first(cut) : std::span(bytes).subspan(cut);
        m.payload = lend_bytes(piece);
        m.complete = part == 1;
        REQUIRE(coded.shard.handle(m));
      }
      CHECK(coded.last_ack(who).accepted);
      CHECK(dense.push(who, 1, n[i], a[i], decoded[i]).accepted);
    }
    coded.commit(1);
    dense.commit(1);
    // The same values with the same weights, summed in the same order: bit for bit.
    CHECK(coded.params() == dense.params());
    if (std::string(c.name) == "fp16") {
      CHECK(decoded[0] == u1);
      CHECK(decoded[1] == u2);
    }
    // And the step is FedNova's: tau_eff sum_i p_i Delta_i / a_i, p = (1/4, 3/4),
    // tau_eff = (2 + 15) / 4 (fp32 rounding of the mean and the sum: 1e-6 relative is ample).
    const auto after = coded.params();
    for (std::size_t j = 0; j < kModelSize; ++j) {
      const double step = 4.25 * (0.25 * decoded[0][j] / 2.0 + 0.75 * decoded[1][j] / 5.0);
      CHECK(after[j] == doctest::Approx(before[j] + step).epsilon(1e-6));
    }
  }
}

// ---- (d) DP: clip after normalisation -------------------------------------------------------

TEST_CASE("FedNova under DP clips the normalised update, then scales the noised mean by tau_eff") {
  Fixture f({"server.mode=federated", "server.normalization=fednova", "dp.clip=1",
             "dp.noise_multiplier=0.5", "dp.seed=7"});
  const auto before = f.params();
  // Unit vectors u and v; Delta_1 = 3u with a_1 = 1, Delta_2 = 5v with a_2 = 10.
  std::vector<float> uv(kModelSize), vv(kModelSize);
  for (std::size_t j = 0; j < kModelSize; ++j) {
    uv[j] = j < 3 ? 1.0f / std::sqrt(3.0f) : 0.0f;
    vv[j] = j % 2 == 0 ? 1.0f / std::sqrt(3.0f) : -1.0f / std::sqrt(3.0f);
  }
  std::vector<float> d1(kModelSize), d2(kModelSize);
  for (std::size_t j = 0; j < kModelSize; ++j) {
    d1[j] = 3.0f * uv[j];
    d2[j] = 5.0f * vv[j];
  }
  f.shard.open_round(1, {"a", "b"});
  REQUIRE(f.push("a", 1, 50, 1.0f, d1).accepted);
  REQUIRE(f.push("b", 1, 50, 10.0f, d2).accepted);
  f.commit(1);
  // Normalised first: 3u / 1 has norm 3, clipped to u; 5v / 10 = 0.5v has norm 0.5, kept.
  // Unweighted mean (u + 0.5v) / 2, noise N(0, (z S / m)^2) = N(0, 0.25^2) from the shard's
  // seed, then tau_eff = mean a_i = 5.5. (Clipping before dividing would give (u + 0.1v) / 2.)
  std::vector<float> noise(kModelSize, 0.0f);
  aggregation::add_gaussian_noise(noise, 0.25, aggregation::compression_seed(7, 1, 0));
  const auto after = f.params();
  for (std::size_t j = 0; j < kModelSize; ++j) {
    const double mean = (uv[j] + 0.5 * vv[j]) / 2;
    const double clip_first = (uv[j] + 0.1 * vv[j]) / 2;
    const double want = before[j] + 5.5 * (mean + noise[j]);
    // A handful of fp32 roundings of values below 4 (clip, mean, noise, scale, the step):
    // 1e-5 absolute is some 30 ulps of them, and far below the 0.1 that clipping first moves
    // a coordinate by.
    CHECK(std::fabs(after[j] - want) <= 1e-5);
    CHECK(std::fabs(5.5 * (mean - clip_first)) > 0.1);
  }
}

// ---- (e) refusals ---------------------------------------------------------------------------

TEST_CASE("FedNova: a push without a usable local work is refused and the round goes on") {
  Fixture f({"server.mode=federated", "server.normalization=fednova"});
  const auto before = f.params();
  const std::vector<float> update(kModelSize, 0.5f);
  f.shard.open_round(1, {"none", "negative", "nan", "inf", "good"});
  const std::string prefix =
      "server.normalization = fednova needs each push's local work a_i > 0 "
      "and finite, got ";
  CHECK(f.push("none", 1, 10, 0.0f, update).reason == prefix + "0 (not given)");
  CHECK(f.push("negative", 1, 10, -2.0f, update).reason == prefix + "-2");
  const auto nan = f.push("nan", 1, 10, std::nanf(""), update);
  CHECK_FALSE(nan.accepted);
  CHECK(nan.reason.starts_with(prefix));
  const auto inf = f.push("inf", 1, 10, std::numeric_limits<float>::infinity(), update);
  CHECK_FALSE(inf.accepted);
  CHECK(inf.reason == prefix + "inf");
  CHECK(f.push("good", 1, 16, 8.0f, update).accepted);
  f.commit(1);
  // One update: weight 16/8 = 2, R = 2 Delta / 2 = Delta and the rescale (16/8)(16*8)/16^2 = 1,
  // all exact in binary: the model moves by exactly Delta.
  const auto after = f.params();
  for (std::size_t j = 0; j < kModelSize; ++j) CHECK(after[j] == before[j] + 0.5f);

  SUBCASE("without FedNova a push need not carry its local work") {
    Fixture plain({"server.mode=federated"});
    plain.shard.open_round(1, {"a"});
    CHECK(plain.push("a", 1, 10, 0.0f, update).accepted);
  }
}

TEST_CASE("server.normalization: start-up refuses what it cannot honour, naming the keys") {
  CHECK(testing::validate_error({"server.normalization=fednova"}).empty());
  CHECK(testing::validate_error({"server.normalization=fednova", "dp.clip=1"}).empty());
  CHECK(testing::validate_error({"server.normalization=none", "aggregator.name=median"}).empty());
  for (const std::vector<std::string>& rule :
       {std::vector<std::string>{"aggregator.name=median"},
        std::vector<std::string>{"aggregator.name=trimmed_mean"},
        std::vector<std::string>{"aggregator.name=norm_clip", "aggregator.bound=1"}}) {
    auto overrides = rule;
    overrides.emplace_back("server.normalization=fednova");
    const std::string why = testing::validate_error(overrides);
    INFO(why);
    CHECK(why.find("server.normalization = fednova") != std::string::npos);
    CHECK(why.find("aggregator.name = fedavg") != std::string::npos);
  }
  CHECK(testing::validate_error({"server.normalization=fedprox"}) ==
        "server.normalization must be none or fednova, got 'fedprox'");
  CHECK(testing::validate_error({"server.mode=fedbuff", "server.normalization=fednova"}) ==
        "server.normalization applies to server.mode = federated only, not fedbuff");
  CHECK(testing::validate_error({"server.mode=dataparallel", "server.normalization=none"}) ==
        "server.normalization applies to server.mode = federated only, not dataparallel");
  // And the edge parses it into the enum.
  CHECK(testing::make_options({"server.normalization=fednova"}).normalization ==
        Normalization::kFedNova);
  CHECK(testing::make_options({}).normalization == Normalization::kNone);
}

}  // namespace
}  // namespace cohort::server
