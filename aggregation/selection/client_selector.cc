// The client selector registry and the built-in selectors: uniform, weighted, availability_aware,
// poisson.
#include "cohort/aggregation/client_selector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "../registry_detail.h"
#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {
namespace {

// Online clients by increasing id, so that the caller's order does not matter.
std::vector<const ClientInfo*> eligible(std::span<const ClientInfo> clients) {
  std::vector<const ClientInfo*> out;
  out.reserve(clients.size());
  for (const auto& c : clients) {
    if (c.online) out.push_back(&c);
  }
  std::sort(out.begin(), out.end(),
            [](const ClientInfo* a, const ClientInfo* b) { return a->id < b->id; });
  for (std::size_t i = 1; i < out.size(); ++i) {
    COHORT_CHECK(out[i]->id != out[i - 1]->id) << "client " << out[i]->id << " listed twice";
  }
  return out;
}

std::vector<ClientId> sorted_ids(std::vector<ClientId> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

class UniformSelector final : public ClientSelector {
 public:
  std::vector<ClientId> select(std::span<const ClientInfo> clients, std::size_t count,
                               std::uint64_t seed) const override {
    auto pool = eligible(clients);
    const std::size_t n = std::min(count, pool.size());
    SplitMixRng rng(seed);
    // Partial Fisher-Yates: the first n slots become a uniform n-subset.
    std::vector<ClientId> out;
    for (std::size_t i = 0; i < n; ++i) {
      const auto j = i + static_cast<std::size_t>(rng.below(pool.size() - i));
      std::swap(pool[i], pool[j]);
      out.push_back(pool[i]->id);
    }
    return sorted_ids(std::move(out));
  }
};

// Weighted sampling without replacement (Efraimidis & Spirakis 2006): key_i = log(u_i) / w_i,
// keep the `count` largest keys; equivalent to drawing one at a time with probability
// proportional to weight among those left. Weight 0 is never drawn.
class WeightedSelector final : public ClientSelector {
 public:
  // by_reliability: weight max(reliability, floor) instead of num_samples.
  WeightedSelector(bool by_reliability, double floor)
      : by_reliability_(by_reliability), floor_(floor) {}
  std::vector<ClientId> select(std::span<const ClientInfo> clients, std::size_t count,
                               std::uint64_t seed) const override {
    const auto pool = eligible(clients);
    SplitMixRng rng(seed);
    std::vector<std::pair<double, ClientId>> keys;
    for (const ClientInfo* c : pool) {
      const double u = rng.uniform_open0();  // drawn for every client: keys stay aligned by id
      double w = by_reliability_ ? std::max(std::clamp(c->reliability, 0.0, 1.0), floor_)
                                 : static_cast<double>(c->num_samples);
      if (!(w > 0) || !std::isfinite(w)) continue;
      keys.emplace_back(std::log(u) / w, c->id);
    }
    const std::size_t n = std::min(count, keys.size());
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end(),
                      [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second < b.second);
                      });
    std::vector<ClientId> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(keys[i].second);
    return sorted_ids(std::move(out));
  }

 private:
  bool by_reliability_;
  double floor_;
};

class PoissonSelector final : public ClientSelector {
 public:
  explicit PoissonSelector(double q) : q_(q) {}
  std::vector<ClientId> select(std::span<const ClientInfo> clients, std::size_t /*count*/,
                               std::uint64_t seed) const override {
    const auto pool = eligible(clients);
    SplitMixRng rng(seed);
    std::vector<ClientId> out;
    for (const ClientInfo* c : pool) {
      if (rng.uniform() < q_) out.push_back(c->id);
    }
    return out;
  }

 private:
  double q_;
};

}  // namespace

void ClientSelectorRegistry::add(std::string name, ClientSelectorFactory factory) {
  detail::add_factory(factories_, std::move(name), std::move(factory), "client selector");
}
std::unique_ptr<ClientSelector> ClientSelectorRegistry::create(std::string_view name,
                                                               const ConfigSection& options) const {
  return detail::create_from(factories_, name, options, "client selector");
}
bool ClientSelectorRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}
std::string ClientSelectorRegistry::names() const { return detail::joined_names(factories_); }

void add_builtin_client_selectors(ClientSelectorRegistry& registry) {
  registry.add("uniform", [](const ConfigSection& o) {
    const std::string_view known[] = {"name"};
    o.require_known(known);
    return std::make_unique<UniformSelector>();
  });
  registry.add("weighted", [](const ConfigSection& o) {
    const std::string_view known[] = {"name"};
    o.require_known(known);
    return std::make_unique<WeightedSelector>(false, 0.0);
  });
  registry.add("availability_aware", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "floor"};
    o.require_known(known);
    const double floor = o.get_double("floor", 0.1);
    if (!(floor > 0 && floor <= 1)) throw ConfigError("selector.floor must be in (0, 1]");
    return std::make_unique<WeightedSelector>(true, floor);
  });
  registry.add("poisson", [](const ConfigSection& o) {
    const std::string_view known[] = {"name", "q"};
    o.require_known(known);
    if (!o.has("q")) throw ConfigError("selector: poisson needs q, the sampling probability");
    const double q = o.get_double("q", 0.0);
    if (!(q > 0 && q <= 1)) throw ConfigError("selector.q must be in (0, 1]");
    return std::make_unique<PoissonSelector>(q);
  });
}

}  // namespace cohort::aggregation
