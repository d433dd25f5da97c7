// Fuzzes the configuration parser (core/config.cc): the input is a TOML document, optionally
// followed by a line "--set" and one "key=value" override per line. Every failure must be a
// ConfigError; dump() of what was accepted must not fail.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cohort/core/config.h"
#include "cohort/core/error.h"

namespace {

const cohort::ConfigSchema& schema() {
  static const cohort::ConfigSchema s = [] {
    cohort::ConfigSchema sc;
    sc.add("server.rounds", std::int64_t{10}, "rounds")
        .add("server.learning_rate", 0.1, "server learning rate")
        .add("server.insecure", false, "plaintext")
        .add("server.listen", std::string("tcp://0.0.0.0:7000"), "url")
        .add("train.batch_size", std::int64_t{32}, "batch")
        .add("a.b.c.d", std::int64_t{1}, "deep key")
        .add_secret("tls.key_password", std::string(), "secret")
        .add_section("aggregator", "plug-in options");
    return sc;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view toml = input;
  std::string_view overrides;
  if (const auto cut = input.find("\n--set\n"); cut != std::string_view::npos) {
    toml = input.substr(0, cut);
    overrides = input.substr(cut + 7);
  }
  cohort::Config config(schema());
  try {
    config.merge_toml(toml, "fuzz.toml");
  } catch (const cohort::ConfigError&) {
  }
  while (!overrides.empty()) {
    const auto nl = overrides.find('\n');
    const std::string_view line = overrides.substr(0, nl);
    overrides = nl == std::string_view::npos ? std::string_view{} : overrides.substr(nl + 1);
    try {
      config.apply_override(line);
    } catch (const cohort::ConfigError&) {
    }
  }
  (void)config.dump();
  (void)config.section("aggregator").names();
  return 0;
}
