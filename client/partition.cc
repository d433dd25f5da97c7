#include "cohort/client/partition.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/random.h"

namespace cohort::client {
namespace {

constexpr std::string_view kValidSpecs =
    "valid: iid, shards[:S] (integer S >= 1, default 2), dirichlet[:ALPHA[:MIN_SIZE]] (ALPHA > 0, "
    "default 0.5; MIN_SIZE default 10), quantity[:BETA] (BETA > 0, default 0.5), and in cohort-sim "
    "sample:M (M examples per client, drawn with overlaps)";

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw ConfigError("partition spec '" + std::string(spec) + "': " + why + "; " +
                    std::string(kValidSpecs));
}

double parse_number(std::string_view spec, std::string_view text, std::string_view what) {
  double value = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() ||
      !std::isfinite(value)) {
    bad_spec(spec, std::string(what) + " '" + std::string(text) + "' is not a number");
  }
  return value;
}

std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

void check_clients(std::size_t n_items, std::size_t n_clients, std::string_view who) {
  if (n_clients == 0) throw ConfigError(std::string(who) + ": need at least one client");
  if (n_clients > n_items) {
    throw ConfigError(
        std::string(who) + ": " + std::to_string(n_clients) + " clients but only " +
        std::to_string(n_items) +
        " examples; use fewer clients (or, in cohort-sim, data.partition = sample:M)");
  }
}

// sample:M has no stored form: its rows are computed per client (ClientRows).
[[noreturn]] void no_stored_partition(const PartitionSpec& spec) {
  throw ConfigError("data.partition = " + spec.to_string() +
                    " has no stored partition: it is cohort-sim's (ClientRows)");
}

std::vector<std::uint32_t> iota_indices(std::size_t n) {
  std::vector<std::uint32_t> v(n);
  std::iota(v.begin(), v.end(), std::uint32_t{0});
  return v;
}

// Splits `values` at floor(len * cumsum(p)) (the last piece takes the rest), appending piece j to
// out[j]: numpy's split((cumsum(p) * len).astype(int)[:-1]), as NIID-Bench does.
void split_by_proportions(std::span<const std::uint32_t> values, const std::vector<double>& p,
                          Partition& out) {
  const double len = static_cast<double>(values.size());
  double cumulative = 0.0;
  std::size_t begin = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    std::size_t end = values.size();
    if (j + 1 < p.size()) {
      cumulative += p[j];
      end = std::clamp(static_cast<std::size_t>(cumulative * len), begin, values.size());
    }
    out[j].insert(out[j].end(), values.begin() + static_cast<std::ptrdiff_t>(begin),
                  values.begin() + static_cast<std::ptrdiff_t>(end));
    begin = end;
  }
}

std::size_t num_classes_of(std::span<const std::int32_t> labels) {
  std::int32_t max_label = -1;
  for (const auto l : labels) {
    if (l < 0) throw DataError("partition: negative label " + std::to_string(l));
    max_label = std::max(max_label, l);
  }
  return static_cast<std::size_t>(max_label + 1);
}

}  // namespace

std::string PartitionSpec::to_string() const {
  switch (kind) {
    case PartitionKind::kIid: return "iid";
    case PartitionKind::kShards: return "shards:" + format_number(shards_per_client);
    case PartitionKind::kDirichlet: {
      std::string out = "dirichlet:" + format_number(alpha);
      if (min_size != 10) out.append(":").append(std::to_string(min_size));
      return out;
    }
    case PartitionKind::kQuantity: return "quantity:" + format_number(beta);
    case PartitionKind::kSample: return "sample:" + std::to_string(sample_size);
  }
  return "?";
}

