// Splitting a dataset across federated clients, IID or not (docs/ALGORITHMS.md section 9).
//
// Every partitioner takes the dataset's labels (or its size), the number of clients, its own
// parameters and a seed; it is deterministic for a seed (core/random.h, no global RNG) and
// returns a disjoint cover of [0, N): each index appears in exactly one client's list. Lists hold
// row indices into the Dataset, in the order the partitioner produced them.
//
//   spec             rule
//   iid              shuffle, split into near-equal parts (sizes differ by at most one)
//   shards:S         sort by label, cut into n*S near-equal shards, S random shards per client
//                    (McMahan et al., 2017; S = 2 is the FedAvg paper's MNIST setting)
//   dirichlet:A[:M]  label skew per class over clients (NIID-Bench, Li et al., 2022): for each
//                    class p ~ Dir(A * 1_n), clients already holding >= N/n samples get none,
//                    the class's shuffled indices are cut at the cumulative proportions; redrawn
//                    until every client holds >= M samples (default 10), at most 10,000 draws
//   quantity:B       size skew, labels IID (NIID-Bench): q ~ Dir(B * 1_n) redrawn until
//                    min q_j * N >= 10, shuffled indices cut at floor(N * cumsum(q))
//   sample:M         cohort-sim only: every client draws M distinct examples of the whole set
//                    (Floyd's algorithm on Rng::for_stream(seed, client)), so clients share
//                    examples and there may be more clients than examples; a client's rows are a
//                    function of (seed, client) alone, computed when it trains (ClientRows)
// Parameters left out take the defaults shards:2, dirichlet:0.5, quantity:0.5; sample needs its M.
// Every kind but sample returns a disjoint cover (make_partition refuses sample).
//
// Functions are stateless and thread-safe. Bad parameters throw ConfigError; a Dirichlet draw that
// finds no valid partition within the retry cap throws ConfigError saying which knob to turn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/client/dataset.h"

namespace cohort::client {

// One index list per client.
using Partition = std::vector<std::vector<std::uint32_t>>;

enum class PartitionKind { kIid, kShards, kDirichlet, kQuantity, kSample };

struct PartitionSpec {
  PartitionKind kind = PartitionKind::kIid;
  double shards_per_client = 2;  // shards: an integer >= 1
  double alpha = 0.5;            // dirichlet concentration, > 0
  std::size_t min_size = 10;     // dirichlet: smallest acceptable client
  double beta = 0.5;             // quantity concentration, > 0
  std::size_t sample_size = 0;   // sample: examples per client, >= 1

  // Round-trips through parse_partition_spec(), e.g. "dirichlet:0.1".
  [[nodiscard]] std::string to_string() const;
};

// Parses "iid", "shards:2", "dirichlet:0.1", "dirichlet:0.1:20", "quantity:1.5", and with
// `simulation` (cohort-sim) "sample:60". Throws ConfigError naming the spec and listing the valid
// forms; "sample:M" without `simulation` is refused as cohort-sim's only.
PartitionSpec parse_partition_spec(std::string_view spec, bool simulation = false);

Partition partition_iid(std::size_t n_items, std::size_t n_clients, std::uint64_t seed);
Partition partition_shards(std::span<const std::int32_t> labels, std::size_t n_clients,
                           std::size_t shards_per_client, std::uint64_t seed);
Partition partition_dirichlet(std::span<const std::int32_t> labels, std::size_t n_clients,
                              double alpha, std::uint64_t seed, std::size_t min_size = 10,
                              std::size_t max_draws = 10000);
Partition partition_quantity(std::size_t n_items, std::size_t n_clients, double beta,
                             std::uint64_t seed, std::size_t max_draws = 10000);

// Client `client`'s rows under sample:M: M distinct indices in [0, n_items) drawn by Floyd's
// algorithm from Rng::for_stream(seed, client), in draw order. REQUIRES: 1 <= m <= n_items.
std::vector<std::uint32_t> sample_rows(std::size_t n_items, std::size_t m, std::uint64_t seed,
                                       std::uint64_t client);

// Dispatches on spec.kind (refusing sample, which has no stored form) and logs a summary (sizes,
// distinct labels per client) at Info and each client's label histogram at Debug.
Partition make_partition(const PartitionSpec& spec, std::span<const std::int32_t> labels,
                         std::size_t n_clients, std::uint64_t seed);

// The same for a dataset: a regression dataset (Dataset::regression, train.loss = mse) has no
// class labels, so iid and quantity split it by size, and shards and dirichlet, which split by
// label, are refused (ConfigError, one line naming the spec).
Partition make_partition(const PartitionSpec& spec, const Dataset& data, std::size_t n_clients,
                         std::uint64_t seed);

// The rows each client trains on: a stored Partition, or under sample:M the rows computed from
// (seed, client) when asked for, so that idle clients cost nothing. Immutable: thread-safe.
class ClientRows {
 public:
  ClientRows() = default;
  explicit ClientRows(Partition stored) : stored_(std::move(stored)), clients_(stored_.size()) {}
  // Makes the rows of `spec` for `n_clients` clients of `data`: sample:M computed on demand
  // (ConfigError when M exceeds the examples), every other kind through make_partition().
  ClientRows(const PartitionSpec& spec, const Dataset& data, std::size_t n_clients,
             std::uint64_t seed);

  [[nodiscard]] std::size_t clients() const { return clients_; }
  [[nodiscard]] std::size_t size(std::size_t client) const {
    return sample_ > 0 ? sample_ : stored_[client].size();
  }
  // The client's rows. Computed ones are written to `scratch`, which the span then views.
  std::span<const std::uint32_t> rows(std::size_t client,
                                      std::vector<std::uint32_t>& scratch) const;

 private:
  Partition stored_;
  std::size_t clients_ = 0;
  std::size_t sample_ = 0, items_ = 0;  // sample:M
  std::uint64_t seed_ = 0;
};

// counts[client][label] for labels in [0, num_classes).
std::vector<std::vector<std::size_t>> label_histogram(const Partition& partition,
                                                      std::span<const std::int32_t> labels,
                                                      std::size_t num_classes);

}  // namespace cohort::client
