// The rules in your own program, without a server: cohort::aggregation::FederatedStep aggregates
// each round's (update, weight) list with a named rule (here the geometric median this folder
// adds, and a built-in one) and applies a named server optimizer. Exits non-zero if a result is
// not what it should be; run.sh runs it against the installed package.
#include <cmath>
#include <cstdio>
#include <vector>

#include "cohort/aggregation/federated_step.h"
#include "cohort/core/error.h"
#include "geometric_median.h"

int main() {
  try {
    auto registries = cohort::builtin_registries();
    custom::add_geometric_median(registries.aggregators);
    // Three honest clients near (1, 1) and one far off: the geometric median stays near the honest
    // ones; FedAvg would move by a quarter of the outlier.
    const std::vector<float> a{1.0f, 1.1f}, b{0.9f, 1.0f}, c{1.1f, 0.9f}, outlier{50.0f, -50.0f};
    const std::vector<cohort::aggregation::WeightedUpdate> round{{a}, {b}, {c}, {outlier}};
    std::vector<float> model{0.0f, 0.0f};
    cohort::aggregation::FederatedStep robust(model.size(), {.rule = "geometric_median"},
                                              registries);
    for (int r = 0; r < 3; ++r) robust.apply(model, round);
    std::printf("geometric median + sgd, 3 rounds: model (%.3f, %.3f)\n", model[0], model[1]);
    if (std::abs(model[0] - 3.0f) > 0.6f || std::abs(model[1] - 3.0f) > 0.6f) return 1;

    std::vector<float> averaged{0.0f, 0.0f};
    cohort::aggregation::FederatedStep fedavg(averaged.size(), {});
    fedavg.apply(averaged, round);
    std::printf("fedavg + sgd, 1 round: model (%.3f, %.3f)\n", averaged[0], averaged[1]);
    if (std::abs(averaged[0] - 13.25f) > 1e-3f) return 1;

    try {  // a refusal says why
      fedavg.apply(averaged, {});
      return 1;
    } catch (const cohort::DataError& e) {
      std::printf("refused: %s\n", e.what());
    }
    return 0;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "federated_step_demo: %s\n", e.what());
    return 1;
  }
}