PartitionSpec parse_partition_spec(std::string_view spec, bool simulation) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == spec.npos ? spec.npos : colon - start));
    if (colon == spec.npos) break;
    start = colon + 1;
  }
  const std::string_view name = parts[0];
  PartitionSpec out;
  auto max_params = [&](std::size_t n) {
    if (parts.size() > n + 1) bad_spec(spec, "too many parameters");
  };
  if (name == "iid") {
    max_params(0);
    out.kind = PartitionKind::kIid;
  } else if (name == "shards") {
    max_params(1);
    out.kind = PartitionKind::kShards;
    if (parts.size() > 1) {
      out.shards_per_client = parse_number(spec, parts[1], "shards per client");
      if (out.shards_per_client < 1 || out.shards_per_client != std::floor(out.shards_per_client) ||
          out.shards_per_client > 1e6) {
        bad_spec(spec, "shards per client must be an integer >= 1");
      }
    }
  } else if (name == "dirichlet") {
    max_params(2);
    out.kind = PartitionKind::kDirichlet;
    if (parts.size() > 1) out.alpha = parse_number(spec, parts[1], "alpha");
    if (!(out.alpha > 0)) bad_spec(spec, "alpha must be > 0");
    if (parts.size() > 2) {
      const double m = parse_number(spec, parts[2], "min size");
      if (m < 0 || m != std::floor(m) || m > 1e12) {
        bad_spec(spec, "min size must be a non-negative integer");
      }
      out.min_size = static_cast<std::size_t>(m);
    }
  } else if (name == "quantity") {
    max_params(1);
    out.kind = PartitionKind::kQuantity;
    if (parts.size() > 1) out.beta = parse_number(spec, parts[1], "beta");
    if (!(out.beta > 0)) bad_spec(spec, "beta must be > 0");
  } else if (name == "sample") {
    if (parts.size() != 2) bad_spec(spec, "sample needs its M, the examples per client (sample:M)");
    out.kind = PartitionKind::kSample;
    const double m = parse_number(spec, parts[1], "examples per client");
    if (m < 1 || m != std::floor(m) || m > 4e9) {
      bad_spec(spec, "the examples per client must be an integer >= 1");
    }
    out.sample_size = static_cast<std::size_t>(m);
    if (!simulation) {
      bad_spec(spec,
               "sample:M lets clients share examples, which only a simulation may (cohort-sim); "
               "a client of a real federation trains on its own part");
    }
  } else {
    bad_spec(spec, "unknown partitioner '" + std::string(name) + "'");
  }
  return out;
}

Partition partition_iid(std::size_t n_items, std::size_t n_clients, std::uint64_t seed) {
  check_clients(n_items, n_clients, "iid partition");
  auto indices = iota_indices(n_items);
  Rng rng(seed);
  rng.shuffle(std::span<std::uint32_t>(indices));
  // numpy.array_split: the first N mod n clients get one extra example.
  Partition out(n_clients);
  const std::size_t base = n_items / n_clients;
  const std::size_t extra = n_items % n_clients;
  std::size_t begin = 0;
  for (std::size_t j = 0; j < n_clients; ++j) {
    const std::size_t size = base + (j < extra ? 1 : 0);
    out[j].assign(indices.begin() + static_cast<std::ptrdiff_t>(begin),
                  indices.begin() + static_cast<std::ptrdiff_t>(begin + size));
    begin += size;
  }
  return out;
}

