// Runs the real cohort-keygen binary (COHORT_KEYGEN_BIN) in a temp dir.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cohort/transport/security/tls.h"
#include "test_support.h"

extern char** environ;

namespace fs = std::filesystem;
namespace sec = cohort::transport::security;
using sec::test::TempDir;

namespace {

struct Result {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Spawns cohort-keygen with `args` (no shell), killing it after 30 s.
Result keygen(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), COHORT_KEYGEN_BIN);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out_file = (dir / "stdout.txt").string();
  const std::string err_file = (dir / "stderr.txt").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL("cohort-keygen timed out");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  if (r.exit_code != 0) MESSAGE("cohort-keygen stderr: " << r.err);
  return r;
}

bool one_line(const std::string& s) {
  return !s.empty() && s.back() == '\n' && s.find('\n') == s.size() - 1;
}

}  // namespace

TEST_CASE("cohort-keygen creates a CA and nodes that complete a handshake") {
  TempDir dir;
  const std::string ca = (dir / "pki" / "ca").string();
  const std::string nodes = (dir / "pki" / "nodes").string();
  REQUIRE(keygen(dir, {"ca", "--out", ca}).exit_code == 0);
  const Result shard = keygen(dir, {"node", "--ca", ca, "--name", "shard-0", "--out", nodes});
  REQUIRE(shard.exit_code == 0);
  CHECK(shard.out.find("shard-0.key") != std::string::npos);
  REQUIRE(keygen(dir, {"node", "--ca", ca, "--name=client-1", "--out", nodes}).exit_code == 0);
  const auto owner_rw = fs::perms::owner_read | fs::perms::owner_write;
  CHECK((fs::status(fs::path(ca) / "ca.key").permissions() & fs::perms::all) == owner_rw);
  CHECK((fs::status(fs::path(nodes) / "shard-0.key").permissions() & fs::perms::all) == owner_rw);

  auto files = [&](const std::string& name) {
    return sec::TlsFiles{.ca_file = ca + "/ca.pem",
                         .cert_file = nodes + "/" + name + ".pem",
                         .key_file = nodes + "/" + name + ".key"};
  };
  const sec::TlsContext server_ctx(files("shard-0"));
  const sec::TlsContext client_ctx(files("client-1"));
  sec::Handshake client(client_ctx, sec::Role::kClient, "shard-0");
  sec::Handshake server(server_ctx, sec::Role::kServer, "client-1");
  sec::test::run_handshake(client, server);
  CHECK(client.done());
  CHECK(server.done());
}

TEST_CASE("cohort-keygen fails with one line and exit 1") {
  TempDir dir;
  const std::string ca = (dir / "ca").string();

  Result r = keygen(dir, {"node", "--ca", ca, "--name", "n1", "--out", ca});
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.err));
  CHECK(r.err.find("no CA in") != std::string::npos);

  REQUIRE(keygen(dir, {"ca", "--out", ca}).exit_code == 0);
  const std::string original = slurp(fs::path(ca) / "ca.key");
  r = keygen(dir, {"node", "--ca", ca, "--name", "bad/name", "--out", ca});
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.err));
  CHECK(r.err.find("invalid node id 'bad/name'") != std::string::npos);

  r = keygen(dir, {"ca", "--out", ca});
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.err));
  CHECK(r.err.find("already exists") != std::string::npos);
  CHECK(slurp(fs::path(ca) / "ca.key") == original);
  CHECK(keygen(dir, {"ca", "--out", ca, "--force"}).exit_code == 0);
  CHECK(slurp(fs::path(ca) / "ca.key") != original);

  r = keygen(dir, {"node", "--ca", ca, "--out", ca});  // --name missing
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.err));
  r = keygen(dir, {});  // no subcommand
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.err));
  r = keygen(dir, {"frobnicate"});
  CHECK(r.exit_code == 1);

  r = keygen(dir, {"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("node") != std::string::npos);
  CHECK(r.out.find("0600") != std::string::npos);
  r = keygen(dir, {"node", "--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--name") != std::string::npos);
}
