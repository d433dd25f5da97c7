#include "cohort/aggregation/decentralized.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <limits>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {
namespace {

using Models = std::vector<std::vector<float>>;
// grad(rank, step, x, out): the gradient node `rank` sees at step `step`.
using GradFn = std::function<void(Rank, std::uint64_t, std::span<const float>, std::span<float>)>;

void zero_grad(Rank, std::uint64_t, std::span<const float>, std::span<float> g) {
  std::fill(g.begin(), g.end(), 0.0f);
}

struct Run {
  std::vector<Models> history;  // history[t][rank]: eval_point after step t (t = 0: initial)
  std::vector<std::uint64_t> bytes_sent;
};

// n nodes on threads over an in-memory network, each with its own optimizer from `name`.
Run run(const Topology& topo, Rank n, const std::string& name, const ConfigSection& options,
        std::shared_ptr<const Compressor> q, const Models& x0, std::uint64_t steps, float lr,
        const GradFn& grad = zero_grad, std::optional<std::pair<Rank, std::uint64_t>> kill = {}) {
  DecentralizedOptimizerRegistry registry;
  add_builtin_decentralized_optimizers(registry);
  InMemoryNetwork net(n);
  Run out;
  out.history.assign(steps + 1, Models(n));
  std::vector<std::string> errors(n);
  {
    std::vector<std::jthread> threads;
    for (Rank r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          auto opt = registry.create(name, options, q);
          GossipOptions go;
          go.timeout = std::chrono::milliseconds(kill ? 300 : 60000);
          Gossip gossip(net.comm(r), topo, go);
          std::vector<float> x = x0[r], g(x.size());
          auto z = opt->eval_point(x);
          out.history[0][r].assign(z.begin(), z.end());
          for (std::uint64_t t = 0; t < steps; ++t) {
            if (kill && kill->first == r && kill->second == t) {
              net.kill(r);
              return;
            }
            grad(r, t, opt->eval_point(x), g);
            opt->step(t, x, g, lr, gossip);
            auto e = opt->eval_point(x);
            out.history[t + 1][r].assign(e.begin(), e.end());
          }
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
  }
  for (Rank r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[r].empty(), errors[r]);
  for (Rank r = 0; r < n; ++r) out.bytes_sent.push_back(net.comm(r).bytes_sent());
  return out;
}

Models random_models(Rank n, std::size_t d, std::uint64_t seed, double offset = 0) {
  SplitMixRng rng(seed);
  Models x(n, std::vector<float>(d));
  for (auto& m : x) {
    for (float& v : m) v = static_cast<float>(offset + rng.normal());
  }
  return x;
}

std::unique_ptr<Topology> topology(std::string_view name) {
  TopologyRegistry registry;
  add_builtin_topologies(registry);
  return registry.create(name, {});
}

double norm(const Models& x) {
  double s = 0;
  for (const auto& m : x) {
    for (float v : m) s += static_cast<double>(v) * v;
  }
  return std::sqrt(s);
}

std::vector<double> mean(const Models& x) {
  std::vector<double> m(x[0].size(), 0.0);
  for (const auto& v : x) {
    for (std::size_t k = 0; k < v.size(); ++k) m[k] += v[k];
  }
  for (double& v : m) v /= static_cast<double>(x.size());
  return m;
}

TEST_CASE("registry: built-in names, unknown names and options, choco needs a compressor") {
  DecentralizedOptimizerRegistry registry;
  add_builtin_decentralized_optimizers(registry);
  CHECK(registry.names() ==
        "choco, dpsgd, dsgdm, dsgdm_n, push_sum, qg_dsgdm, qg_dsgdm_n, ring_allreduce, sgp");
  CHECK_THROWS_AS((void)registry.create("adam", {}), ConfigError);
  CHECK_THROWS_AS((void)registry.create("choco", {}), ConfigError);
  CHECK_THROWS_AS((void)registry.create("dsgdm", ConfigSection("d", {{"momentum", 1.5}})),
                  ConfigError);
  CHECK_THROWS_AS((void)registry.create("dpsgd", ConfigSection("d", {{"lr", 0.1}})), ConfigError);
}

TEST_CASE("gossip averaging (D-PSGD, zero gradients) shrinks the consensus distance by (1-rho)^t") {
  const Rank n = 16;
  const std::uint64_t steps = 300;
  auto ring = topology("ring");
  const double rho = spectral_gap(ring->mixing(n, 0));
  const Models x0 = random_models(n, 64, 11, 3.0);
  const auto r = run(*ring, n, "dpsgd", {}, nullptr, x0, steps, 0.1f);
  const double c0 = consensus_distance(x0);
  const double eps = std::numeric_limits<float>::epsilon();
  const auto m0 = mean(x0);
  for (std::uint64_t t = 1; t <= steps; ++t) {
    const double bound = std::pow(1 - rho, static_cast<double>(t)) * c0 + 4.0 * t * eps * norm(x0);
    CHECK(consensus_distance(r.history[t]) <= bound);
  }
  CHECK(consensus_distance(r.history[steps]) < 1e-4 * c0);
  const auto m = mean(r.history[steps]);
  for (std::size_t k = 0; k < m.size(); ++k) CHECK(m[k] == doctest::Approx(m0[k]).epsilon(1e-5));
  // Ring: each node sends its model to 2 neighbours per step.
  for (auto b : r.bytes_sent) CHECK(b == steps * 2 * 64 * sizeof(float));
}

TEST_CASE("D-PSGD keeps the mean exact: mean(x) moves by -lr * mean(g) (both forms)") {
  const Rank n = 8;
  auto ring = topology("ring");
  const Models x0 = random_models(n, 16, 3);
  GradFn constant = [](Rank r, std::uint64_t, std::span<const float>, std::span<float> g) {
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = static_cast<float>(r) - 3.5f + 0.25f * k;
  };
  for (bool overlap : {false, true}) {
    const auto r = run(*ring, n, "dpsgd", ConfigSection("o", {{"overlap", overlap}}), nullptr, x0,
                       20, 0.1f, constant);
    const auto m0 = mean(x0), m = mean(r.history[20]);
    for (std::size_t k = 0; k < m.size(); ++k) {
      // mean over r of (r - 3.5) is 0: the mean moves by -lr * 20 * 0.25 k.
      CHECK(m[k] == doctest::Approx(m0[k] - 0.1 * 20 * 0.25 * k).epsilon(1e-4));
    }
  }
}

// A directed ring 0 -> 1 -> ... -> n-1 -> 0 plus the edge 0 -> 2, uniform out-weights.
class DirectedRingPlus final : public Topology {
 public:
  std::string_view name() const override { return "directed_ring_plus"; }
  bool symmetric() const override { return false; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    std::vector<std::vector<Rank>> out(n);
    for (Rank i = 0; i < n; ++i) out[i].push_back((i + 1) % n);
    out[0].push_back(2);
    return uniform_push_weights(out);
  }
};

TEST_CASE("push-sum on a directed, non-regular graph: z_i -> mean while x_i alone does not") {
  const Rank n = 5;
  DirectedRingPlus topo;
  Models x0(n);
  for (Rank i = 0; i < n; ++i) x0[i] = {static_cast<float>(1 + i), static_cast<float>(2 * (1 + i))};
  const auto r = run(topo, n, "push_sum", {}, nullptr, x0, 200, 0.1f);
  const auto want = mean(x0);  // 3 and 6
  double max_x_dev = 0;
  for (Rank i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < 2; ++k) {
      CHECK(std::abs(r.history[200][i][k] - want[k]) < 1e-5 * 10);
    }
  }
  // Without the de-biasing weight the raw x_i stay off the mean (w_i != 1 on this graph).
  DirectedRingPlus topo2;
  InMemoryNetwork net(n);
  std::vector<double> w(n, 1.0);
  Models x = x0;
  {
    std::vector<std::jthread> threads;
    for (Rank i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        Gossip g(net.comm(i), topo2);
        for (std::uint64_t t = 0; t < 200; ++t) w[i] = g.push(t, x[i], w[i]);
      });
    }
  }
  double wsum = 0;
  for (Rank i = 0; i < n; ++i) {
    wsum += w[i];
    max_x_dev = std::max(max_x_dev, std::abs(x[i][0] - want[0]) / want[0]);
    CHECK(x[i][0] / w[i] == doctest::Approx(want[0]).epsilon(1e-5));
  }
  CHECK(wsum == doctest::Approx(n).epsilon(1e-9));
  CHECK(max_x_dev >= 0.1);
}

