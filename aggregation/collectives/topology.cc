#include "cohort/aggregation/topology.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {

bool MixingMatrix::row_stochastic(double tol) const {
  for (Rank i = 0; i < n_; ++i) {
    double s = 0;
    for (Rank j = 0; j < n_; ++j) s += (*this)(i, j);
    if (std::abs(s - 1) > tol) return false;
  }
  return true;
}

bool MixingMatrix::column_stochastic(double tol) const {
  for (Rank j = 0; j < n_; ++j) {
    double s = 0;
    for (Rank i = 0; i < n_; ++i) s += (*this)(i, j);
    if (std::abs(s - 1) > tol) return false;
  }
  return true;
}

bool MixingMatrix::symmetric(double tol) const {
  for (Rank i = 0; i < n_; ++i) {
    for (Rank j = i + 1; j < n_; ++j) {
      if (std::abs((*this)(i, j) - (*this)(j, i)) > tol) return false;
    }
  }
  return true;
}

bool MixingMatrix::nonnegative() const {
  return std::all_of(w_.begin(), w_.end(), [](double v) { return v >= 0; });
}

namespace {

std::vector<std::vector<Rank>> dedup(const std::vector<std::vector<Rank>>& adjacency) {
  const auto n = static_cast<Rank>(adjacency.size());
  std::vector<std::vector<Rank>> out(n);
  for (Rank i = 0; i < n; ++i) {
    for (Rank j : adjacency[i]) {
      if (j >= n)
        throw ConfigError("graph edge to node " + std::to_string(j) + " of " + std::to_string(n));
      if (j != i) out[i].push_back(j);
    }
    std::sort(out[i].begin(), out[i].end());
    out[i].erase(std::unique(out[i].begin(), out[i].end()), out[i].end());
  }
  return out;
}

bool connected(const std::vector<std::vector<Rank>>& adj) {
  if (adj.empty()) return true;
  std::vector<bool> seen(adj.size(), false);
  std::vector<Rank> stack{0};
  seen[0] = true;
  std::size_t count = 1;
  while (!stack.empty()) {
    const Rank v = stack.back();
    stack.pop_back();
    for (Rank u : adj[v]) {
      if (!seen[u]) {
        seen[u] = true;
        ++count;
        stack.push_back(u);
      }
    }
  }
  return count == adj.size();
}

}  // namespace

MixingMatrix metropolis_hastings(const std::vector<std::vector<Rank>>& adjacency) {
  const auto adj = dedup(adjacency);
  const auto n = static_cast<Rank>(adj.size());
  for (Rank i = 0; i < n; ++i) {
    for (Rank j : adj[i]) {
      if (!std::binary_search(adj[j].begin(), adj[j].end(), i)) {
        throw ConfigError("Metropolis-Hastings needs an undirected graph: edge " +
                          std::to_string(i) + "-" + std::to_string(j) +
                          " is listed at one end only");
      }
    }
  }
  MixingMatrix w(n);
  for (Rank i = 0; i < n; ++i) {
    double off = 0;
    for (Rank j : adj[i]) {
      const double v = 1.0 / (1.0 + static_cast<double>(std::max(adj[i].size(), adj[j].size())));
      w(i, j) = v;
      off += v;
    }
    w(i, i) = 1.0 - off;
  }
  return w;
}

MixingMatrix uniform_push_weights(const std::vector<std::vector<Rank>>& out) {
  const auto adj = dedup(out);
  const auto n = static_cast<Rank>(adj.size());
  MixingMatrix p(n);
  for (Rank j = 0; j < n; ++j) {
    const double share = 1.0 / (1.0 + static_cast<double>(adj[j].size()));
    p(j, j) = share;
    for (Rank i : adj[j]) p(i, j) = share;
  }
  return p;
}

