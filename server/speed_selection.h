// server.selection = speed_aware (docs/ALGORITHMS.md "Selection that uses the profile"): the
// coordinator draws a federated round's cohort so that no client waits long for its turn, and
// over-selects only as far as the clients drawn are expected to fall short. Pure functions over
// the coordinator's per-client counts: no clock, no I/O. Internal to the server library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace cohort::server {

// What the coordinator knows of one client it may select.
struct SelectionCandidate {
  std::uint64_t selected = 0;        // rounds it was selected for (this run)
  std::uint64_t completed = 0;       // of those, rounds whose update it completed in time
  std::uint64_t since_selected = 0;  // rounds since it was last selected (all of them: never)
};

// The share of its rounds a client is expected to complete: (completed + 1) / (selected + 2),
// Laplace's rule, 1/2 for a client never selected. Under server.work = deadline a client
// completes when its profile predicted its round well, so this is how far its profile can be
// trusted.
double expected_completion(const SelectionCandidate& c);

// The draw weight: 1 + since_selected x k / n, for a cohort of k out of n candidates. Uniform
// sampling leaves a client unselected for about n / k rounds on average; past that its weight
// grows linearly, so a client (slow, or unlucky) waits a bounded time in distribution.
double fairness_weight(const SelectionCandidate& c, std::size_t k, std::size_t n);

// Indices into `candidates`, sorted: candidates are drawn without replacement with
// fairness_weight() (Efraimidis-Spirakis keys u^(1/w) from `rng`) and taken in draw order until
// their expected_completion() sums to at least k, or `cap` are taken (cap >= k: ceil(k x
// server.overselect)); never fewer than k (or all candidates, when fewer).
std::vector<std::size_t> speed_aware_selection(std::span<const SelectionCandidate> candidates,
                                               std::size_t k, std::size_t cap,
                                               std::mt19937_64& rng);

}  // namespace cohort::server
