// cohort.FederatedStep / cohort.aggregate (aggregation/federated_step.h on NumPy arrays),
// cohort.keygen_ca / keygen_node (cohort-keygen's functions) and cohort.simulate (cohort-sim's
// in-process federation, sim/sim.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "cohort/aggregation/federated_step.h"
#include "cohort/core/config.h"
#include "cohort/core/error.h"
#include "cohort/sim/sim.h"
#include "cohort/transport/security/keygen.h"

namespace py = pybind11;

namespace cohort::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

Value value_of(const py::handle& v, const std::string& key) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<std::int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  throw ConfigError(key + ": a bool, int, float or str, got " +
                    std::string(py::str(v.get_type().attr("__name__"))));
}

// {"f": 1, "beta": 0.9} as the section `prefix` of a server config ([aggregator] f = 1 ...).
ConfigSection section_of(const std::string& prefix, const py::dict& d) {
  std::map<std::string, Value, std::less<>> values;
  for (const auto& [k, v] : d) {
    const auto key = py::str(k).cast<std::string>();
    values.emplace(key, value_of(v, prefix + "." + key));
  }
  return ConfigSection(prefix, std::move(values));
}

// The updates as float32 arrays of `size` values each, kept alive while their spans are used.
struct Updates {
  std::vector<FloatArray> arrays;
  std::vector<aggregation::WeightedUpdate> weighted;
};

Updates updates_of(const py::sequence& updates, const std::optional<py::sequence>& weights,
                   std::size_t size) {
  if (weights && py::len(*weights) != py::len(updates)) {
    throw DataError(std::to_string(py::len(updates)) + " updates but " +
                    std::to_string(py::len(*weights)) + " weights");
  }
  Updates u;
  u.arrays.reserve(py::len(updates));
  for (std::size_t i = 0; i < py::len(updates); ++i) {
    auto a = FloatArray::ensure(updates[i]);
    if (!a) {
      PyErr_Clear();
      throw DataError("update " + std::to_string(i) + " is not an array of numbers");
    }
    if (static_cast<std::size_t>(a.size()) != size) {
      throw DataError("update " + std::to_string(i) + " has " + std::to_string(a.size()) +
                      " values, not " + std::to_string(size));
    }
    u.arrays.push_back(std::move(a));
  }
  for (std::size_t i = 0; i < u.arrays.size(); ++i) {
    const double w = weights ? (*weights)[i].cast<double>() : 1.0;
    u.weighted.push_back({.delta = {u.arrays[i].data(), size}, .weight = w});
  }
  return u;
}

class Step {
 public:
  Step(std::size_t size, std::string rule, std::string optimizer, const py::dict& rule_options,
       const py::dict& optimizer_options)
      : step_(size, {.rule = std::move(rule),
                     .rule_options = section_of("aggregator", rule_options),
                     .optimizer = std::move(optimizer),
                     .optimizer_options = section_of("server_optimizer", optimizer_options)}) {}

  // params += optimizer(rule(updates)), in place; returns a copy of the aggregate delta.
  py::array_t<float> apply(py::array params, const py::sequence& updates,
                           const std::optional<py::sequence>& weights) {
    if (!py::isinstance<py::array_t<float>>(params) || !(params.flags() & py::array::c_style) ||
        !params.writeable()) {
      throw py::type_error("params must be a writable, C-contiguous float32 NumPy array");
    }
    auto p = params.cast<py::array_t<float>>();
    if (static_cast<std::size_t>(p.size()) != step_.size()) {
      throw DataError("params has " + std::to_string(p.size()) + " values, not " +
                      std::to_string(step_.size()));
    }
    auto u = updates_of(updates, weights, step_.size());
    std::span<const float> delta;
    {
      py::gil_scoped_release released;
      delta = step_.apply({p.mutable_data(), step_.size()}, u.weighted);
    }
    return py::array_t<float>(static_cast<py::ssize_t>(delta.size()), delta.data());
  }

  [[nodiscard]] std::size_t size() const { return step_.size(); }
  [[nodiscard]] std::size_t min_updates() const { return step_.min_updates(); }
  [[nodiscard]] std::uint64_t rounds() const { return step_.rounds(); }

 private:
  aggregation::FederatedStep step_;
};

py::dict summary_dict(const sim::Summary& s, const std::string& metrics_file,
                      const std::string& csv_file) {
  py::dict d;
  d["rounds"] = s.rounds;
  d["committed"] = s.committed;
  d["sim_seconds"] = s.sim_seconds;
  d["final_accuracy"] =
      s.final_accuracy < 0 ? py::object(py::none()) : py::float_(s.final_accuracy);
  d["final_loss"] = s.final_loss;
  d["regression"] = s.regression;
  d["bytes"] = s.bytes;
  d["wall_seconds"] = s.wall_seconds;
  d["train_cpu_seconds"] = s.train_cpu_seconds;
  d["clients_unfit"] = s.clients_unfit;
  d["participation"] = s.participation;
  d["metrics_file"] = metrics_file;
  d["csv_file"] = csv_file;
  return d;
}

