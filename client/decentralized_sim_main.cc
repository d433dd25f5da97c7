// cohort-decentralized-sim: N decentralized peers in one process (one thread each, in-memory
// Comm), the same data split, steps and learning rate for every algorithm, and one JSON line per
// algorithm with the test accuracy of the nodes' average model and of the nodes themselves.
//
//   cohort-decentralized-sim --nodes 16 --topology ring --partition dirichlet:0.1 \
//       --algos dpsgd,dsgdm,qg_dsgdm --steps 1500 --lr 0.05
//   cohort-decentralized-sim --config examples/sim/decentralized_ring.toml
#include <CLI/CLI.hpp>
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
  std::string compressor = "none";
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
  app.add_option("--compressor", compressor, "CHOCO's compressor (default error feedback off)");
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
  CLI11_PARSE(app, argc, argv);
  try {
    set_log_level(LogLevel::Warn);
    auto data = client::load_fashion_mnist(data_dir, /*standardize=*/true);
    const auto spec = kernels::make_network_spec(model);
    const auto parts = client::make_partition(client::parse_partition_spec(partition),
                                              data.train.labels(), nodes, seed);
    auto device = kernels::make_device("cpu", {.threads = 1});
    agg::TopologyRegistry topologies;
    agg::add_builtin_topologies(topologies);
    auto topo = topologies.create(topology, {});
    agg::DecentralizedOptimizerRegistry optimizers;
    agg::add_builtin_decentralized_optimizers(optimizers);
    agg::CompressorRegistry compressors;
    agg::add_builtin_compressors(compressors);
    std::shared_ptr<const agg::Compressor> q =
        compressors.create(compressor, ConfigSection("compressor", {{"error_feedback", false}}));
    const double rho = spectral_gap(topo->mixing(static_cast<Rank>(nodes), 0));

    for (const auto& algo : split(algos)) {
      std::map<std::string, Value, std::less<>> opts;
      if (algo.starts_with("dsgdm") || algo.starts_with("qg") || algo == "push_sum" ||
          algo == "sgp" || algo == "choco" || algo == "ring_allreduce") {
        opts["momentum"] = momentum;
      }
      if (algo.starts_with("qg")) opts["mu"] = mu;
      if (algo == "choco") opts["gamma"] = gamma;
      opts["weight_decay"] = weight_decay;
      const ConfigSection section("decentralized", opts);
      InMemoryNetwork net(static_cast<Rank>(nodes));
      std::vector<std::unique_ptr<client::PeerLearner>> peers;
      for (std::size_t i = 0; i < nodes; ++i) {
        peers.push_back(std::make_unique<client::PeerLearner>(*device, spec, data.train, parts[i],
                                                              batch, seed * 1000003ULL + i, seed,
                                                              optimizers.create(algo, section, q)));
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
      if (opts.contains("momentum")) j["momentum"] = momentum;
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
