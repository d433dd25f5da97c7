// cohort-client: a federated client that trains on its own data partition.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cohort/client/local_training.h"
#include "cohort/client/participant.h"
#include "cohort/client/peer.h"
#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/memory_plan.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/transport/allocator.h"

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }
// --print-plan: the measured memory model of `model` on this device and the plan for
// client.memory_budget, without joining anything.
int print_plan(const cohort::client::ParticipantOptions& o, const std::string& model,
               std::size_t batch, const std::string& optimizer) {
  namespace k = cohort::kernels;
  k::OptimizerOptions opt;
  if (optimizer == "momentum") {
    opt.momentum = 0.9f;
  } else {
    opt.kind = k::parse_optimizer_kind(optimizer);
  }
  const auto device = k::make_device(o.device, {.threads = o.threads});
  const auto plan =
      k::plan_memory(k::make_network_spec(model), *device, opt, batch, o.memory_budget, model);
  std::fputs(k::describe(plan, model).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  cohort::ConfigSchema schema = cohort::client::participant_config_schema();
  cohort::client::add_peer_config(schema);
  CLI::App app{
      "cohort-client: joins a Cohort federation, trains on its partition of\n"
      "Fashion-MNIST each round it is selected for, and pushes its update to every shard."};
  cohort::ConfigFlags flags;
  std::string server, data, part, device, name, mode;
  bool insecure = false;
  app.add_option("--server", server,
                 "url of the coordinator, e.g. tcp://host:7000 (client.server)");
  app.add_option("--data", data,
                 "partition spec: iid, dirichlet:0.5, shards:2, quantity:0.5 (data.partition)");
  app.add_option("--part", part, "which part of the partition: I/N (data.part)");
  app.add_option("--device", device, "cpu or cuda:0 (client.device)");
  app.add_option("--name", name, "node id, the certificate's CN (client.name)");
  app.add_flag("--insecure", insecure, "plaintext transport (tls.insecure)");
  app.add_option("--mode", mode, "federated or decentralized (client.mode)");
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins,
                 "load local training rules from this shared object (repeatable): it defines "
                 "cohort_plugin_abi() and cohort_register_client(); the coordinator's train.rule "
                 "picks one by name (cohort/client/local_training.h, examples/custom_trainer)");
  bool plan = false;
  std::string plan_model = "mlp:784-256-128-10", plan_optimizer = "sgd";
  std::size_t plan_batch = 64;
  app.add_flag("--print-plan", plan,
               "print the measured training-memory model of --model at --batch on this device "
               "(client.device, client.threads) and the plan for client.memory_budget, then exit "
               "(1, naming the minimum budget, if the model cannot fit)");
  app.add_option("--model", plan_model,
                 "--print-plan only: the model (online, the coordinator's model applies)")
      ->capture_default_str();
  app.add_option("--batch", plan_batch,
                 "--print-plan only: the batch (online, the coordinator's train.batch_size)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", plan_optimizer,
                 "--print-plan only: sgd, momentum (sgd with momentum), adam or adamw: its state "
                 "takes 0, 1, 2, 2 floats per parameter")
      ->capture_default_str();
  cohort::add_config_flags(app, flags, schema);
  CLI11_PARSE(app, argc, argv);
  try {
    auto add = [&](const char* key, const std::string& v) {
      if (!v.empty()) flags.overrides.push_back(std::string(key) + "=" + v);
    };
    add("client.server", server);
    add("data.partition", data);
    add("data.part", part);
    add("client.device", device);
    add("client.name", name);
    add("client.mode", mode);
    if (insecure) flags.overrides.push_back("tls.insecure=true");
    cohort::Config config = cohort::finish_config(app, flags, schema);
    if (flags.print_config) {
      std::fputs(config.dump().c_str(), stdout);
      return 0;
    }
    if (plan) {
      return print_plan(cohort::client::participant_options_from(config), plan_model, plan_batch,
                        plan_optimizer);
    }
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    const std::string m = config.get_string("client.mode");
    // The edge: the Config becomes typed, checked options here and nowhere else.
    if (m == "decentralized") {
      if (!plugins.empty()) {
        throw cohort::ConfigError(
            "--plugin: local training rules run in federated mode only (client.mode = "
            "decentralized trains with the stock rule)");
      }
      return cohort::client::run_peer(cohort::client::peer_options_from(config), g_stop);
    }
    if (m != "federated") {
      throw cohort::ConfigError("client.mode must be federated or decentralized, got '" + m + "'");
    }
    auto rules = cohort::client::builtin_local_training();
    for (const std::string& plugin : plugins) cohort::client::load_client_plugin(plugin, rules);
    return cohort::client::run_participant(cohort::client::participant_options_from(config), g_stop,
                                           rules);
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "cohort-client: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-client: unexpected error: %s\n", e.what());
    return 1;
  }
}
