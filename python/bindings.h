// The parts of the cohort._cohort extension (module.cc puts them together).
#pragma once

#include <pybind11/pybind11.h>

namespace cohort::python {

// cohort.Client: a federated client whose local training is a Python callable (client.cc).
void bind_client(pybind11::module_& m);

// cohort.FederatedStep / cohort.aggregate, cohort.keygen_*, cohort.simulate (tools.cc).
void bind_tools(pybind11::module_& m);

}  // namespace cohort::python
