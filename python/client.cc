// cohort.Client: cohort-client's protocol (client/participant.h) with a Python function as the
// local training. The participant runs with the GIL released; each call into Python takes it.
//
// Each round the participant pulls the global model into a float32 buffer, which the train
// function receives as a NumPy array without a copy, and pushes (its update minus the global
// model, clipped, compressed as client.dp_clip and compressor.* say) what the function returned.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "cohort/client/client_work.h"
#include "cohort/client/participant.h"
#include "cohort/core/config.h"
#include "cohort/core/error.h"
#include "cohort/kernels/optimizer.h"

namespace py = pybind11;

namespace cohort::python {
namespace {

using Clock = std::chrono::steady_clock;

// What a round tells the train function: the round, and the coordinator's model and [train].
struct Round {
  std::uint64_t id = 0;
  std::uint64_t model_version = 0;
  std::uint32_t local_steps = 0;
  std::uint64_t seed = 0;
  std::string model_spec;
  std::size_t parameter_count = 0;
  client::TrainerOptions train;
  std::string train_toml;
};

std::string optimizer_name(kernels::OptimizerKind kind) {
  switch (kind) {
    case kernels::OptimizerKind::kSgd: return "sgd";
    case kernels::OptimizerKind::kAdam: return "adam";
    case kernels::OptimizerKind::kAdamW: return "adamw";
  }
  return "sgd";
}

// The keys of cohort-client's file that belong to its own data and training: a Python client
// brings both, so setting one is refused, never ignored. data.seed stays (it seeds Round.seed and
// the compressor's randomness).
bool refused_key(std::string_view key) {
  if (key.starts_with("data.")) return key != "data.seed";
  if (key.starts_with("peer.")) return true;
  for (const char* k :
       {"client.device", "client.threads", "client.memory_budget", "client.step_delay_ms"}) {
    if (key == k) return true;
  }
  return false;
}

std::string text_of(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  return py::str(v).cast<std::string>();
}

client::ParticipantOptions options_from(const std::optional<std::string>& file,
                                        const py::dict& overrides) {
  ConfigSchema schema = client::participant_config_schema();
  schema.add("client.mode", std::string("federated"), "federated only, for a Python client");
  std::optional<std::filesystem::path> path;
  if (file) path = *file;
  Config config = Config::load(schema, path);
  for (const auto& [k, v] : overrides) {
    config.set(py::str(k).cast<std::string>(), text_of(v));
  }
  for (const auto& spec : schema.options()) {
    if (config.is_set(spec.key) && refused_key(spec.key)) {
      throw ConfigError(spec.key +
                        " does not apply to a Python client: its train function brings the data "
                        "and does the training");
    }
  }
  if (config.get_string("client.mode") != "federated") {
    throw ConfigError("client.mode: a Python client joins federations (federated), got '" +
                      config.get_string("client.mode") + "'");
  }
  return client::participant_options_from(config);
}

// Runs the user's functions for the participant.
class PythonWork final : public client::ClientWork {
 public:
  PythonWork(const std::string& name, std::size_t num_samples, py::object train,
             py::object evaluate, const std::atomic<bool>& stop)
      : name_hash_(fnv1a(name)),
        num_samples_(num_samples),
        train_(std::move(train)),
        evaluate_(std::move(evaluate)),
        stop_(stop) {}

  // The Python objects go with the GIL held (run() destroys the work before releasing it).
  ~PythonWork() override = default;

  [[nodiscard]] std::size_t num_samples() const override { return num_samples_; }
  [[nodiscard]] std::string describe() const override { return "python"; }
  [[nodiscard]] std::string device() const override { return "python"; }
  [[nodiscard]] bool evaluates() const override { return !evaluate_.is_none(); }
  [[nodiscard]] std::string trainer_name() const override { return "the train function"; }

