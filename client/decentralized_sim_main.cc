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
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cohort/aggregation/decentralized.h"
#include "cohort/client/data_source.h"
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

bool takes_momentum(const std::string& a) {
  return a.starts_with("dsgdm") || a.starts_with("qg") || a == "push_sum" || a == "sgp" ||
         a == "choco" || a == "ring_allreduce";
}

// The command line (or --config TOML) as typed values.
struct Options {
  std::size_t nodes = 16, steps = 1500, batch = 32, eval_every = 0;
  double lr = 0.05, momentum = 0.9, mu = 0.9, weight_decay = 0.0, gamma = 0.5;
  std::string topology = "ring", partition = "dirichlet:0.1", algos = "dpsgd,dsgdm,qg_dsgdm";
  std::string model = "mlp:784-256-128-10", data_dir{client::kFashionMnistDir};
  std::string compressor = "none", allreduce = "auto";
  std::vector<std::string> topology_opts, compressor_opts;
  // Your own data: the data.* keys of cohort-client (client/data_source.h), as --data-KEY flags.
  std::map<std::string, std::string> data_keys;
  std::uint64_t seed = 1, staleness = 0;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--nodes", o.nodes, "number of peers");
  app.add_option("--topology", o.topology,
                 "ring, torus, exponential, one_peer_exponential, complete, "
                 "random_regular, time_varying");
  app.add_option("--partition", o.partition, "iid, dirichlet:ALPHA, shards:S, quantity:BETA");
  app.add_option("--algos", o.algos, "comma-separated decentralized optimizers");
  app.add_option("--steps", o.steps, "steps per node (the same for every algorithm)");
  app.add_option("--batch", o.batch, "minibatch per node and step");
  app.add_option("--lr", o.lr, "learning rate (the same for every algorithm)");
  app.add_option("--momentum", o.momentum, "beta of the momentum methods");
  app.add_option("--mu", o.mu, "QG's slow-buffer factor mu");
  app.add_option("--weight-decay", o.weight_decay, "lambda");
  app.add_option("--gamma", o.gamma, "CHOCO's consensus step");
  app.add_option("--topology-option", o.topology_opts,
                 "KEY=VALUE for the topology (random_regular: degree, seed; torus: rows, cols; "
                 "time_varying: seed); repeatable");
  app.add_option("--compressor", o.compressor, "CHOCO's compressor (the only algorithm with one)");
  app.add_option("--compressor-option", o.compressor_opts,
                 "KEY=VALUE for CHOCO's compressor (k_fraction, k, s, ..., error_feedback = false "
                 "unless given); repeatable");
  app.add_option("--allreduce", o.allreduce,
                 "ring_allreduce's collective: auto (by size and peers), ring, "
                 "halving_doubling or recursive_doubling")
      ->capture_default_str();
  app.add_option("--model", o.model, "model spec, e.g. mlp:784-256-128-10 or cnn:lenet5");
  app.add_option("--data", o.data_dir, "Fashion-MNIST folder");
  for (const char* key : {"format", "train", "test", "train-labels", "test-labels", "arrays",
                          "test-arrays", "label", "header", "delimiter", "shape", "scale"}) {
    std::string name = key;
    std::replace(name.begin(), name.end(), '-', '_');
    app.add_option_function<std::string>(
        std::string("--data-") + key,
        [&o, name](const std::string& v) { o.data_keys["data." + name] = v; },
        "data." + name +
            " of cohort-client (csv/npy files; --data-scale auto standardizes IDX "
            "pixels here, as before)");
  }
  app.add_option("--seed", o.seed, "seed of the split, the batches and the initial model");
  app.add_option("--staleness", o.staleness,
                 "asynchronous gossip with this staleness bound (0: sync)");
  app.add_option("--eval-every", o.eval_every,
                 "also print the average model's accuracy every K steps");
  // Every option can also come from a TOML file (key = the option's long name, e.g. nodes = 16);
  // flags on the command line win. examples/sim/decentralized_ring.toml is one.
  app.set_config("--config", "", "read options from a TOML file (keys: the long option names)");
  // A key of the file that is no option is an error, as on the command line.
  app.allow_config_extras(CLI::config_extras_mode::error);
}

// The data.* keys from the --data-KEY flags, checked as cohort-client checks them, and loaded.
client::TrainTest load_experiment_data(const Options& o) {
  ConfigSchema schema;
  schema.add("data.dir", std::string(client::kFashionMnistDir), "");
  client::add_data_source_keys(schema);
  Config config(schema);
  config.set("data.dir", o.data_dir);
  for (const auto& [key, value] : o.data_keys) config.set(key, value);
  return client::load_data(client::data_options_from(config),
                           {client::FeatureScaling::Kind::kStandardize, 1.0});
}

