// cohort-sim --processes: the simulation's configuration run as real cohort-server and
// cohort-client processes on loopback (plaintext), the coordinator's per-round lines relayed.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"
#include "cohort/sim/sim.h"
#include "options.h"

namespace cohort::sim {
namespace {

using namespace std::chrono_literals;

std::string toml_value(const Value& v) {
  if (std::holds_alternative<std::string>(v)) {
    std::string out = "\"";
    for (char c : std::get<std::string>(v)) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
  return to_string(v);
}

pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  const pid_t pid = fork();
  if (pid < 0) throw InternalError(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    FILE* out = std::fopen(log.c_str(), "w");
    if (out) {
      dup2(fileno(out), 1);
      dup2(fileno(out), 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

std::string read_port(const std::filesystem::path& file, pid_t pid, const std::atomic<bool>& stop) {
  for (int i = 0; i < 600 && !stop.load(); ++i) {
    std::ifstream in(file);
    std::string port;
    if (in >> port && !port.empty()) return port;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      throw InternalError("a shard exited before binding (see its log)");
    std::this_thread::sleep_for(50ms);
  }
  throw TimeoutError("a shard did not write its port file within 30 s");
}

// The server's keys of the simulation file, as a cohort-server configuration for `clients`
// clients.
void write_server_toml(const Config& config, const std::filesystem::path& file,
                       std::int64_t clients) {
  const ConfigSchema schema = server::config_schema();
  std::ofstream out(file);
  for (const auto& o : schema.options()) {
    if (set_by_sim(o.key) || o.key == "server.shards" || !config.is_set(o.key)) continue;
    if (o.key == "metrics.tensorboard_dir") {
      out << o.key << " = " << toml_value(server_tensorboard_dir(config)) << '\n';
      continue;
    }
    Value v;
    switch (o.type) {
      case ValueType::kBool: v = config.get_bool(o.key); break;
      case ValueType::kInt: v = config.get_int(o.key); break;
      case ValueType::kDouble: v = config.get_double(o.key); break;
      case ValueType::kString: v = config.get_string(o.key); break;
    }
    out << o.key << " = " << toml_value(v) << '\n';
  }
  out << "server.min_clients = " << clients << '\n';
  for (const char* section : {"train", "aggregator", "server_optimizer"}) {
    const auto s = config.section(section);
    for (const auto& name : s.names()) {
      const std::string text = s.get_string(name, "");
      double d = 0;
      char* end = nullptr;
      d = std::strtod(text.c_str(), &end);
      (void)d;
      const bool bare = (!text.empty() && end && *end == '\0') || text == "true" || text == "false";
      out << section << '.' << name << " = " << (bare ? text : toml_value(text)) << '\n';
    }
  }
}

}  // namespace

int run_processes(const Config& config, const std::filesystem::path& bin_dir,
                  const std::atomic<bool>& stop, const std::vector<std::string>& client_plugins,
                  const client::LocalTrainingRegistry& rules) {
  const SimOptions options = sim_options_from(config, Runner::kProcesses);
  rules.check(client::trainer_options_from(config.section("train")).rule);
  const auto n = static_cast<std::int64_t>(options.clients);
  const auto server_bin = bin_dir / "cohort-server", client_bin = bin_dir / "cohort-client";
  for (const auto& b : {server_bin, client_bin}) {
    if (access(b.c_str(), X_OK) != 0)
      throw ConfigError("--processes needs " + b.string() + " (build it next to cohort-sim)");
  }
  const auto dir = options.log_dir.empty() ? std::filesystem::temp_directory_path() /
                                                 ("cohort-sim-" + std::to_string(getpid()))
                                           : std::filesystem::path(options.log_dir);
  std::filesystem::create_directories(dir);
  write_server_toml(config, dir / "server.toml", n);
  const auto shards = static_cast<std::int64_t>(options.server.shards);
  std::vector<pid_t> servers, clients;
  auto kill_all = [&](std::vector<pid_t>& pids) {
    for (pid_t p : pids) kill(p, SIGTERM);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    pids.clear();
  };
  int code = 1;
  try {
    const std::string cfg = (dir / "server.toml").string();
    servers.push_back(spawn({server_bin, "--config", cfg, "--insecure", "--shard", "0", "--shards",
                             std::to_string(shards), "--listen", "tcp://127.0.0.1:*", "--port-file",
                             (dir / "port-0").string()},
                            dir / "shard-0.log"));
    const std::string coordinator =
        "tcp://127.0.0.1:" + read_port(dir / "port-0", servers[0], stop);
    for (std::int64_t i = 1; i < shards; ++i) {
      servers.push_back(spawn(
          {server_bin, "--config", cfg, "--insecure", "--shard", std::to_string(i), "--shards",
           std::to_string(shards), "--listen", "tcp://127.0.0.1:*", "--coordinator", coordinator,
           "--server.http=off",  // the endpoint (server.http) is shard 0's only
           "--port-file", (dir / ("port-" + std::to_string(i))).string()},
          dir / ("shard-" + std::to_string(i) + ".log")));
    }
    const int width = static_cast<int>(std::max<std::size_t>(5, std::to_string(n - 1).size()));
    for (std::int64_t i = 0; i < n; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "c%0*lld", width, static_cast<long long>(i));
      std::vector<std::string> args{client_bin, "--insecure",
                                    "--server", coordinator,
                                    "--name",   name,
                                    "--data",   options.data.partition_text,
                                    "--part",   std::to_string(i) + "/" + std::to_string(n),
                                    "--set",    "data.dir=" + options.data.dir,
                                    "--set",    "data.seed=" + std::to_string(options.data.seed)};
      for (const auto& setting : options.data.source_settings) {  // the same data, every client
        args.push_back("--set");
        args.push_back(setting);
      }
      for (const auto& plugin : client_plugins) {  // train.rule's rule, if a plug-in adds it
        args.push_back("--plugin");
        args.push_back(std::filesystem::absolute(plugin).string());
      }
      clients.push_back(spawn(args, dir / (std::string(name) + ".log")));
    }
    std::fprintf(stderr,
                 "cohort-sim --processes: %lld shards and %lld clients on loopback; logs in %s\n",
                 static_cast<long long>(shards), static_cast<long long>(n), dir.c_str());
    int status = 0;
    for (;;) {
      const pid_t p = waitpid(servers[0], &status, WNOHANG);
      if (p == servers[0]) break;
      if (stop.load()) {
        kill(servers[0], SIGTERM);
        waitpid(servers[0], &status, 0);
        break;
      }
      std::this_thread::sleep_for(100ms);
    }
    servers.erase(servers.begin());
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    // The coordinator's per-round lines, as cohort-server printed them.
    std::ifstream log(dir / "shard-0.log");
    for (std::string line; std::getline(log, line);) {
      if (line.rfind("round ", 0) == 0) std::printf("%s\n", line.c_str());
    }
  } catch (...) {
    kill_all(clients);
    kill_all(servers);
    throw;
  }
  kill_all(clients);
  kill_all(servers);
  return code;
}

}  // namespace cohort::sim