  void on_welcome(const client::WorkModel& model, bool same_model) override {
    round_.model_spec = model.spec;
    round_.parameter_count = model.parameter_count;
    round_.train = model.train;
    round_.train_toml = model.training_toml;
    // A train callable with `cohort_parameters` (cohort.torch.Trainer's: its module's tensors
    // are views of that array) gets the model pulled straight into it and trains it in place.
    py::gil_scoped_acquire gil;
    buffer_ = py::none();
    buffer_span_ = {};
    if (py::hasattr(train_, "cohort_parameters")) {
      py::object b = train_.attr("cohort_parameters");
      if (py::isinstance<py::array_t<float>>(b)) {
        auto a = b.cast<py::array>();
        if ((a.flags() & py::array::c_style) && a.writeable() &&
            static_cast<std::size_t>(a.size()) == model.parameter_count) {
          buffer_ = a;  // kept alive while the span is used
          buffer_span_ = {static_cast<float*>(a.mutable_data()), model.parameter_count};
        }
      }
    }
    // Otherwise the work's own buffer; none is kept beside the callable's.
    if (!buffer_span_.empty()) {
      params_ = {};
    } else if (!same_model || params_.size() != model.parameter_count) {
      params_.assign(model.parameter_count, 0.0f);
    }
  }

  // Called without the GIL: no Python object is touched.
  std::span<float> parameters() override {
    return buffer_span_.empty() ? std::span<float>(params_) : buffer_span_;
  }

  client::WorkResult train(const client::WorkRound& r) override {
    round_.id = r.round;
    round_.model_version = r.model_version;
    round_.local_steps = r.local_steps;
    // The participant's seed mixes data.seed, the model version and data.part, which a Python
    // client leaves at 0/1: its name makes the seeds of two Python clients differ.
    round_.seed = r.seed ^ name_hash_;
    py::gil_scoped_acquire gil;
    const auto t0 = Clock::now();
    py::object out = call(train_, "train");
    const double call_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    try {
      return take_result(out, r, call_seconds);
    } catch (const py::cast_error& e) {
      throw DataError(std::string("train returned a value of the wrong type: ") + e.what());
    } catch (const py::error_already_set& e) {
      throw DataError(std::string("train's result: ") + e.what());
    }
  }

  client::WorkResult take_result(const py::object& out, const client::WorkRound& r,
                                 double call_seconds) {
    client::WorkResult result;
    result.trained.accumulation = 1;
    py::tuple t;
    try {
      t = out.cast<py::tuple>();
    } catch (const py::cast_error&) {
      throw DataError("train must return (update, num_samples[, metrics]), got " +
                      std::string(py::str(out.get_type().attr("__name__"))));
    }
    if (t.size() != 2 && t.size() != 3) {
      throw DataError("train must return (update, num_samples[, metrics]), got a tuple of " +
                      std::to_string(t.size()));
    }
    take_update(t[0]);
    const auto n = t[1].cast<std::int64_t>();
    if (n < 0) throw DataError("train returned num_samples = " + std::to_string(n));
    result.num_samples = static_cast<std::uint64_t>(n);
    if (t.size() == 3 && !t[2].is_none()) read_metrics(t[2].cast<py::dict>(), result);
    if (result.trained.samples == 0) result.trained.samples = result.num_samples;
    if (result.trained.steps == 0) result.trained.steps = r.local_steps;
    if (result.train_seconds <= 0) result.train_seconds = call_seconds;
    return result;
  }

  std::optional<client::EvalResult> evaluate() override {
    py::gil_scoped_acquire gil;
    if (evaluate_.is_none()) return std::nullopt;
    py::object out = call(evaluate_, "evaluate");
    try {
      return take_evaluation(out);
    } catch (const py::cast_error& e) {
      throw DataError(std::string("evaluate returned a value of the wrong type: ") + e.what());
    } catch (const py::error_already_set& e) {
      throw DataError(std::string("evaluate's result: ") + e.what());
    }
  }

  static client::EvalResult take_evaluation(const py::object& out) {
    auto t = out.cast<py::tuple>();
    if (t.size() < 2) throw DataError("evaluate must return (loss, count[, metrics])");
    client::EvalResult e;
    e.loss = t[0].cast<double>();
    e.count = t[1].cast<std::size_t>();
    e.has_accuracy = false;
    if (t.size() >= 3 && !t[2].is_none()) {
      auto metrics = t[2].cast<py::dict>();
      if (metrics.contains("accuracy")) {
        e.accuracy = metrics["accuracy"].cast<double>();
        e.has_accuracy = true;
      }
    }
    return e;
  }

  bool should_stop() override {
    if (stop_.load()) return true;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {  // Ctrl-C: KeyboardInterrupt, raised when run() returns
      pending_ = std::make_shared<py::error_already_set>();
      return true;
    }
    return false;
  }

  // A Python exception that stopped the client (from the user's function or a signal), to raise
  // as is when run() returns.
  [[nodiscard]] const std::shared_ptr<py::error_already_set>& pending() const { return pending_; }