TEST_CASE("QG-DSGDm with W = I reduces to m <- (mu + (1-mu) beta) m + (1-mu) g") {
  // One node: every topology's W is [1].
  auto ring = topology("ring");
  const float beta = 0.9f, mu = 0.8f, lr = 0.5f;
  const std::vector<float> gs{1.0f, -2.0f, 0.5f, 3.0f, 0.0f, 1.0f};
  GradFn seq = [&](Rank, std::uint64_t t, std::span<const float>, std::span<float> g) {
    g[0] = gs[t];
  };
  const auto r = run(*ring, 1, "qg_dsgdm",
                     ConfigSection("o", {{"momentum", double{beta}}, {"mu", double{mu}}}), nullptr,
                     {{0.0f}}, gs.size(), lr, seq);
  double m = 0, x = 0;
  for (std::size_t t = 0; t < gs.size(); ++t) {
    x -= lr * (beta * m + gs[t]);  // x^{t+1} = x^t - lr (beta mhat + g)
    m = (mu + (1 - mu) * beta) * m + (1 - mu) * gs[t];
    CHECK(r.history[t + 1][0][0] == doctest::Approx(x).epsilon(1e-5));
  }
}

TEST_CASE(
    "QG-DSGDm sends exactly what DSGDm sends, and keeps the node-average of models on "
    "the average update") {
  const Rank n = 6;
  auto ring = topology("ring");
  const Models x0 = random_models(n, 10, 5);
  GradFn noisy = [](Rank r, std::uint64_t t, std::span<const float> x, std::span<float> g) {
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = x[k] - static_cast<float>((r + t + k) % 3);
  };
  const auto a = run(*ring, n, "qg_dsgdm_n", {}, nullptr, x0, 30, 0.05f, noisy);
  const auto b = run(*ring, n, "dsgdm_n", {}, nullptr, x0, 30, 0.05f, noisy);
  CHECK(a.bytes_sent == b.bytes_sent);
  // Both converge towards consensus on this smooth problem.
  CHECK(consensus_distance(a.history[30]) < consensus_distance(x0));
}

