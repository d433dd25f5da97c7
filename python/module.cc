// cohort._cohort: the C++ half of the `cohort` Python package (python/cohort/__init__.py is the
// other). Cohort's errors arrive as Python exceptions of the same names, all derived from
// cohort.Error, carrying the C++ message.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace py = pybind11;

PYBIND11_MODULE(_cohort, m) {
  m.doc() = "Cohort's C++ core: federated client, aggregation, keys and the simulator";
  // Most specific first: pybind11 tries translators in reverse order of registration, and
  // register_exception translates exactly its own type and subclasses.
  auto base = py::register_exception<cohort::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<cohort::ConfigError>(m, "ConfigError", base.ptr());
  py::register_exception<cohort::DataError>(m, "DataError", base.ptr());
  auto transport = py::register_exception<cohort::TransportError>(m, "TransportError", base.ptr());
  py::register_exception<cohort::TimeoutError>(m, "TimeoutError", transport.ptr());
  py::register_exception<cohort::ProtocolError>(m, "ProtocolError", base.ptr());
  py::register_exception<cohort::KernelError>(m, "KernelError", base.ptr());
  py::register_exception<cohort::InternalError>(m, "InternalError", base.ptr());
  py::register_exception<cohort::TrainingError>(m, "TrainingError", base.ptr());
  m.def(
      "set_log_level",
      [](const std::string& level) { cohort::set_log_level(cohort::parse_log_level(level)); },
      py::arg("level"),
      "Cohort's log level on stderr: trace, debug, info (the default), warn, error or off");
  cohort::python::bind_client(m);
  cohort::python::bind_tools(m);
}
