// cohort-server --plugin, as a user runs it: one-line errors naming the file, and a plug-in's
// rule picked by name at startup.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "process.h"

using namespace std::chrono_literals;
using cohort::test::Process;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The lines of `text` that are not empty.
int line_count(const std::string& text) {
  int n = 0;
  bool in_line = false;
  for (char c : text) {
    if (c == '\n') {
      n += in_line ? 1 : 0;
      in_line = false;
    } else {
      in_line = true;
    }
  }
  return n + (in_line ? 1 : 0);
}

}  // namespace

TEST_CASE("--help documents --plugin") {
  auto p = Process::spawn(COHORT_SERVER_BIN, {"--help"});
  REQUIRE(p.wait_for(10s) == 0);
  CHECK(contains(p.stdout_text(), "--plugin"));
  CHECK(contains(p.stdout_text(), "cohort_register"));
}

TEST_CASE("a shard starts with an aggregator that only a plug-in defines") {
  cohort::test::TempDir dir;
  const std::string port_file = dir.file("port");
  auto server =
      Process::spawn(COHORT_SERVER_BIN,
                     {"--plugin", COHORT_TEST_PLUGIN_GOOD, "--aggregator.name=test_plugin_mean",
                      "--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", port_file,
                      "--server.metrics_file=" + dir.file("metrics.jsonl"), "--log-level", "info"});
  // The port file is written after run() created the configured aggregator by name; a bad name
  // would have ended the process before binding.
  const std::string port = cohort::test::read_when_ready(port_file, 20s);
  CHECK_FALSE(port.empty());
  INFO("stderr: " << server.stderr_text());
  CHECK(server.running());
  CHECK(contains(server.stderr_text(), std::string("loaded plug-in ") + COHORT_TEST_PLUGIN_GOOD));
  // Killed by the handle (SIGKILL): an idle shard 0 does not yet stop cleanly on SIGTERM.
}

TEST_CASE("without the plug-in the same name is an unknown aggregator") {
  auto server = Process::spawn(COHORT_SERVER_BIN, {"--aggregator.name=test_plugin_mean",
                                                   "--insecure", "--listen", "tcp://127.0.0.1:*"});
  REQUIRE(server.wait_for(20s) == 1);
  CHECK(contains(server.stderr_text(), "unknown aggregator 'test_plugin_mean'"));
}

TEST_CASE("plug-in failures are one line on stderr naming the file, and exit 1") {
  struct Case {
    std::string file;
    std::string reason;
  };
  const Case cases[] = {
      {"/nonexistent/librule.so", "no such file"},
      {COHORT_TEST_PLUGIN_WRONG_ABI, "built for plug-in ABI"},
      {COHORT_TEST_PLUGIN_NO_ABI, "no entry symbol cohort_plugin_abi"},
      {COHORT_TEST_PLUGIN_NO_REGISTER, "no entry symbol cohort_register"},
      {COHORT_TEST_PLUGIN_CLASH, "aggregator 'median' is registered twice"},
      {COHORT_TEST_PLUGIN_UNRESOLVED, "cannot load: "},
  };
  for (const Case& c : cases) {
    CAPTURE(c.file);
    auto server = Process::spawn(COHORT_SERVER_BIN, {"--plugin", c.file, "--insecure", "--listen",
                                                     "tcp://127.0.0.1:*", "--log-level", "warn"});
    REQUIRE(server.wait_for(20s) == 1);
    const std::string err = server.stderr_text();
    CAPTURE(err);
    CHECK(contains(err, "cohort-server: plug-in " + c.file + ": " + c.reason));
    CHECK(line_count(err) == 1);
  }
}

TEST_CASE("plug-ins load in order: a second plug-in cannot take the first one's rule name") {
  auto server = Process::spawn(
      COHORT_SERVER_BIN, {"--plugin", COHORT_TEST_PLUGIN_GOOD, "--plugin", COHORT_TEST_PLUGIN_GOOD,
                          "--insecure", "--listen", "tcp://127.0.0.1:*", "--log-level", "warn"});
  REQUIRE(server.wait_for(20s) == 1);
  CHECK(contains(server.stderr_text(), std::string("plug-in ") + COHORT_TEST_PLUGIN_GOOD +
                                           ": aggregator 'test_plugin_mean' is registered twice"));
}
