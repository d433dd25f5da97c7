// The rule built into the user's own server program, which embeds Cohort's shard through
// cohort::server::run(): the same flags and config keys as cohort-server, one more rule.
#include <atomic>
#include <csignal>
#include <cstdio>

#include "cohort/aggregation/registries.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"
#include "cohort/transport/allocator.h"
#include "geometric_median.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // as cohort-server does
  const cohort::ConfigSchema schema = cohort::server::config_schema();
  CLI::App app{
      "geomedian-server: a Cohort parameter-server shard that also knows the\n"
      "geometric_median aggregator (--aggregator.name=geometric_median)."};
  cohort::ConfigFlags flags;
  cohort::add_config_flags(app, flags, schema);
  CLI11_PARSE(app, argc, argv);
  try {
    const cohort::Config config = cohort::finish_config(app, flags, schema);
    auto registries = cohort::builtin_registries();
    custom::add_geometric_median(registries.aggregators);  // the one line a new rule needs
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    return cohort::server::run(config, registries, g_stop);
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "geomedian-server: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "geomedian-server: unexpected error: %s\n", e.what());
    return 1;
  }
}