TEST_CASE("CHOCO with Q = identity and gamma = 1: step 1 keeps x, then it is exact gossip") {
  const Rank n = 8;
  auto ring = topology("ring");
  CompressorRegistry compressors;
  add_builtin_compressors(compressors);
  std::shared_ptr<const Compressor> none = compressors.create("none", {});
  const Models x0 = random_models(n, 20, 9);
  const auto c = run(*ring, n, "choco", ConfigSection("o", {{"gamma", 1.0}}), none, x0, 11, 0.1f);
  const auto g = run(*ring, n, "dpsgd", {}, nullptr, x0, 10, 0.1f);
  for (Rank i = 0; i < n; ++i) CHECK(c.history[1][i] == x0[i]);
  for (std::uint64_t t = 1; t <= 10; ++t) {
    for (Rank i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < 20; ++k) {
        CHECK(c.history[t + 1][i][k] == doctest::Approx(g.history[t][i][k]).epsilon(1e-4));
      }
    }
  }
}

TEST_CASE("CHOCO-Gossip with top-10 of 100 on a ring of 8 (gamma = 0.1) reaches consensus") {
  const Rank n = 8;
  auto ring = topology("ring");
  CompressorRegistry compressors;
  add_builtin_compressors(compressors);
  std::shared_ptr<const Compressor> topk = compressors.create(
      "topk", ConfigSection("c", {{"k", std::int64_t{10}}, {"error_feedback", false}}));
  const Models x0 = random_models(n, 100, 21);
  const auto r = run(*ring, n, "choco", ConfigSection("o", {{"gamma", 0.1}}), topk, x0, 1000, 0.1f);
  const double c0 = consensus_distance(x0);
  CHECK(consensus_distance(r.history[1000]) < 1e-5 * c0);
  // The sum is preserved for any Q (W symmetric).
  const auto m0 = mean(x0), m = mean(r.history[1000]);
  for (std::size_t k = 0; k < m.size(); ++k) CHECK(m[k] == doctest::Approx(m0[k]).epsilon(1e-3));
  // Each step sends 12 + 4k + ceil(d/8) = 65 bytes (or 12 + 8k) to each of 2 neighbours.
  for (auto b : r.bytes_sent) CHECK(b < 1000u * 2 * 100 * sizeof(float) / 4);
}