  [[nodiscard]] const Round& round() const { return round_; }

 private:
  // Calls fn(params view, round); a Python exception is kept for run() to raise and stops the
  // client (TrainingError: the coordinator is told, with the exception's message).
  py::object call(const py::object& fn, const char* what) {
    const auto params = parameters();
    py::array_t<float> view({params.size()}, {sizeof(float)}, params.data(),
                            py::capsule(params.data(), [](void*) {}));
    try {
      return fn(view, py::cast(round_));
    } catch (py::error_already_set& e) {
      // The coordinator hears the exception's first line ("ValueError: ..."), not the traceback
      // pybind11 appends; the Python caller gets the exception itself.
      std::string message = e.what();
      message = message.substr(0, message.find('\n'));
      pending_ = std::make_shared<py::error_already_set>(std::move(e));
      throw TrainingError(std::string(what) + " raised " + message);
    }
  }

  // The update: any array-like of parameter_count finite values (float32, or converted).
  void take_update(const py::handle& u) {
    const auto params = parameters();
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(u);
    if (!a) {
      PyErr_Clear();
      throw DataError("train's update is not an array of numbers (got " +
                      std::string(py::str(u.get_type().attr("__name__"))) + ")");
    }
    if (static_cast<std::size_t>(a.size()) != params.size()) {
      throw DataError("train's update has " + std::to_string(a.size()) +
                      " values; the coordinator's model (" + round_.model_spec + ") has " +
                      std::to_string(params.size()));
    }
    const float* p = a.data();
    // One branch-free pass over the exponent bits (all ones: inf or NaN), which vectorises,
    // then the element named.
    std::uint32_t nonfinite = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto bits = std::bit_cast<std::uint32_t>(p[i]);
      nonfinite |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (nonfinite != 0) {
      const std::size_t i = static_cast<std::size_t>(
          std::find_if(p, p + params.size(), [](float v) { return !std::isfinite(v); }) - p);
      throw DataError("train's update holds a non-finite value (" + std::to_string(p[i]) +
                      ") at element " + std::to_string(i) + "; nothing was pushed");
    }
    // cohort.torch.Trainer writes into the params it was given: nothing to copy then.
    if (p != params.data()) std::copy(p, p + params.size(), params.begin());
  }

  static void read_metrics(const py::dict& m, client::WorkResult& r) {
    if (m.contains("loss")) r.trained.mean_loss = m["loss"].cast<double>();
    if (m.contains("steps")) r.trained.steps = m["steps"].cast<std::size_t>();
    if (m.contains("samples")) r.trained.samples = m["samples"].cast<std::size_t>();
    if (m.contains("train_seconds")) r.train_seconds = m["train_seconds"].cast<double>();
  }

  // FNV-1a: the same on every platform and run (std::hash need not be).
  static std::uint64_t fnv1a(const std::string& s) {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
    return h;
  }

  std::uint64_t name_hash_;
  std::size_t num_samples_;
  py::object train_, evaluate_;
  const std::atomic<bool>& stop_;
  std::vector<float> params_;
  py::object buffer_ = py::none();  // the train callable's cohort_parameters, when it has one
  std::span<float> buffer_span_;    // its data
  Round round_;
  std::shared_ptr<py::error_already_set> pending_;
};

class Client {
 public:
  Client(std::optional<std::string> config, py::dict options)
      : options_(options_from(config, options)) {}

  // Blocks until the coordinator ends training. Raises what stopped it.
  void run(py::object train, std::size_t num_samples, py::object evaluate) {
    if (!PyCallable_Check(train.ptr())) throw py::type_error("train must be callable");
    if (!evaluate.is_none() && !PyCallable_Check(evaluate.ptr())) {
      throw py::type_error("evaluate must be callable or None");
    }
    if (num_samples == 0) throw ConfigError("num_samples must be > 0 (the examples it trains on)");
    stop_.store(false);
    PythonWork work(options_.name, num_samples, std::move(train), std::move(evaluate), stop_);
    client::ParticipantExit exit;
    try {
      py::gil_scoped_release released;
      exit = client::run_participant(options_, work, stop_);
    } catch (const Error&) {
      if (work.pending()) throw *work.pending();  // the user's own exception, as raised
      throw;
    }
    if (work.pending()) throw *work.pending();
    if (exit.code != 0) throw TransportError(exit.failure);
  }