// Runs the simulation on a thread with the GIL released; Ctrl-C stops it (KeyboardInterrupt).
py::dict simulate(const std::optional<std::string>& file, const py::dict& options) {
  const ConfigSchema schema = sim::sim_config_schema();
  std::optional<std::filesystem::path> path;
  if (file) path = *file;
  Config config = Config::load(schema, path);
  for (const auto& [k, v] : options) {
    const auto key = py::str(k).cast<std::string>();
    config.set_value(key, value_of(v, key));
  }
  std::atomic<bool> stop{false};
  const auto registries = builtin_registries();
  std::promise<sim::Summary> done;
  auto result = done.get_future();
  bool interrupted = false;
  {
    py::gil_scoped_release released;
    std::thread runner([&] {
      try {
        done.set_value(sim::run_in_process(config, registries, stop));
      } catch (...) {
        done.set_exception(std::current_exception());
      }
    });
    while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        interrupted = true;
        stop.store(true);
        break;
      }
    }
    runner.join();
  }
  if (interrupted) throw py::error_already_set();
  return summary_dict(result.get(), config.get_string("sim.metrics_file"),
                      config.get_string("sim.csv_file"));
}

}  // namespace

void bind_tools(py::module_& m) {
  py::class_<Step>(m, "FederatedStep",
                   R"(Cohort's aggregation rules and server optimizers, one call per round.

FederatedStep(size, rule="fedavg", optimizer="sgd", rule_options={}, optimizer_options={}):
rule is an aggregator name (fedavg, median, trimmed_mean, krum, ...) with its [aggregator]
options; optimizer a server optimizer (sgd, fedavgm, fedadam, ...) with its [server_optimizer]
options. Its state (momentum, Adam moments) persists across apply() calls.)")
      .def(py::init<std::size_t, std::string, std::string, py::dict, py::dict>(), py::arg("size"),
           py::arg("rule") = "fedavg", py::arg("optimizer") = "sgd",
           py::arg("rule_options") = py::dict(), py::arg("optimizer_options") = py::dict())
      .def("apply", &Step::apply, py::arg("params"), py::arg("updates"),
           py::arg("weights") = py::none(),
           "params += optimizer(rule(updates)) in place (params: writable float32 array); "
           "updates: array-likes of `size` deltas (new - old); weights: e.g. sample counts "
           "(default 1 each). Returns the aggregate delta. Raises cohort.DataError for what a "
           "shard would refuse (no update, a wrong size, a non-finite value, a bad weight)")
      .def_property_readonly("size", &Step::size)
      .def_property_readonly("min_updates", &Step::min_updates, "the fewest updates the rule takes")
      .def_property_readonly("rounds", &Step::rounds);

  m.def(
      "aggregate",
      [](const py::sequence& updates, const std::optional<py::sequence>& weights,
         const std::string& rule, const py::dict& rule_options) {
        if (py::len(updates) == 0) throw DataError("no update to aggregate");
        const auto first = FloatArray::ensure(updates[0]);
        if (!first) {
          PyErr_Clear();
          throw DataError("update 0 is not an array of numbers");
        }
        const auto size = static_cast<std::size_t>(first.size());
        Step step(size, rule, "sgd", rule_options, py::dict());
        py::array_t<float> params(static_cast<py::ssize_t>(size));
        std::fill(params.mutable_data(), params.mutable_data() + size, 0.0f);
        return step.apply(params, updates, weights);
      },
      py::arg("updates"), py::arg("weights") = py::none(), py::arg("rule") = "fedavg",
      py::arg("rule_options") = py::dict(),
      "The rule's aggregate of the updates (deltas), as a shard computes it");

  m.def(
      "keygen_ca",
      [](const std::string& dir, const std::string& common_name, bool overwrite) {
        transport::security::generate_ca(
            dir, common_name,
            overwrite ? transport::security::Overwrite::kYes : transport::security::Overwrite::kNo);
      },
      py::arg("dir"), py::arg("common_name") = "cohort-ca", py::arg("overwrite") = false,
      "cohort-keygen ca: a certificate authority in dir (ca.pem, ca.key); refuses to replace "
      "one unless overwrite");
  m.def(
      "keygen_node",
      [](const std::string& ca_dir, const std::string& name, const std::string& out) {
        const auto f = transport::security::generate_node(ca_dir, name, out);
        py::dict d;
        d["ca_file"] = f.ca_file;
        d["cert_file"] = f.cert_file;
        d["key_file"] = f.key_file;
        return d;
      },
      py::arg("ca_dir"), py::arg("name"), py::arg("out_dir"),
      "cohort-keygen node: <out_dir>/<name>.pem and .key signed by the CA in ca_dir (the name is "
      "the node id: client.name or shard-N); returns the tls.* file paths");

  m.def("simulate", &simulate, py::arg("config") = py::none(), py::arg("options") = py::dict(),
        R"(Runs cohort-sim in this process: config is a simulation TOML file (examples/sim/*.toml),
options a dict of its dotted keys overriding it ({"server.rounds": 5}). Returns the summary
(rounds, committed, sim_seconds, final_accuracy, ...) with the metrics_file and csv_file it wrote.)");
}

}  // namespace cohort::python