TEST_CASE("a neighbour that disappears is dropped from mixing; the others reach consensus") {
  const Rank n = 5;
  auto ring = topology("ring");
  const Models x0 = random_models(n, 8, 17, 1.0);
  const auto r = run(*ring, n, "dpsgd", {}, nullptr, x0, 200, 0.1f, zero_grad,
                     std::make_pair(Rank{2}, std::uint64_t{2}));
  Models alive;
  for (Rank i : {0u, 1u, 3u, 4u}) alive.push_back(r.history[200][i]);
  Models before;
  for (Rank i : {0u, 1u, 3u, 4u}) before.push_back(r.history[2][i]);
  CHECK(consensus_distance(before) > 0.1);
  CHECK(consensus_distance(alive) < 1e-4 * consensus_distance(before));
  CHECK(r.history[200][2].empty());  // the dead rank never got there
}

TEST_CASE("push-sum on the one-peer exponential graph (time-varying, directed) averages exactly") {
  const Rank n = 8;
  auto topo = topology("one_peer_exponential");
  const Models x0 = random_models(n, 4, 2, 5.0);
  const auto r = run(*topo, n, "sgp", {}, nullptr, x0, 3, 0.1f);
  const auto m0 = mean(x0);
  // tau = 3 steps of (I + P^(2^k))/2 multiply to 11^T/n.
  for (Rank i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < 4; ++k)
      CHECK(r.history[3][i][k] == doctest::Approx(m0[k]).epsilon(1e-5));
  }
}

