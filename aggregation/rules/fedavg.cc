#include "cohort/aggregation/fedavg.h"

#include <algorithm>
#include <cmath>

#include "builtins.h"
#include "cohort/core/error.h"
#include "cohort/kernels/primitives.h"

namespace cohort::aggregation {

void FedAvg::begin_round(std::uint64_t /*round*/, std::size_t size) {
  size_ = size;
  sum_.assign(size, 0.0);  // same size every round: no reallocation after the first
  clients_.clear();
  completed_ = 0;
}

Verdict FedAvg::accept(const UpdateChunk& chunk) {
  if (chunk.offset > size_ || chunk.values.size() > size_ - chunk.offset) return Verdict::kRejected;
  if (!(chunk.weight > 0) || !std::isfinite(chunk.weight)) return Verdict::kRejected;
  auto [it, fresh] = clients_.try_emplace(chunk.client);
  Contribution& c = it->second;
  if (fresh) c.weight = chunk.weight;
  if (c.ended || c.weight != chunk.weight || chunk.offset != c.prefix_end)
    return Verdict::kRejected;
  // Checked and summed block by block, each block summed while it is still in L1 after its check
  // (an update arrives from another core's cache; reading it twice cost as much as the sum). A
  // non-finite value rejects the chunk and leaves the client's prefix ending at its block, so
  // coordinates [0, prefix_end) are still exactly those summed in.
  constexpr std::size_t kBlock = 4096;  // 16 KiB of floats
  const double w = chunk.weight;
  for (std::size_t at = 0; at < chunk.values.size(); at += kBlock) {
    const auto block = chunk.values.subspan(at, std::min(kBlock, chunk.values.size() - at));
    if (!kernels::all_finite(block)) return Verdict::kRejected;
    double* sum = sum_.data() + chunk.offset + at;
    const float* v = block.data();
    for (std::size_t i = 0; i < block.size(); ++i) sum[i] += w * static_cast<double>(v[i]);
    c.prefix_end += block.size();
  }
  return Verdict::kAccepted;
}

void FedAvg::end_update(ClientId client, bool complete) {
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.ended) return;
  it->second.ended = true;
  if (complete && it->second.prefix_end == size_) ++completed_;
}

bool FedAvg::finish_round(std::span<float> out) {
  COHORT_CHECK(out.size() == size_) << "out has " << out.size() << " elements, range " << size_;
  // The weight behind coordinate i is the sum over clients whose prefix passes i: a step
  // function, walked from the end with the clients sorted by prefix length.
  std::vector<std::pair<std::size_t, double>> ends;
  for (const auto& [id, c] : clients_) {
    if (c.prefix_end > 0) ends.emplace_back(c.prefix_end, c.weight);
  }
  if (ends.empty()) return false;
  std::sort(ends.begin(), ends.end());
  double weight = 0;
  for (const auto& e : ends) weight += e.second;
  std::size_t begin = 0;
  for (const auto& [end, w] : ends) {
    const double inv = 1.0 / weight;
    for (std::size_t i = begin; i < end; ++i) out[i] = static_cast<float>(sum_[i] * inv);
    begin = std::max(begin, end);
    weight -= w;
  }
  for (std::size_t i = begin; i < size_; ++i) out[i] = 0.0f;
  return true;
}

void detail::add_fedavg_aggregator(AggregatorRegistry& registry) {
  registry.add("fedavg", [](const ConfigSection& options) {
    const std::string_view known[] = {"name"};
    options.require_known(known);
    return std::make_unique<FedAvg>();
  });
}

}  // namespace cohort::aggregation