std::vector<double> symmetric_eigenvalues(const MixingMatrix& w) {
  const Rank n = w.size();
  std::vector<double> a(std::size_t{n} * n);
  for (Rank i = 0; i < n; ++i) {
    for (Rank j = 0; j < n; ++j) a[std::size_t{i} * n + j] = 0.5 * (w(i, j) + w(j, i));
  }
  auto at = [&](Rank i, Rank j) -> double& { return a[std::size_t{i} * n + j]; };
  // Cyclic Jacobi rotations until the off-diagonal mass vanishes.
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (Rank i = 0; i < n; ++i) {
      for (Rank j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
    }
    if (off < 1e-30) break;
    for (Rank p = 0; p < n; ++p) {
      for (Rank q = p + 1; q < n; ++q) {
        const double apq = at(p, q);
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (at(q, q) - at(p, p)) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (Rank k = 0; k < n; ++k) {
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (Rank k = 0; k < n; ++k) {
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> ev(n);
  for (Rank i = 0; i < n; ++i) ev[i] = at(i, i);
  std::sort(ev.begin(), ev.end(), std::greater<>());
  return ev;
}

double spectral_gap(const MixingMatrix& w) {
  const Rank n = w.size();
  if (n <= 1) return 1;
  // ||W - J||_2^2 = largest eigenvalue of (W - J)^T (W - J).
  MixingMatrix d(n);
  for (Rank i = 0; i < n; ++i) {
    for (Rank j = 0; j < n; ++j) d(i, j) = w(i, j) - 1.0 / n;
  }
  MixingMatrix g(n);
  for (Rank i = 0; i < n; ++i) {
    for (Rank j = 0; j < n; ++j) {
      double s = 0;
      for (Rank k = 0; k < n; ++k) s += d(k, i) * d(k, j);
      g(i, j) = s;
    }
  }
  const auto ev = symmetric_eigenvalues(g);
  return 1 - std::sqrt(std::max(0.0, ev.front()));
}

Neighbourhood neighbourhood(const MixingMatrix& w, Rank i, const std::set<Rank>& gone) {
  COHORT_CHECK(i < w.size()) << "node " << i << " of " << w.size();
  Neighbourhood nb;
  nb.self_weight = w(i, i);
  for (Rank j = 0; j < w.size(); ++j) {
    if (j == i) continue;
    const bool away = gone.contains(j);
    if (w(i, j) > 0) {
      if (away) {
        nb.self_weight += w(i, j);
      } else {
        nb.in.emplace_back(j, w(i, j));
      }
    }
    if (w(j, i) > 0 && !away) nb.out.emplace_back(j, w(j, i));
  }
  return nb;
}

namespace {

Rank exponential_degree(Rank n) {  // tau: the number of distinct powers of two below n
  return n <= 1 ? 0 : static_cast<Rank>(std::bit_width(n - 1));
}

class Complete final : public Topology {
 public:
  std::string_view name() const override { return "complete"; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    MixingMatrix w(n);
    for (Rank i = 0; i < n; ++i) {
      for (Rank j = 0; j < n; ++j) w(i, j) = 1.0 / n;
    }
    return w;
  }
};

class RingTopology final : public Topology {
 public:
  std::string_view name() const override { return "ring"; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    std::vector<std::vector<Rank>> adj(n);
    for (Rank i = 0; i < n && n > 1; ++i) {
      adj[i] = {(i + 1) % n, (i + n - 1) % n};
    }
    return metropolis_hastings(adj);
  }
};

class Torus final : public Topology {
 public:
  Torus(Rank rows, Rank cols) : rows_(rows), cols_(cols) {}
  std::string_view name() const override { return "torus"; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    Rank rows = rows_, cols = cols_;
    if (rows == 0 && cols == 0) {
      rows = static_cast<Rank>(std::sqrt(static_cast<double>(n)));
      while (rows > 1 && n % rows != 0) --rows;
      cols = n / std::max<Rank>(rows, 1);
    } else if (rows == 0) {
      rows = cols ? n / cols : 0;
    } else if (cols == 0) {
      cols = n / rows;
    }
    if (rows * cols != n) {
      throw ConfigError("torus " + std::to_string(rows) + "x" + std::to_string(cols) +
                        " does not have " + std::to_string(n) + " nodes");
    }
    std::vector<std::vector<Rank>> adj(n);
    for (Rank r = 0; r < rows; ++r) {
      for (Rank c = 0; c < cols; ++c) {
        const Rank i = r * cols + c;
        adj[i] = {((r + 1) % rows) * cols + c, ((r + rows - 1) % rows) * cols + c,
                  r * cols + (c + 1) % cols, r * cols + (c + cols - 1) % cols};
      }
    }
    return metropolis_hastings(adj);
  }

 private:
  Rank rows_, cols_;
};

class Exponential final : public Topology {
 public:
  std::string_view name() const override { return "exponential"; }
  bool symmetric() const override { return false; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    const Rank tau = exponential_degree(n);
    MixingMatrix w(n);
    const double v = 1.0 / (tau + 1);
    for (Rank i = 0; i < n; ++i) {
      w(i, i) = v;
      // i sends to i + 2^k, so it receives from i - 2^k.
      for (Rank k = 0; k < tau; ++k) w(i, (i + n - ((Rank{1} << k) % n)) % n) += v;
    }
    return w;
  }
};

class OnePeerExponential final : public Topology {
 public:
  std::string_view name() const override { return "one_peer_exponential"; }
  bool symmetric() const override { return false; }
  bool time_varying() const override { return true; }
  MixingMatrix mixing(Rank n, std::uint64_t step) const override {
    MixingMatrix w(n);
    const Rank tau = exponential_degree(n);
    if (tau == 0) {
      if (n == 1) w(0, 0) = 1;
      return w;
    }
    const Rank hop = Rank{1} << (step % tau);
    for (Rank i = 0; i < n; ++i) {
      w(i, i) += 0.5;
      w(i, (i + n - hop % n) % n) += 0.5;
    }
    return w;
  }
};

class RandomRegular final : public Topology {
 public:
  RandomRegular(Rank degree, std::uint64_t seed) : degree_(degree), seed_(seed) {}
  std::string_view name() const override { return "random_regular"; }
  MixingMatrix mixing(Rank n, std::uint64_t) const override {
    if (degree_ >= n || (std::uint64_t{n} * degree_) % 2 != 0) {
      throw ConfigError("no " + std::to_string(degree_) + "-regular graph on " + std::to_string(n) +
                        " nodes (need degree < n and n * degree even)");
    }
    // Pairing model: random matching of n*d half-edges, rejected until simple and connected.
    SplitMixRng rng(derive_seed(seed_, n, degree_));
    for (int attempt = 0; attempt < 10000; ++attempt) {
      std::vector<Rank> stubs;
      for (Rank i = 0; i < n; ++i) stubs.insert(stubs.end(), degree_, i);
      for (std::size_t k = stubs.size(); k > 1; --k) std::swap(stubs[k - 1], stubs[rng.below(k)]);
      std::vector<std::vector<Rank>> adj(n);
      bool simple = true;
      for (std::size_t k = 0; k + 1 < stubs.size() && simple; k += 2) {
        const Rank a = stubs[k], b = stubs[k + 1];
        if (a == b || std::find(adj[a].begin(), adj[a].end(), b) != adj[a].end()) simple = false;
        adj[a].push_back(b);
        adj[b].push_back(a);
      }
      if (simple && connected(adj)) return metropolis_hastings(adj);
    }
    throw ConfigError("could not draw a connected " + std::to_string(degree_) +
                      "-regular graph on " + std::to_string(n) + " nodes");
  }

 private:
  Rank degree_;
  std::uint64_t seed_;
};

class RandomMatching final : public Topology {
 public:
  explicit RandomMatching(std::uint64_t seed) : seed_(seed) {}
  std::string_view name() const override { return "time_varying"; }
  bool time_varying() const override { return true; }
  MixingMatrix mixing(Rank n, std::uint64_t step) const override {
    SplitMixRng rng(derive_seed(seed_, step, n));
    std::vector<Rank> order(n);
    for (Rank i = 0; i < n; ++i) order[i] = i;
    for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng.below(k)]);
    MixingMatrix w(n);
    for (Rank k = 0; k + 1 < n; k += 2) {
      const Rank a = order[k], b = order[k + 1];
      w(a, a) = w(b, b) = w(a, b) = w(b, a) = 0.5;
    }
    if (n % 2 == 1) w(order[n - 1], order[n - 1]) = 1;
    return w;
  }

 private:
  std::uint64_t seed_;
};

std::uint64_t seed_option(const ConfigSection& o) {
  return static_cast<std::uint64_t>(o.get_int("seed", 1));
}

Rank rank_option(const ConfigSection& o, std::string_view key, std::int64_t fallback) {
  const std::int64_t v = o.get_int(key, fallback);
  if (v < 0 || v > (1 << 20)) {
    throw ConfigError(o.prefix() + "." + std::string(key) + " must be between 0 and 2^20");
  }
  return static_cast<Rank>(v);
}

}  // namespace

void TopologyRegistry::add(std::string name, TopologyFactory factory) {
  if (factories_.contains(name)) throw ConfigError("topology '" + name + "' is registered twice");
  factories_.emplace(std::move(name), std::move(factory));
}

std::unique_ptr<Topology> TopologyRegistry::create(std::string_view name,
                                                   const ConfigSection& options) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw ConfigError("unknown topology '" + std::string(name) + "' (known: " + names() + ")");
  }
  return it->second(options);
}

bool TopologyRegistry::contains(std::string_view name) const { return factories_.contains(name); }

std::string TopologyRegistry::names() const {
  std::string out;
  for (const auto& [name, f] : factories_) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void add_builtin_topologies(TopologyRegistry& registry) {
  registry.add("complete", [](const ConfigSection& o) {
    o.require_known({});
    return std::make_unique<Complete>();
  });
  registry.add("ring", [](const ConfigSection& o) {
    o.require_known({});
    return std::make_unique<RingTopology>();
  });
  registry.add("torus", [](const ConfigSection& o) {
    static constexpr std::array<std::string_view, 2> known{"rows", "cols"};
    o.require_known(known);
    return std::make_unique<Torus>(rank_option(o, "rows", 0), rank_option(o, "cols", 0));
  });
  registry.add("exponential", [](const ConfigSection& o) {
    o.require_known({});
    return std::make_unique<Exponential>();
  });
  registry.add("one_peer_exponential", [](const ConfigSection& o) {
    o.require_known({});
    return std::make_unique<OnePeerExponential>();
  });
  registry.add("random_regular", [](const ConfigSection& o) {
    static constexpr std::array<std::string_view, 2> known{"degree", "seed"};
    o.require_known(known);
    return std::make_unique<RandomRegular>(rank_option(o, "degree", 4), seed_option(o));
  });
  registry.add("time_varying", [](const ConfigSection& o) {
    static constexpr std::array<std::string_view, 1> known{"seed"};
    o.require_known(known);
    return std::make_unique<RandomMatching>(seed_option(o));
  });
}

}  // namespace cohort::aggregation
