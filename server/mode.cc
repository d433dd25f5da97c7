#include "mode.h"

#include <string>

#include "cohort/core/error.h"

namespace cohort::server {

Modes parse_modes(const Config& config) {
  Modes m;
  const std::string mode = config.get_string("server.mode");
  if (mode == "federated") {
    m.mode = transport::TrainingMode::kFederated;
  } else if (mode == "fedbuff") {
    m.mode = transport::TrainingMode::kBuffered;
  } else if (mode == "dataparallel") {
    m.mode = transport::TrainingMode::kDataParallel;
  } else {
    throw ConfigError("server.mode must be federated, fedbuff or dataparallel here, got '" + mode +
                      "'");
  }
  const std::string consistency = config.get_string("server.consistency");
  if (consistency == "bsp") {
    m.consistency = Consistency::kBsp;
  } else if (consistency == "asp") {
    m.consistency = Consistency::kAsp;
  } else if (consistency == "ssp") {
    m.consistency = Consistency::kSsp;
  } else {
    throw ConfigError("server.consistency must be bsp, asp or ssp, got '" + consistency + "'");
  }
  return m;
}

std::string_view consistency_name(Consistency c) {
  switch (c) {
    case Consistency::kBsp: return "bsp";
    case Consistency::kAsp: return "asp";
    case Consistency::kSsp: return "ssp";
  }
  return "?";
}

}  // namespace cohort::server