TEST_CASE("asynchronous gossip: a node runs up to S steps ahead of a held neighbour, then waits") {
  const Rank n = 3;
  const std::uint64_t S = 3, steps = 200;
  auto ring = topology("ring");  // n = 3: everyone is everyone's neighbour
  InMemoryNetwork net(n);
  const Models x0 = random_models(n, 16, 5, 2.0);
  Models x = x0;
  std::vector<std::atomic<std::uint64_t>> done(n);
  std::atomic<bool> release{false};
  std::vector<std::string> errors(n);
  bool ran_ahead = false;
  {
    std::vector<std::jthread> threads;
    for (Rank r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          GossipOptions go;
          go.timeout = std::chrono::seconds(120);
          go.staleness = S;
          Gossip g(net.comm(r), *ring, go);
          std::vector<float> out(x[r].size());
          if (r == 0) {
            while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          for (std::uint64_t t = 0; t < steps; ++t) {
            g.mix(t, x[r], out);
            x[r] = out;
            done[r].store(t + 1);
          }
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    // Ranks 1 and 2 finish steps 0..S-1 without a word from rank 0, and no more.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline &&
           (done[1].load() < S || done[2].load() < S)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ran_ahead = done[1].load() == S && done[2].load() == S && done[0].load() == 0;
    release.store(true);
  }
  for (Rank r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[r].empty(), errors[r]);
  CHECK(ran_ahead);
  CHECK(consensus_distance(x) < 1e-4 * consensus_distance(x0));
}

TEST_CASE("ring_allreduce keeps every node on the same model: SGD on the mean gradient") {
  const Rank n = 5;
  auto ring = topology("ring");
  const Models x0(n, std::vector<float>(7, 1.0f));
  GradFn per_node = [](Rank r, std::uint64_t, std::span<const float>, std::span<float> g) {
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = static_cast<float>(r) + 0.5f * k;
  };
  const auto r = run(*ring, n, "ring_allreduce", ConfigSection("o", {{"momentum", 0.0}}), nullptr,
                     x0, 4, 0.25f, per_node);
  // mean over r of r = 2: each step moves x_k by -0.25 (2 + 0.5 k).
  for (Rank i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < 7; ++k) {
      CHECK(r.history[4][i][k] == doctest::Approx(1.0 - 4 * 0.25 * (2 + 0.5 * k)).epsilon(1e-6));
      CHECK(r.history[4][i][k] == r.history[4][0][k]);
    }
  }
}

TEST_CASE("ring_allreduce's allreduce option picks the collective: recursive doubling is selectable") {
  const Rank n = 4;
  const std::size_t d = 32768;  // 128 KiB: kAuto would pick the ring
  auto ring = topology("ring");
  const Models x0(n, std::vector<float>(d, 1.0f));
  GradFn per_node = [](Rank r, std::uint64_t, std::span<const float>, std::span<float> g) {
    std::fill(g.begin(), g.end(), static_cast<float>(r));
  };
  auto bytes = [&](std::string_view algo) {
    const auto r = run(*ring, n, "ring_allreduce",
                       ConfigSection("o", {{"momentum", 0.0}, {"allreduce", std::string(algo)}}),
                       nullptr, x0, 2, 0.5f, per_node);
    for (Rank i = 0; i < n; ++i) CHECK(r.history[2][i][0] == doctest::Approx(1.0 - 2 * 0.5 * 1.5));
    return r.bytes_sent[0];
  };
  // Per step and rank: the ring sends 2(n-1)/n of the vector, recursive doubling log2(n) times it.
  const std::uint64_t vec = d * sizeof(float);
  CHECK(bytes("ring") < 2 * vec * 16 / 10);
  CHECK(bytes("recursive_doubling") >= 2 * 2 * vec);
  DecentralizedOptimizerRegistry registry;
  add_builtin_decentralized_optimizers(registry);
  CHECK_THROWS_AS((void)registry.create("ring_allreduce",
                                        ConfigSection("o", {{"allreduce", std::string("tre")}})),
                  ConfigError);
}

ConfigSection decentralized(std::map<std::string, Value, std::less<>> values) {
  return ConfigSection("decentralized", std::move(values));
}

TEST_CASE("decentralized settings: every key checked, options reach the topology, compressor and optimizer") {
  // Defaults.
  const auto d = decentralized_settings_from(decentralized({}));
  CHECK(d.peers == 4);
  CHECK(d.algorithm == "dpsgd");
  CHECK(d.topology == "ring");
  CHECK(make_compressor(d) == nullptr);
  // Unknown keys, bad values, and options the algorithm does not take are refused.
  CHECK_THROWS_WITH_AS((void)decentralized_settings_from(decentralized({{"stpes", std::int64_t{5}}})),
                       doctest::Contains("decentralized.stpes"), ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized({{"steps", std::int64_t{0}}})),
                  ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized({{"lr", 0.0}})), ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized({{"peers", std::int64_t{0}}})),
                  ConfigError);
  CHECK_THROWS_WITH_AS((void)decentralized_settings_from(decentralized({{"gamma", 0.5}})),
                       doctest::Contains("decentralized.gamma"), ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(
                      decentralized({{"algorithm", std::string("dsgdm")}, {"momentum", 2.0}})),
                  ConfigError);
  // Topology options reach random_regular: its default degree 4 has no graph on 4 nodes.
  CHECK_THROWS_WITH_AS((void)decentralized_settings_from(
                           decentralized({{"topology", std::string("random_regular")}})),
                       doctest::Contains("no 4-regular graph on 4 nodes"), ConfigError);
  const auto rr = decentralized_settings_from(
      decentralized({{"topology", std::string("random_regular")},
                     {"topology_options.degree", std::int64_t{2}},
                     {"topology_options.seed", std::int64_t{7}}}));
  const auto w = make_topology(rr)->mixing(4, 0);
  for (Rank i = 0; i < 4; ++i) CHECK(neighbourhood(w, i).in.size() == 2);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized(
                      {{"topology", std::string("random_regular")},
                       {"topology_options.degre", std::int64_t{2}}})),
                  ConfigError);
  // Only choco compresses; its compressor gets its options, error feedback only when asked.
  CHECK_THROWS_WITH_AS((void)decentralized_settings_from(
                           decentralized({{"compressor", std::string("topk")}})),
                       doctest::Contains("choco only"), ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized(
                      {{"algorithm", std::string("push_sum")}, {"topology", std::string("exponential")},
                       {"compressor_options.k", std::int64_t{1}}})),
                  ConfigError);
  const auto choco = decentralized_settings_from(
      decentralized({{"algorithm", std::string("choco")}, {"compressor", std::string("topk")},
                     {"compressor_options.k", std::int64_t{1}}, {"gamma", 0.1}}));
  const auto q = make_compressor(choco);
  REQUIRE(q != nullptr);
  CHECK(q->encoding() == "topk");
  CHECK(q->make_state(100) == nullptr);  // no error feedback unless asked
  std::vector<float> x(100, 1.0f), back(100);
  x[42] = 5.0f;
  std::vector<std::byte> wire;
  q->encode(x, nullptr, 1, wire);
  q->decode(wire, back);
  CHECK(std::count_if(back.begin(), back.end(), [](float v) { return v != 0; }) == 1);  // k = 1
  CHECK(back[42] == 5.0f);
  const auto ef = decentralized_settings_from(decentralized(
      {{"algorithm", std::string("choco")}, {"compressor", std::string("topk")},
       {"compressor_options.k_fraction", 0.1}, {"compressor_options.error_feedback", true}}));
  CHECK(make_compressor(ef)->make_state(100) != nullptr);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized(
                      {{"algorithm", std::string("choco")}, {"compressor", std::string("topk")},
                       {"compressor_options.k_fractoin", 0.1}})),
                  ConfigError);
  // The recursive-doubling collective, and staleness only where gossip is asynchronous.
  (void)decentralized_settings_from(decentralized(
      {{"algorithm", std::string("ring_allreduce")}, {"allreduce", std::string("recursive_doubling")}}));
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized(
                      {{"algorithm", std::string("ring_allreduce")}, {"staleness", std::int64_t{2}}})),
                  ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(decentralized(
                      {{"topology", std::string("time_varying")}, {"staleness", std::int64_t{2}}})),
                  ConfigError);
  CHECK_THROWS_AS((void)decentralized_settings_from(
                      decentralized({{"topology", std::string("exponential")}})),  // dpsgd: symmetric
                  ConfigError);
  // The partition check is the caller's.
  CHECK_THROWS_AS((void)decentralized_settings_from(
                      decentralized({{"partition", std::string("bogus")}}),
                      [](const std::string& p) { throw ConfigError("bad partition " + p); }),
                  ConfigError);
}

TEST_CASE("asynchronous gossip needs a static topology") {
  InMemoryNetwork net(4);
  auto tv = topology("time_varying");
  GossipOptions go;
  go.staleness = 2;
  CHECK_THROWS_AS(Gossip(net.comm(0), *tv, go), ConfigError);
}

}  // namespace
}  // namespace cohort::aggregation
