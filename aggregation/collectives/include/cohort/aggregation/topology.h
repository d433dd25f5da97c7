// Communication graphs and their mixing matrices (the Topology plug-in; docs/ALGORITHMS.md 5.1).
//
// W[i][j] is the weight node i gives to node j's model: x_i <- sum_j W_ij x_j. Node i receives
// from every j with W_ij > 0 and sends to every j with W_ji > 0. A Topology is immutable and
// deterministic: W^(t) depends on its options, n and t only (time-varying graphs derive theirs
// from (seed, t)), so every node computes the same matrix without talking.
//
// Built-ins (registry name: options):
//   complete                 W = 11^T / n
//   ring                     Metropolis-Hastings on the cycle (1/3 each for n >= 3)
//   torus: rows, cols        2-D wrap-around grid (rows*cols = n; default the squarest split),
//                            Metropolis-Hastings (1/5 each when both sides >= 3)
//   exponential              static directed: i -> i + 2^k, k = 0..floor(log2(n-1)), all weights
//                            1/(tau+1) (doubly stochastic, not symmetric)
//   one_peer_exponential     time-varying directed: W^(t) = (I + P^(2^(t mod tau)))/2
//   random_regular: degree = 4, seed = 1   a connected random d-regular graph, 1/(d+1) weights
//   time_varying: seed = 1   a fresh random matching every step, 1/2 on each matched pair
// Thread-safety: const methods are safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/core/comm.h"
#include "cohort/core/config.h"

namespace cohort::aggregation {

// A dense n x n matrix, row-major.
class MixingMatrix {
 public:
  MixingMatrix() = default;
  explicit MixingMatrix(Rank n) : n_(n), w_(std::size_t{n} * n, 0.0) {}
  [[nodiscard]] Rank size() const { return n_; }
  double& operator()(Rank i, Rank j) { return w_[std::size_t{i} * n_ + j]; }
  double operator()(Rank i, Rank j) const { return w_[std::size_t{i} * n_ + j]; }
  [[nodiscard]] bool row_stochastic(double tol = 1e-12) const;
  [[nodiscard]] bool column_stochastic(double tol = 1e-12) const;
  [[nodiscard]] bool symmetric(double tol = 1e-12) const;
  [[nodiscard]] bool nonnegative() const;

 private:
  Rank n_ = 0;
  std::vector<double> w_;
};

// Metropolis-Hastings weights for an undirected graph given as adjacency lists (each edge listed
// at both ends; self-loops and duplicates ignored): W_ij = 1/(1 + max(d_i, d_j)) on edges,
// W_ii = 1 - sum_{j != i} W_ij. Symmetric and doubly stochastic for any graph.
[[nodiscard]] MixingMatrix metropolis_hastings(const std::vector<std::vector<Rank>>& adjacency);

// Push-sum weights for a directed graph (out-adjacency lists): node j splits its mass uniformly
// over itself and its out-peers, P_ij = 1/(d_out(j) + 1). Column-stochastic.
[[nodiscard]] MixingMatrix uniform_push_weights(const std::vector<std::vector<Rank>>& out);

// Eigenvalues of a symmetric matrix, descending (cyclic Jacobi; n up to a few hundred).
[[nodiscard]] std::vector<double> symmetric_eigenvalues(const MixingMatrix& w);
// rho = 1 - ||W - 11^T/n||_2 (for symmetric W: 1 - max(|lambda_2|, |lambda_n|)).
[[nodiscard]] double spectral_gap(const MixingMatrix& w);

// Node i's view of one mixing matrix.
struct Neighbourhood {
  double self_weight = 0;
  std::vector<std::pair<Rank, double>> in;   // j != i with W_ij > 0: whose models i mixes in
  std::vector<std::pair<Rank, double>> out;  // j != i with W_ji > 0: who mixes in i's model
};
// Node i's neighbourhood in w, without the ranks in `gone`: an in-neighbour that is gone has
// its weight moved to i's own (so the row still sums to 1, and W stays symmetric when both ends
// drop each other), and an out-neighbour that is gone is not sent to.
[[nodiscard]] Neighbourhood neighbourhood(const MixingMatrix& w, Rank i,
                                          const std::set<Rank>& gone = {});

class Topology {
 public:
  virtual ~Topology() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // W^(t) for n nodes. Throws ConfigError when the graph does not exist for this n.
  [[nodiscard]] virtual MixingMatrix mixing(Rank n, std::uint64_t step) const = 0;
  [[nodiscard]] virtual bool time_varying() const { return false; }
  // Whether every W^(t) is symmetric (D-PSGD, DSGDm, QG and CHOCO assume so; push-sum does not).
  [[nodiscard]] virtual bool symmetric() const { return true; }
};

using TopologyFactory = std::function<std::unique_ptr<Topology>(const ConfigSection& options)>;

class TopologyRegistry {
 public:
  // Throws ConfigError if the name is taken.
  void add(std::string name, TopologyFactory factory);
  // Throws ConfigError listing the known names if `name` is unknown, or naming a bad option.
  [[nodiscard]] std::unique_ptr<Topology> create(std::string_view name,
                                                 const ConfigSection& options) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;

 private:
  std::map<std::string, TopologyFactory, std::less<>> factories_;
};

void add_builtin_topologies(TopologyRegistry& registry);

}  // namespace cohort::aggregation
