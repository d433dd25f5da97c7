// cohort-decentralized-sim: N decentralized peers in one process (one thread each, in-memory
// Comm), the same data split, steps and learning rate for every algorithm, and one JSON line per
// algorithm with the test accuracy of the nodes' average model and of the nodes themselves.
//
//   cohort-decentralized-sim --nodes 16 --topology ring --partition dirichlet:0.1
//       --algos dpsgd,dsgdm,qg_dsgdm --steps 1500 --lr 0.05
//   cohort-decentralized-sim --config examples/sim/decentralized_ring.toml
//   cohort-decentralized-sim --nodes 4 --topology random_regular --topology-option degree=2
//       --algos choco --compressor topk --compressor-option k_fraction=0.1
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cohort/aggregation/decentralized.h"
#include "cohort/client/idx.h"
#include "cohort/client/partition.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "peer_learner.h"

using namespace cohort;
namespace agg = cohort::aggregation;

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort-decentralized-sim: decentralized training of N in-process peers"};
  std::size_t nodes = 16, steps = 1500, batch = 32, eval_every = 0;
  double lr = 0.05, momentum = 0.9, mu = 0.9, weight_decay = 0.0, gamma = 0.5;
  std::string topology = "ring", partition = "dirichlet:0.1", algos = "dpsgd,dsgdm,qg_dsgdm";
  std::string model = "mlp:784-256-128-10", data_dir(client::kFashionMnistDir);
  std::string compressor = "none", allreduce = "ring";
  std::vector<std::string> topology_opts, compressor_opts;
  std::uint64_t seed = 1, staleness = 0;
  app.add_option("--nodes", nodes, "number of peers");
  app.add_option("--topology", topology,
                 "ring, torus, exponential, one_peer_exponential, complete, "
                 "random_regular, time_varying");
  app.add_option("--partition", partition, "iid, dirichlet:ALPHA, shards:S, quantity:BETA");
  app.add_option("--algos", algos, "comma-separated decentralized optimizers");
  app.add_option("--steps", steps, "steps per node (the same for every algorithm)");
  app.add_option("--batch", batch, "minibatch per node and step");
  app.add_option("--lr", lr, "learning rate (the same for every algorithm)");
  app.add_option("--momentum", momentum, "beta of the momentum methods");
  app.add_option("--mu", mu, "QG's slow-buffer factor mu");
  app.add_option("--weight-decay", weight_decay, "lambda");
  app.add_option("--gamma", gamma, "CHOCO's consensus step");
  app.add_option("--topology-option", topology_opts,
                 "KEY=VALUE for the topology (random_regular: degree, seed; torus: rows, cols; "
                 "time_varying: seed); repeatable");
  app.add_option("--compressor", compressor, "CHOCO's compressor (the only algorithm with one)");
  app.add_option("--compressor-option", compressor_opts,
                 "KEY=VALUE for CHOCO's compressor (k_fraction, k, s, ..., error_feedback = false "
                 "unless given); repeatable");
  app.add_option("--allreduce", allreduce,
                 "ring_allreduce's collective: ring, recursive_doubling or auto");
  app.add_option("--model", model, "model spec, e.g. mlp:784-256-128-10 or cnn:lenet5");
  app.add_option("--data", data_dir, "Fashion-MNIST folder");
  app.add_option("--seed", seed, "seed of the split, the batches and the initial model");
  app.add_option("--staleness", staleness,
                 "asynchronous gossip with this staleness bound (0: sync)");
  app.add_option("--eval-every", eval_every,
                 "also print the average model's accuracy every K steps");
  // Every option can also come from a TOML file (key = the option's long name, e.g. nodes = 16);
  // flags on the command line win. examples/sim/decentralized_ring.toml is one.
  app.set_config("--config", "", "read options from a TOML file (keys: the long option names)");
  // A key of the file that is no option is an error, as on the command line.
  app.allow_config_extras(CLI::config_extras_mode::error);
  CLI11_PARSE(app, argc, argv);
  try {
    set_log_level(LogLevel::Warn);
    const auto algo_list = split(algos);
    if (algo_list.empty()) throw ConfigError("--algos names no algorithm");
    auto any = [&](auto pred) { return std::any_of(algo_list.begin(), algo_list.end(), pred); };
    // An option that none of the algorithms takes would be silently ignored: refused instead.
    auto refuse_unless = [&](const char* flag, bool used) {
      if (app.count(flag) > 0 && !used) {
        throw ConfigError(std::string(flag) + " applies to none of --algos " + algos);
      }
    };
    const auto takes_momentum = [](const std::string& a) {
      return a.starts_with("dsgdm") || a.starts_with("qg") || a == "push_sum" || a == "sgp" ||
             a == "choco" || a == "ring_allreduce";
    };
    refuse_unless("--momentum", any(takes_momentum));
    refuse_unless("--mu", any([](const std::string& a) { return a.starts_with("qg"); }));
    refuse_unless("--gamma", any([](const std::string& a) { return a == "choco"; }));
    refuse_unless("--allreduce", any([](const std::string& a) { return a == "ring_allreduce"; }));
    const bool choco = any([](const std::string& a) { return a == "choco"; });
    if (!choco && (compressor != "none" || !compressor_opts.empty())) {
      throw ConfigError("--compressor and --compressor-option apply to choco only, which --algos " +
                        algos + " does not name");
    }
    // Each algorithm's settings as the [decentralized] section a rendezvous would send, checked
    // the same way (decentralized_settings_from): every option reaches its component.
    auto settings_for = [&](const std::string& algo) {
      ConfigSchema schema;
      schema.add_section("decentralized", "");
      Config c(schema);
      const auto set = [&](const std::string& key, const std::string& value) {
        c.set("decentralized." + key, value);
      };
      auto key_value = [](const std::string& kv, const char* flag) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) {
          throw ConfigError(std::string(flag) + " takes KEY=VALUE, got '" + kv + "'");
        }
        return std::pair{kv.substr(0, eq), kv.substr(eq + 1)};
      };
      set("peers", std::to_string(nodes));
      set("steps", std::to_string(steps));
      set("batch", std::to_string(batch));
      c.set_value("decentralized.lr", lr);
      set("partition", partition);
      set("staleness", std::to_string(staleness));
      set("algorithm", algo);
      set("topology", topology);
      for (const auto& kv : topology_opts) {
        const auto [k, v] = key_value(kv, "--topology-option");
        set("topology_options." + k, v);
      }
      if (takes_momentum(algo)) c.set_value("decentralized.momentum", momentum);
      if (algo.starts_with("qg")) c.set_value("decentralized.mu", mu);
      if (algo == "choco") {
        c.set_value("decentralized.gamma", gamma);
        set("compressor", compressor);
        for (const auto& kv : compressor_opts) {
          const auto [k, v] = key_value(kv, "--compressor-option");
          set("compressor_options." + k, v);
        }
      }
      if (algo == "ring_allreduce") set("allreduce", allreduce);
      c.set_value("decentralized.weight_decay", weight_decay);
      return agg::decentralized_settings_from(c.section("decentralized"), [](const std::string& p) {
        (void)client::parse_partition_spec(p);
      });
    };
    std::vector<agg::DecentralizedSettings> all_settings;
    for (const auto& algo : algo_list) all_settings.push_back(settings_for(algo));

    auto data = client::load_fashion_mnist(data_dir, /*standardize=*/true);
    const auto spec = kernels::make_network_spec(model);
    const auto parts = client::make_partition(client::parse_partition_spec(partition),
                                              data.train.labels(), nodes, seed);
    auto device = kernels::make_device("cpu", {.threads = 1});
    auto topo = agg::make_topology(all_settings.front());
    agg::DecentralizedOptimizerRegistry optimizers;
    agg::add_builtin_decentralized_optimizers(optimizers);
    const double rho = spectral_gap(topo->mixing(static_cast<Rank>(nodes), 0));

    for (const auto& settings : all_settings) {
      const std::string& algo = settings.algorithm;
      const auto q = agg::make_compressor(settings);
      InMemoryNetwork net(static_cast<Rank>(nodes));
      std::vector<std::unique_ptr<client::PeerLearner>> peers;
      for (std::size_t i = 0; i < nodes; ++i) {
        peers.push_back(std::make_unique<client::PeerLearner>(*device, spec, data.train, parts[i],
                                                              batch, seed * 1000003ULL + i, seed,
                                                              agg::make_optimizer(settings, q)));
      }
      std::vector<std::unique_ptr<agg::Gossip>> gossips;
      for (std::size_t i = 0; i < nodes; ++i) {
        agg::GossipOptions go;
        go.staleness = staleness;
        gossips.push_back(std::make_unique<agg::Gossip>(net.comm(static_cast<Rank>(i)), *topo, go));
      }
      std::vector<double> losses(nodes, 0.0);
      std::vector<std::string> errors(nodes);
      const auto t0 = std::chrono::steady_clock::now();
      auto average_model = [&] {
        std::vector<float> avg(spec.parameter_count(), 0.0f);
        for (auto& p : peers) {
          const auto m = p->model();
          for (std::size_t k = 0; k < avg.size(); ++k) avg[k] += m[k];
        }
        for (float& v : avg) v /= static_cast<float>(nodes);
        return avg;
      };
      const std::size_t chunks = eval_every > 0 ? (steps + eval_every - 1) / eval_every : 1;
      std::size_t done = 0;
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t until = eval_every > 0 ? std::min(steps, done + eval_every) : steps;
        {
          std::vector<std::jthread> threads;
          for (std::size_t i = 0; i < nodes; ++i) {
            threads.emplace_back([&, i] {
              try {
                agg::Gossip& gossip = *gossips[i];
                double sum = 0;
                for (std::size_t t = done; t < until; ++t) {
                  sum += peers[i]->step(t, static_cast<float>(lr), gossip);
                }
                losses[i] = sum / static_cast<double>(std::max<std::size_t>(1, until - done));
              } catch (const std::exception& e) {
                errors[i] = e.what();
              }
            });
          }
        }
        for (const auto& e : errors) {
          if (!e.empty()) throw Error("a peer failed: " + e);
        }
        done = until;
        if (eval_every > 0 && done < steps) {
          auto avg = average_model();
          auto learner = client::PeerLearner(*device, spec, data.train, parts[0], batch, 0, seed,
                                             optimizers.create("dpsgd", {}));
          std::copy(avg.begin(), avg.end(), learner.parameters().begin());
          nlohmann::json j{{"algo", algo},
                           {"step", done},
                           {"avg_model_accuracy", learner.evaluate(data.test).accuracy}};
          std::cout << j.dump() << std::endl;
        }
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Every node on the test set, and the average of the nodes' models.
      double mean_acc = 0, min_acc = 1;
      std::vector<std::vector<float>> models;
      for (auto& p : peers) {
        const double a = p->evaluate(data.test).accuracy;
        mean_acc += a / static_cast<double>(nodes);
        min_acc = std::min(min_acc, a);
        const auto m = p->model();
        models.emplace_back(m.begin(), m.end());
      }
      auto avg = average_model();
      auto learner = client::PeerLearner(*device, spec, data.train, parts[0], batch, 0, seed,
                                         optimizers.create("dpsgd", {}));
      std::copy(avg.begin(), avg.end(), learner.parameters().begin());
      const auto avg_eval = learner.evaluate(data.test);
      double train_loss = 0;
      for (double l : losses) train_loss += l / static_cast<double>(nodes);
      nlohmann::json j;
      j["experiment"] = "decentralized";
      j["algo"] = algo;
      j["nodes"] = nodes;
      j["topology"] = topology;
      j["spectral_gap"] = rho;
      j["partition"] = partition;
      j["model"] = model;
      j["steps"] = steps;
      if (staleness > 0) j["staleness"] = staleness;
      j["batch"] = batch;
      j["lr"] = lr;
      if (takes_momentum(algo)) j["momentum"] = momentum;
      if (algo == "choco") j["compressor"] = compressor;
      if (algo == "ring_allreduce") j["allreduce"] = allreduce;
      j["avg_model_test_accuracy"] = avg_eval.accuracy;
      j["mean_node_test_accuracy"] = mean_acc;
      j["min_node_test_accuracy"] = min_acc;
      j["consensus_distance"] = agg::consensus_distance(models);
      j["last_train_loss"] = train_loss;
      j["seconds"] = secs;
      std::cout << j.dump() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-decentralized-sim: %s\n", e.what());
    return 1;
  }
}