  void stop() { stop_.store(true); }

  [[nodiscard]] const client::ParticipantOptions& options() const { return options_; }

 private:
  client::ParticipantOptions options_;
  std::atomic<bool> stop_{false};
};

}  // namespace

void bind_client(py::module_& m) {
  py::class_<Round>(m, "Round",
                    "One round as the coordinator asked for it, with its model and [train]")
      .def_readonly("id", &Round::id)
      .def_readonly("model_version", &Round::model_version)
      .def_readonly("local_steps", &Round::local_steps,
                    "> 0: take exactly this many optimizer steps (server.work); 0: as configured")
      .def_readonly("seed", &Round::seed, "seeds this round's shuffles")
      .def_readonly("model_spec", &Round::model_spec)
      .def_readonly("parameter_count", &Round::parameter_count)
      .def_readonly("train_toml", &Round::train_toml, "the coordinator's [train] section")
      .def_property_readonly("batch_size", [](const Round& r) { return r.train.batch_size; })
      .def_property_readonly("epochs", [](const Round& r) { return r.train.epochs; })
      .def_property_readonly(
          "steps", [](const Round& r) { return r.train.steps; },
          "train.steps (0: train.epochs epochs)")
      .def_property_readonly("drop_last", [](const Round& r) { return r.train.drop_last; })
      .def_property_readonly("lr", [](const Round& r) { return r.train.optimizer.learning_rate; })
      .def_property_readonly("optimizer",
                             [](const Round& r) { return optimizer_name(r.train.optimizer.kind); })
      .def_property_readonly("momentum", [](const Round& r) { return r.train.optimizer.momentum; })
      .def_property_readonly("nesterov", [](const Round& r) { return r.train.optimizer.nesterov; })
      .def_property_readonly("weight_decay",
                             [](const Round& r) { return r.train.optimizer.weight_decay; })
      .def_property_readonly("prox_mu", [](const Round& r) { return r.train.prox_mu; })
      .def_property_readonly("beta1", [](const Round& r) { return r.train.optimizer.beta1; })
      .def_property_readonly("beta2", [](const Round& r) { return r.train.optimizer.beta2; })
      .def_property_readonly("epsilon", [](const Round& r) { return r.train.optimizer.epsilon; })
      .def_property_readonly("reset_optimizer_state",
                             [](const Round& r) { return r.train.reset_optimizer_state; })
      .def_property_readonly("eval_batch_size",
                             [](const Round& r) { return r.train.eval_batch_size; })
      .def_property_readonly(
          "rule", [](const Round& r) { return r.train.rule; },
          "train.rule, the C++ clients' local training rule")
      .def_property_readonly(
          "loss", [](const Round& r) { return std::string(client::to_string(r.train.loss)); })
      .def("__repr__", [](const Round& r) {
        return "<cohort.Round " + std::to_string(r.id) + " of " + r.model_spec + ">";
      });

  py::class_<Client>(m, "Client", R"(A federated client whose local training is a Python function.

Client(config=None, options=None): config is a TOML file with cohort-client's keys (client.server,
client.name, tls.*, transport.*, compressor.*, client.dp_clip, ...); options a dict of the same
keys, overriding the file ({"client.name": "alice"}). Keys of cohort-client's own data and
training (data.*, client.device, client.threads, client.memory_budget) are refused.)")
      .def(py::init<std::optional<std::string>, py::dict>(), py::arg("config") = py::none(),
           py::arg("options") = py::dict())
      .def("run", &Client::run, py::arg("train"), py::kw_only(), py::arg("num_samples"),
           py::arg("evaluate") = py::none(),
           R"(Joins the federation and serves rounds until the coordinator ends training.

train(params, round) -> (update, num_samples[, metrics]): params is the round's global model
(float32, a view valid during the call); update the trained parameters, same length;
num_samples the update's weight; metrics may hold loss, steps, samples, train_seconds.
evaluate(params, round) -> (loss, count[, {"accuracy": a}]) answers evaluation rounds.
Raises the error that stopped the client (cohort.TransportError when the coordinator is lost).)")
      .def("stop", &Client::stop, "Makes run() return (from another thread)")
      .def_property_readonly("name", [](const Client& c) { return c.options().name; })
      .def_property_readonly("server", [](const Client& c) { return c.options().server; });
}

}  // namespace cohort::python
