#include "cohort/core/cli.h"

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"

namespace cohort {

void add_config_flags(CLI::App& app, ConfigFlags& flags, const ConfigSchema& schema) {
  app.add_option("--config", flags.file, "TOML configuration file");
  app.add_option("--set", flags.overrides,
                 "override one key: --set section.key=value (repeatable)");
  app.add_flag("--print-config", flags.print_config, "print the effective configuration and exit");
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off");
  add_sched_flag(app, flags.sched, "this process");
  app.allow_extras();
  app.footer("Configuration keys (each also a flag, e.g. --server.rounds=5):\n" +
             schema.help_text());
}

CLI::Option* add_sched_flag(CLI::App& app, std::string& value, const std::string& whose) {
  return app
      .add_option("--sched", value,
                  "CPU scheduling of the ZeroMQ I/O threads of " + whose +
                      ": batch (SCHED_BATCH: a woken I/O thread does not preempt the thread "
                      "sealing or applying chunks) or keep (the process's own policy). A policy "
                      "set with chrt is kept either way")
      ->check(CLI::IsMember({"batch", "keep"}))
      ->capture_default_str();
}

Config finish_config(const CLI::App& app, const ConfigFlags& flags, const ConfigSchema& schema) {
  set_log_level(parse_log_level(flags.log_level));
  set_io_scheduling(parse_scheduling(flags.sched));
  std::optional<std::filesystem::path> file;
  if (!flags.file.empty()) file = flags.file;
  Config config = Config::load(schema, file, flags.overrides);
  const std::vector<std::string> extras = app.remaining();
  for (std::size_t i = 0; i < extras.size(); ++i) {
    const std::string& arg = extras[i];
    if (!arg.starts_with("--") || arg.size() < 3) {
      throw ConfigError("unexpected argument '" + arg + "' (see --help)");
    }
    const std::string body = arg.substr(2);
    if (body.find('=') != std::string::npos) {
      config.apply_override(body);
    } else if (i + 1 < extras.size() && !extras[i + 1].starts_with("--")) {
      config.set(body, extras[++i]);
    } else if (const OptionSpec* spec = schema.find(body); spec && spec->type == ValueType::kBool) {
      config.set(body, "true");
    } else {
      throw ConfigError("flag '" + arg + "' needs a value (e.g. " + arg + "=VALUE)");
    }
  }
  return config;
}

}  // namespace cohort
