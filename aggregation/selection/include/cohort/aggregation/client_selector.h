// Which clients join a round (the ClientSelector plug-in; docs/ALGORITHMS.md 1.1, 8.3).
//
// The coordinator describes every registered client (ClientInfo) and asks for `count` of them.
// Built-ins sample without replacement, never pick a client marked offline, and are deterministic:
// the same clients (in any order), count and seed give the same ids, on every platform. Pass a
// fresh seed per round (e.g. derived from the run seed and the round number). Selectors are
// immutable after construction: select() is const and thread-safe.
//
// Registry names and options:
//   uniform                   every online client equally likely (FedAvg's sampling, 1.1)
//   weighted                  successive sampling with probability proportional to num_samples
//                             (Efraimidis-Spirakis keys u^(1/w)); clients with 0 samples are
//                             never picked. Combined with sample-weighted averaging this counts
//                             data size twice: pair it with uniform averaging.
//   availability_aware        like weighted, with weight max(reliability, floor): prefers clients
//                             that finished their recent rounds, still gives flaky ones a chance.
//                             Option floor = 0.1, in (0, 1].
//   poisson  q (required)     each online client independently with probability q; count is
//                             ignored. The sampling the RDP accountant assumes
//                             (docs/ALGORITHMS.md 8.4).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/config.h"
#include "cohort/core/ids.h"

namespace cohort::aggregation {

struct ClientInfo {
  ClientId id = 0;
  std::uint64_t num_samples = 0;  // size of its data partition
  bool online = true;             // reachable now (registered, heartbeats current)
  double reliability = 1.0;       // in [0, 1]: share of its recent rounds it completed
};

class ClientSelector {
 public:
  virtual ~ClientSelector() = default;
  // At most `count` distinct ids of online clients, in increasing order (fewer when fewer are
  // eligible). REQUIRES distinct ids in `clients` (InternalError otherwise).
  [[nodiscard]] virtual std::vector<ClientId> select(std::span<const ClientInfo> clients,
                                                     std::size_t count,
                                                     std::uint64_t seed) const = 0;
};

using ClientSelectorFactory =
    std::function<std::unique_ptr<ClientSelector>(const ConfigSection& options)>;

class ClientSelectorRegistry {
 public:
  // Throws ConfigError if the name is taken.
  void add(std::string name, ClientSelectorFactory factory);
  // Throws ConfigError listing the known names if `name` is unknown, or naming a bad option.
  [[nodiscard]] std::unique_ptr<ClientSelector> create(std::string_view name,
                                                       const ConfigSection& options) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;

 private:
  std::map<std::string, ClientSelectorFactory, std::less<>> factories_;
};

void add_builtin_client_selectors(ClientSelectorRegistry& registry);

}  // namespace cohort::aggregation
