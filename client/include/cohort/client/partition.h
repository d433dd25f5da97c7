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
// Parameters left out take the defaults shards:2, dirichlet:0.5, quantity:0.5.
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

enum class PartitionKind { kIid, kShards, kDirichlet, kQuantity };

struct PartitionSpec {
  PartitionKind kind = PartitionKind::kIid;
  double shards_per_client = 2;  // shards: an integer >= 1
  double alpha = 0.5;            // dirichlet concentration, > 0
  std::size_t min_size = 10;     // dirichlet: smallest acceptable client
  double beta = 0.5;             // quantity concentration, > 0

  // Round-trips through parse_partition_spec(), e.g. "dirichlet:0.1".
  [[nodiscard]] std::string to_string() const;
};

// Parses "iid", "shards:2", "dirichlet:0.1", "dirichlet:0.1:20", "quantity:1.5". Throws ConfigError
// naming the spec and listing the valid forms.
PartitionSpec parse_partition_spec(std::string_view spec);

Partition partition_iid(std::size_t n_items, std::size_t n_clients, std::uint64_t seed);
Partition partition_shards(std::span<const std::int32_t> labels, std::size_t n_clients,
                           std::size_t shards_per_client, std::uint64_t seed);
Partition partition_dirichlet(std::span<const std::int32_t> labels, std::size_t n_clients,
                              double alpha, std::uint64_t seed, std::size_t min_size = 10,
                              std::size_t max_draws = 10000);
Partition partition_quantity(std::size_t n_items, std::size_t n_clients, double beta,
                             std::uint64_t seed, std::size_t max_draws = 10000);

// Dispatches on spec.kind and logs a summary (sizes, distinct labels per client) at Info and each
// client's label histogram at Debug.
Partition make_partition(const PartitionSpec& spec, std::span<const std::int32_t> labels,
                         std::size_t n_clients, std::uint64_t seed);

// The same for a dataset: a regression dataset (Dataset::regression, train.loss = mse) has no
// class labels, so iid and quantity split it by size, and shards and dirichlet, which split by
// label, are refused (ConfigError, one line naming the spec).
Partition make_partition(const PartitionSpec& spec, const Dataset& data, std::size_t n_clients,
                         std::uint64_t seed);

// counts[client][label] for labels in [0, num_classes).
std::vector<std::vector<std::size_t>> label_histogram(const Partition& partition,
                                                      std::span<const std::int32_t> labels,
                                                      std::size_t num_classes);

}  // namespace cohort::client
