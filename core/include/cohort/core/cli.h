// The command-line face of a Config: --config FILE, --set key=value (repeatable),
// --print-config, and every schema key as its own flag (--server.rounds=5 or --server.rounds 5).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "cohort/core/config.h"

namespace cohort {

struct ConfigFlags {
  std::string file;
  std::vector<std::string> overrides;
  bool print_config = false;
  std::string log_level = "info";
  std::string sched = "batch";  // see cohort/core/scheduling.h
};

// Adds --config, --set, --print-config, --log-level and --sched to `app`, and lets it keep unknown
// "--section.key" flags for finish_config. The schema's help text is appended to --help.
void add_config_flags(CLI::App& app, ConfigFlags& flags, const ConfigSchema& schema);

// Adds --sched batch|keep (cohort/core/scheduling.h) to `app`, stored in `value`; `whose` names
// the processes whose I/O threads it schedules, for the help text. add_config_flags adds it too.
CLI::Option* add_sched_flag(CLI::App& app, std::string& value, const std::string& whose);

// Builds the Config after app.parse(): file, then --set overrides, then dotted flags, in order.
// Also applies --log-level and --sched (before any transport::Context is made, then).
// Throws ConfigError for an unknown key, a bad value or a stray argument.
Config finish_config(const CLI::App& app, const ConfigFlags& flags, const ConfigSchema& schema);

}  // namespace cohort