// An option that none of the algorithms takes would be silently ignored: refused instead.
void refuse_unused(const CLI::App& app, const Options& o,
                   const std::vector<std::string>& algo_list) {
  auto any = [&](auto pred) { return std::any_of(algo_list.begin(), algo_list.end(), pred); };
  auto refuse_unless = [&](const char* flag, bool used) {
    if (app.count(flag) > 0 && !used) {
      throw ConfigError(std::string(flag) + " applies to none of --algos " + o.algos);
    }
  };
  refuse_unless("--momentum", any(takes_momentum));
  refuse_unless("--mu", any([](const std::string& a) { return a.starts_with("qg"); }));
  refuse_unless("--gamma", any([](const std::string& a) { return a == "choco"; }));
  refuse_unless("--allreduce", any([](const std::string& a) { return a == "ring_allreduce"; }));
  const bool choco = any([](const std::string& a) { return a == "choco"; });
  if (!choco && (o.compressor != "none" || !o.compressor_opts.empty())) {
    throw ConfigError("--compressor and --compressor-option apply to choco only, which --algos " +
                      o.algos + " does not name");
  }
}

std::pair<std::string, std::string> key_value(const std::string& kv, const char* flag) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(std::string(flag) + " takes KEY=VALUE, got '" + kv + "'");
  }
  return {kv.substr(0, eq), kv.substr(eq + 1)};
}

// An algorithm's settings as the [decentralized] section a rendezvous would send, checked the
// same way (decentralized_settings_from): every option reaches its component.
agg::DecentralizedSettings settings_for(const Options& o, const std::string& algo) {
  ConfigSchema schema;
  schema.add_section("decentralized", "");
  Config c(schema);
  const auto set = [&](const std::string& key, const std::string& value) {
    c.set("decentralized." + key, value);
  };
  set("peers", std::to_string(o.nodes));
  set("steps", std::to_string(o.steps));
  set("batch", std::to_string(o.batch));
  c.set_value("decentralized.lr", o.lr);
  set("partition", o.partition);
  set("staleness", std::to_string(o.staleness));
  set("algorithm", algo);
  set("topology", o.topology);
  for (const auto& kv : o.topology_opts) {
    const auto [k, v] = key_value(kv, "--topology-option");
    set("topology_options." + k, v);
  }
  if (takes_momentum(algo)) c.set_value("decentralized.momentum", o.momentum);
  if (algo.starts_with("qg")) c.set_value("decentralized.mu", o.mu);
  if (algo == "choco") {
    c.set_value("decentralized.gamma", o.gamma);
    set("compressor", o.compressor);
    for (const auto& kv : o.compressor_opts) {
      const auto [k, v] = key_value(kv, "--compressor-option");
      set("compressor_options." + k, v);
    }
  }
  if (algo == "ring_allreduce") set("allreduce", o.allreduce);
  c.set_value("decentralized.weight_decay", o.weight_decay);
  return agg::decentralized_settings_from(c.section("decentralized"), [](const std::string& p) {
    (void)client::parse_partition_spec(p);
  });
}

// What every algorithm's run shares: the data, its split, the model and the topology.
struct Experiment {
  client::TrainTest data;
  kernels::NetworkSpec spec;
  client::Partition parts;
  std::unique_ptr<kernels::Device> device;
  std::unique_ptr<agg::Topology> topo;
  agg::DecentralizedOptimizerRegistry optimizers;
  double rho = 0;
};

// The test accuracy of the nodes' average model (a fresh learner holding it).
client::EvalResult evaluate_average(
    const Options& o, Experiment& x,
    const std::vector<std::unique_ptr<client::PeerLearner>>& peers) {
  std::vector<float> avg(x.spec.parameter_count(), 0.0f);
  for (const auto& p : peers) {
    const auto m = p->model();
    for (std::size_t k = 0; k < avg.size(); ++k) avg[k] += m[k];
  }
  for (float& v : avg) v /= static_cast<float>(o.nodes);
  auto learner = client::PeerLearner(*x.device, x.spec, x.data.train, x.parts[0], o.batch, 0,
                                     o.seed, x.optimizers.create("dpsgd", {}));
  std::copy(avg.begin(), avg.end(), learner.parameters().begin());
  return learner.evaluate(x.data.test);
}