Partition partition_shards(std::span<const std::int32_t> labels, std::size_t n_clients,
                           std::size_t shards_per_client, std::uint64_t seed) {
  const std::size_t n_items = labels.size();
  if (shards_per_client == 0)
    throw ConfigError("shards partition: need at least 1 shard per client");
  check_clients(n_items, n_clients, "shards partition");
  const std::size_t n_shards = n_clients * shards_per_client;
  if (n_shards > n_items) {
    throw ConfigError("shards partition: " + std::to_string(n_shards) + " shards but only " +
                      std::to_string(n_items) + " examples; use fewer clients or shards");
  }
  // Stable: equal labels keep index order, so the result depends only on the labels and seed.
  auto sorted = iota_indices(n_items);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return labels[a] < labels[b]; });
  // Shard k is [floor(k N / S), floor((k + 1) N / S)): equal when S divides N, else within one.
  std::vector<std::uint64_t> shard_ids(n_shards);
  std::iota(shard_ids.begin(), shard_ids.end(), std::uint64_t{0});
  Rng rng(seed);
  rng.shuffle(std::span<std::uint64_t>(shard_ids));
  Partition out(n_clients);
  for (std::size_t j = 0; j < n_clients; ++j) {
    for (std::size_t s = 0; s < shards_per_client; ++s) {
      const std::uint64_t k = shard_ids[j * shards_per_client + s];
      const std::size_t begin = k * n_items / n_shards;
      const std::size_t end = (k + 1) * n_items / n_shards;
      out[j].insert(out[j].end(), sorted.begin() + static_cast<std::ptrdiff_t>(begin),
                    sorted.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return out;
}

Partition partition_dirichlet(std::span<const std::int32_t> labels, std::size_t n_clients,
                              double alpha, std::uint64_t seed, std::size_t min_size,
                              std::size_t max_draws) {
  const std::size_t n_items = labels.size();
  if (!(alpha > 0)) throw ConfigError("dirichlet partition: alpha must be > 0");
  check_clients(n_items, n_clients, "dirichlet partition");
  if (min_size * n_clients > n_items) {
    throw ConfigError("dirichlet partition: " + std::to_string(n_clients) +
                      " clients of at least " + std::to_string(min_size) + " examples need " +
                      std::to_string(min_size * n_clients) + ", but there are only " +
                      std::to_string(n_items));
  }
  const std::size_t n_classes = num_classes_of(labels);
  std::vector<std::vector<std::uint32_t>> by_class(n_classes);
  for (std::size_t i = 0; i < n_items; ++i) {
    by_class[static_cast<std::size_t>(labels[i])].push_back(static_cast<std::uint32_t>(i));
  }
  Rng rng(seed);
  Partition out(n_clients);
  std::vector<bool> eligible(n_clients);
  for (std::size_t draw = 0; draw < max_draws; ++draw) {
    for (auto& client : out) client.clear();
    for (auto& members : by_class) {
      rng.shuffle(std::span<std::uint32_t>(members));
      // "Balance": a client already holding >= N/n examples gets no more.
      bool any = false;
      for (std::size_t j = 0; j < n_clients; ++j) {
        eligible[j] = out[j].size() * n_clients < n_items;
        any = any || eligible[j];
      }
      COHORT_CHECK(any) << "every client full before all classes were placed";
      split_by_proportions(members, rng.dirichlet(n_clients, alpha, eligible), out);
    }
    std::size_t smallest = n_items;
    for (const auto& client : out) smallest = std::min(smallest, client.size());
    if (smallest >= min_size) return out;
  }
  throw ConfigError("dirichlet partition: no draw in " + std::to_string(max_draws) +
                    " gave every one of " + std::to_string(n_clients) + " clients at least " +
                    std::to_string(min_size) + " examples at alpha=" + format_number(alpha) +
                    "; raise alpha, use fewer clients or lower the min size (dirichlet:ALPHA:MIN)");
}

Partition partition_quantity(std::size_t n_items, std::size_t n_clients, double beta,
                             std::uint64_t seed, std::size_t max_draws) {
  constexpr double kMinSize = 10;
  if (!(beta > 0)) throw ConfigError("quantity partition: beta must be > 0");
  check_clients(n_items, n_clients, "quantity partition");
  if (static_cast<double>(n_items) < kMinSize * static_cast<double>(n_clients)) {
    throw ConfigError("quantity partition: " + std::to_string(n_clients) +
                      " clients of at least 10 examples need more than the " +
                      std::to_string(n_items) + " there are");
  }
  Rng rng(seed);
  auto indices = iota_indices(n_items);
  rng.shuffle(std::span<std::uint32_t>(indices));
  const auto n = static_cast<double>(n_items);
  for (std::size_t draw = 0; draw < max_draws; ++draw) {
    const std::vector<double> q = rng.dirichlet(n_clients, beta);
    if (*std::min_element(q.begin(), q.end()) * n < kMinSize) continue;
    Partition out(n_clients);
    split_by_proportions(indices, q, out);
    return out;
  }
  throw ConfigError("quantity partition: no draw in " + std::to_string(max_draws) +
                    " gave every one of " + std::to_string(n_clients) +
                    " clients at least 10 examples at beta=" + format_number(beta) +
                    "; raise beta or use fewer clients");
}

std::vector<std::vector<std::size_t>> label_histogram(const Partition& partition,
                                                      std::span<const std::int32_t> labels,
                                                      std::size_t num_classes) {
  std::vector<std::vector<std::size_t>> counts(partition.size(),
                                               std::vector<std::size_t>(num_classes, 0));
  for (std::size_t j = 0; j < partition.size(); ++j) {
    for (const auto i : partition[j]) {
      const auto label = static_cast<std::size_t>(labels[i]);
      if (label < num_classes) ++counts[j][label];
    }
  }
  return counts;
}

std::vector<std::uint32_t> sample_rows(std::size_t n_items, std::size_t m, std::uint64_t seed,
                                       std::uint64_t client) {
  COHORT_CHECK(m >= 1 && m <= n_items) << "sample_rows: m out of range";
  // Floyd: for j = n - m .. n - 1, take t uniform in [0, j], or j itself if t is taken already.
  // M is small (tens to hundreds): a linear membership test beats a hash set.
  Rng rng = Rng::for_stream(seed, client);
  std::vector<std::uint32_t> out;
  out.reserve(m);
  for (std::size_t j = n_items - m; j < n_items; ++j) {
    const auto t = static_cast<std::uint32_t>(rng.below(j + 1));
    const bool taken = std::find(out.begin(), out.end(), t) != out.end();
    out.push_back(taken ? static_cast<std::uint32_t>(j) : t);
  }
  return out;
}

ClientRows::ClientRows(const PartitionSpec& spec, const Dataset& data, std::size_t n_clients,
                       std::uint64_t seed)
    : clients_(n_clients) {
  if (spec.kind != PartitionKind::kSample) {
    stored_ = make_partition(spec, data, n_clients, seed);
    return;
  }
  if (n_clients == 0) throw ConfigError("sample partition: need at least one client");
  if (spec.sample_size > data.size()) {
    throw ConfigError("data.partition = " + spec.to_string() + ": " +
                      std::to_string(spec.sample_size) + " examples per client but the data set " +
                      "has only " + std::to_string(data.size()));
  }
  sample_ = spec.sample_size;
  items_ = data.size();
  seed_ = seed;
  COHORT_LOG(Info) << "partition spec=" << spec.to_string() << " clients=" << n_clients
                   << " examples=" << data.size() << " seed=" << seed
                   << " (drawn per client when it trains; clients share examples)";
}

std::span<const std::uint32_t> ClientRows::rows(std::size_t client,
                                                std::vector<std::uint32_t>& scratch) const {
  if (sample_ == 0) return stored_[client];
  scratch = sample_rows(items_, sample_, seed_, client);
  return scratch;
}

Partition make_partition(const PartitionSpec& spec, std::span<const std::int32_t> labels,
                         std::size_t n_clients, std::uint64_t seed) {
  Partition out;
  switch (spec.kind) {
    case PartitionKind::kSample: no_stored_partition(spec);
    case PartitionKind::kIid: out = partition_iid(labels.size(), n_clients, seed); break;
    case PartitionKind::kShards:
      out = partition_shards(labels, n_clients, static_cast<std::size_t>(spec.shards_per_client),
                             seed);
      break;
    case PartitionKind::kDirichlet:
      out = partition_dirichlet(labels, n_clients, spec.alpha, seed, spec.min_size);
      break;
    case PartitionKind::kQuantity:
      out = partition_quantity(labels.size(), n_clients, spec.beta, seed);
      break;
  }
  if (log_enabled(LogLevel::Info)) {
    const std::size_t n_classes = num_classes_of(labels);
    const auto hist = label_histogram(out, labels, n_classes);
    std::vector<std::size_t> sizes;
    double distinct = 0;
    for (std::size_t j = 0; j < out.size(); ++j) {
      sizes.push_back(out[j].size());
      distinct += static_cast<double>(
          std::count_if(hist[j].begin(), hist[j].end(), [](std::size_t c) { return c > 0; }));
    }
    std::sort(sizes.begin(), sizes.end());
    COHORT_LOG(Info) << "partition spec=" << spec.to_string() << " clients=" << out.size()
                     << " examples=" << labels.size() << " seed=" << seed
                     << " size_min=" << sizes.front() << " size_median=" << sizes[sizes.size() / 2]
                     << " size_max=" << sizes.back()
                     << " labels_per_client=" << distinct / static_cast<double>(out.size());
    if (log_enabled(LogLevel::Debug)) {
      for (std::size_t j = 0; j < out.size(); ++j) {
        std::ostringstream line;
        for (std::size_t c = 0; c < n_classes; ++c) line << (c ? "," : "") << hist[j][c];
        COHORT_LOG(Debug) << "partition client=" << j << " size=" << out[j].size()
                          << " label_histogram=[" << line.str() << "]";
      }
    }
  }
  return out;
}

Partition make_partition(const PartitionSpec& spec, const Dataset& data, std::size_t n_clients,
                         std::uint64_t seed) {
  if (!data.is_regression()) return make_partition(spec, data.labels(), n_clients, seed);
  Partition out;
  switch (spec.kind) {
    case PartitionKind::kIid: out = partition_iid(data.size(), n_clients, seed); break;
    case PartitionKind::kQuantity:
      out = partition_quantity(data.size(), n_clients, spec.beta, seed);
      break;
    case PartitionKind::kSample: no_stored_partition(spec);
    case PartitionKind::kShards:
    case PartitionKind::kDirichlet:
      throw ConfigError("data.partition = " + spec.to_string() +
                        " splits the examples by class label, and regression targets "
                        "(train.loss = mse) have none: use iid or quantity:BETA");
  }
  COHORT_LOG(Info) << "partition spec=" << spec.to_string() << " clients=" << out.size()
                   << " examples=" << data.size() << " seed=" << seed << " (regression targets)";
  return out;
}

}  // namespace cohort::client
