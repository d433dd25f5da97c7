// cohort-server: one parameter-server shard; shard 0 also coordinates the federation.
#include <csignal>
#include <cstdio>

#include "cohort/aggregation/plugin.h"
#include "cohort/aggregation/registries.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/server/server.h"
#include "cohort/transport/allocator.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  const cohort::ConfigSchema schema = cohort::server::config_schema();
  CLI::App app{
      "cohort-server: a parameter-server shard of a Cohort federation. Shard 0 also runs\n"
      "the coordinator (membership, rounds, deadlines, evaluation, metrics.jsonl).\n"
      "TLS is on by default: give tls.ca_file, tls.cert_file and tls.key_file (make them\n"
      "with cohort-keygen), or --insecure for plaintext. Rules not built in come from\n"
      "--plugin FILE.so (see cohort/aggregation/plugin.h) and are picked by name like\n"
      "the built-ins, e.g. --aggregator.name=my_rule."};
  cohort::ConfigFlags flags;
  std::vector<std::string> plugins;
  std::string shard, shards, listen, coordinator, port_file, name;
  bool insecure = false;
  app.add_option("--shard", shard, "this shard's index (server.shard)");
  app.add_option("--shards", shards, "number of shards (server.shards)");
  app.add_option("--listen", listen, "url to bind, e.g. tcp://0.0.0.0:7000 (server.listen)");
  app.add_option("--coordinator", coordinator, "shards > 0: url of shard 0 (server.coordinator)");
  app.add_option("--port-file", port_file, "write the bound port here (server.port_file)");
  app.add_option("--name", name, "node id, the certificate's CN (server.name)");
  app.add_flag("--insecure", insecure, "plaintext transport (tls.insecure)");
  app.add_option("--plugin", plugins,
                 "load a plug-in (repeatable, in order): a shared object exporting "
                 "cohort_plugin_abi() and cohort_register(); its rules join the built-ins before "
                 "the server starts, a name already taken is an error")
      ->type_name("FILE.so");
  cohort::add_config_flags(app, flags, schema);
  CLI11_PARSE(app, argc, argv);
  try {
    auto add = [&](const char* key, const std::string& v) {
      if (!v.empty()) flags.overrides.push_back(std::string(key) + "=" + v);
    };
    add("server.shard", shard);
    add("server.shards", shards);
    add("server.listen", listen);
    add("server.coordinator", coordinator);
    add("server.port_file", port_file);
    add("server.name", name);
    if (insecure) flags.overrides.push_back("tls.insecure=true");
    cohort::Config config = cohort::finish_config(app, flags, schema);
    if (flags.print_config) {
      std::fputs(config.dump().c_str(), stdout);
      return 0;
    }
    COHORT_LOG(Debug) << "effective configuration:\n" << config.dump();
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    auto registries = cohort::builtin_registries();
    for (const std::string& plugin : plugins) {
      cohort::load_plugin(plugin, registries);
      COHORT_LOG(Info) << "loaded plug-in " << plugin;
    }
    return cohort::server::run(config, registries, g_stop);
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "cohort-server: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-server: unexpected error: %s\n", e.what());
    return 1;
  }
}