// Steps [from, until) on every node, one thread each; returns each node's mean loss.
std::vector<double> run_steps(const Options& o,
                              std::vector<std::unique_ptr<client::PeerLearner>>& peers,
                              std::vector<std::unique_ptr<agg::Gossip>>& gossips, std::size_t from,
                              std::size_t until) {
  std::vector<double> losses(o.nodes, 0.0);
  std::vector<std::string> errors(o.nodes);
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < o.nodes; ++i) {
      threads.emplace_back([&, i] {
        try {
          double sum = 0;
          for (std::size_t t = from; t < until; ++t) {
            sum += peers[i]->step(t, static_cast<float>(o.lr), *gossips[i]);
          }
          losses[i] = sum / static_cast<double>(std::max<std::size_t>(1, until - from));
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    }
  }
  for (const auto& e : errors) {
    if (!e.empty()) throw Error("a peer failed: " + e);
  }
  return losses;
}

// Trains every node with one algorithm and prints its JSON line (and, with --eval-every, the
// average model's accuracy along the way).
void run_algorithm(const Options& o, Experiment& x, const agg::DecentralizedSettings& settings) {
  const std::string& algo = settings.algorithm;
  const auto q = agg::make_compressor(settings);
  InMemoryNetwork net(static_cast<Rank>(o.nodes));
  std::vector<std::unique_ptr<client::PeerLearner>> peers;
  for (std::size_t i = 0; i < o.nodes; ++i) {
    peers.push_back(std::make_unique<client::PeerLearner>(
        *x.device, x.spec, x.data.train, x.parts[i], o.batch, o.seed * 1000003ULL + i, o.seed,
        agg::make_optimizer(settings, q)));
  }
  std::vector<std::unique_ptr<agg::Gossip>> gossips;
  for (std::size_t i = 0; i < o.nodes; ++i) {
    agg::GossipOptions go;
    go.staleness = o.staleness;
    gossips.push_back(std::make_unique<agg::Gossip>(net.comm(static_cast<Rank>(i)), *x.topo, go));
  }
  std::vector<double> losses(o.nodes, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t chunks = o.eval_every > 0 ? (o.steps + o.eval_every - 1) / o.eval_every : 1;
  std::size_t done = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t until = o.eval_every > 0 ? std::min(o.steps, done + o.eval_every) : o.steps;
    losses = run_steps(o, peers, gossips, done, until);
    done = until;
    if (o.eval_every > 0 && done < o.steps) {
      nlohmann::json j{{"algo", algo},
                       {"step", done},
                       {"avg_model_accuracy", evaluate_average(o, x, peers).accuracy}};
      std::cout << j.dump() << std::endl;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Every node on the test set, and the average of the nodes' models.
  double mean_acc = 0, min_acc = 1;
  std::vector<std::vector<float>> models;
  for (auto& p : peers) {
    const double a = p->evaluate(x.data.test).accuracy;
    mean_acc += a / static_cast<double>(o.nodes);
    min_acc = std::min(min_acc, a);
    const auto m = p->model();
    models.emplace_back(m.begin(), m.end());
  }
  const auto avg_eval = evaluate_average(o, x, peers);
  double train_loss = 0;
  for (double l : losses) train_loss += l / static_cast<double>(o.nodes);
  nlohmann::json j;
  j["experiment"] = "decentralized";
  j["algo"] = algo;
  j["nodes"] = o.nodes;
  j["topology"] = o.topology;
  j["spectral_gap"] = x.rho;
  j["partition"] = o.partition;
  j["model"] = o.model;
  j["steps"] = o.steps;
  if (o.staleness > 0) j["staleness"] = o.staleness;
  j["batch"] = o.batch;
  j["lr"] = o.lr;
  if (takes_momentum(algo)) j["momentum"] = o.momentum;
  if (algo == "choco") j["compressor"] = o.compressor;
  if (algo == "ring_allreduce") j["allreduce"] = o.allreduce;
  j["avg_model_test_accuracy"] = avg_eval.accuracy;
  j["mean_node_test_accuracy"] = mean_acc;
  j["min_node_test_accuracy"] = min_acc;
  j["consensus_distance"] = agg::consensus_distance(models);
  j["last_train_loss"] = train_loss;
  j["seconds"] = secs;
  std::cout << j.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cohort-decentralized-sim: decentralized training of N in-process peers"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    set_log_level(LogLevel::Warn);
    const auto algo_list = split(o.algos);
    if (algo_list.empty()) throw ConfigError("--algos names no algorithm");
    refuse_unused(app, o, algo_list);
    std::vector<agg::DecentralizedSettings> all_settings;
    for (const auto& algo : algo_list) all_settings.push_back(settings_for(o, algo));

    Experiment x{.data = load_experiment_data(o), .spec = kernels::make_network_spec(o.model)};
    client::check_model_input(x.spec, o.model, x.data.train, "the data");
    x.parts = client::make_partition(client::parse_partition_spec(o.partition),
                                     x.data.train.labels(), o.nodes, o.seed);
    x.device = kernels::make_device("cpu", {.threads = 1});
    x.topo = agg::make_topology(all_settings.front());
    agg::add_builtin_decentralized_optimizers(x.optimizers);
    x.rho = spectral_gap(x.topo->mixing(static_cast<Rank>(o.nodes), 0));
    for (const auto& settings : all_settings) run_algorithm(o, x, settings);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-decentralized-sim: %s\n", e.what());
    return 1;
  }
}
