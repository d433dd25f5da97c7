#include "cohort/aggregation/plugin.h"

#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "process.h"

namespace {

using cohort::ConfigError;
using cohort::Registries;

// The message of the ConfigError that load_plugin(file) throws, or "" if it does not throw.
std::string load_error(const std::string& file, Registries& registries) {
  try {
    cohort::load_plugin(file, registries);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a good plug-in adds a rule that the registry creates by name and that aggregates") {
  Registries registries = cohort::builtin_registries();
  REQUIRE_FALSE(registries.aggregators.contains("test_plugin_mean"));
  cohort::load_plugin(COHORT_TEST_PLUGIN_GOOD, registries);
  REQUIRE(registries.aggregators.contains("test_plugin_mean"));
  CHECK(registries.aggregators.contains("median"));  // the built-ins are still there

  auto agg = registries.aggregators.create("test_plugin_mean", cohort::ConfigSection{});
  REQUIRE(agg != nullptr);
  CHECK_FALSE(agg->is_streaming());
  agg->begin_round(1, 2);
  const std::vector<float> a{1, 2}, b{3, 6};
  REQUIRE(agg->accept({.client = 1, .offset = 0, .values = a}) ==
          cohort::aggregation::Verdict::kAccepted);
  agg->end_update(1, true);
  REQUIRE(agg->accept({.client = 2, .offset = 0, .values = b}) ==
          cohort::aggregation::Verdict::kAccepted);
  agg->end_update(2, true);
  std::vector<float> out(2);
  REQUIRE(agg->finish_round(out));
  CHECK(out[0] == doctest::Approx(2.0));
  CHECK(out[1] == doctest::Approx(4.0));
}

TEST_CASE("a plug-in's factory reads its options through the host's ConfigSection") {
  Registries registries;
  cohort::load_plugin(COHORT_TEST_PLUGIN_GOOD, registries);
  const cohort::ConfigSection bad(
      "aggregator", {{"name", std::string("test_plugin_mean")}, {"typo", std::int64_t{3}}});
  CHECK_THROWS_AS((void)registries.aggregators.create("test_plugin_mean", bad), ConfigError);
}

TEST_CASE("loading the same plug-in twice is a name clash naming the file") {
  Registries registries;
  cohort::load_plugin(COHORT_TEST_PLUGIN_GOOD, registries);
  const std::string e = load_error(COHORT_TEST_PLUGIN_GOOD, registries);
  CHECK(contains(e, std::string("plug-in ") + COHORT_TEST_PLUGIN_GOOD + ": "));
  CHECK(contains(e, "aggregator 'test_plugin_mean' is registered twice"));
}

TEST_CASE("a plug-in whose rule name clashes with a built-in is refused, naming file and rule") {
  Registries registries = cohort::builtin_registries();
  const std::string e = load_error(COHORT_TEST_PLUGIN_CLASH, registries);
  CHECK(contains(e, COHORT_TEST_PLUGIN_CLASH));
  CHECK(contains(e, "aggregator 'median' is registered twice"));
}

TEST_CASE("a missing file is a one-line error naming it") {
  Registries registries;
  const std::string e = load_error("/nonexistent/librule.so", registries);
  CHECK(e == "plug-in /nonexistent/librule.so: no such file");
}

TEST_CASE("a file that is not a shared object reports the loader's error") {
  cohort::test::TempDir dir;
  const std::string file = dir.file("not_elf.so");
  std::ofstream(file) << "this is not an ELF file\n";
  Registries registries;
  const std::string e = load_error(file, registries);
  CHECK(contains(e, "plug-in " + file + ": cannot load: "));
  CHECK(contains(e, "not_elf.so"));  // dlerror() text names the file too
  CHECK(e.find('\n') == std::string::npos);
}

TEST_CASE("a name without a slash is a file in the working directory, not a library search") {
  Registries registries;
  CHECK(load_error("libc.so.6", registries) == "plug-in libc.so.6: no such file");
}

TEST_CASE("an unresolved symbol fails at load time with dlerror's text") {
  Registries registries;
  const std::string e = load_error(COHORT_TEST_PLUGIN_UNRESOLVED, registries);
  CHECK(contains(e, "cannot load: "));
  CHECK(contains(e, "cohort_test_symbol_nobody_defines"));
}

TEST_CASE("a plug-in without cohort_plugin_abi is refused") {
  Registries registries;
  const std::string e = load_error(COHORT_TEST_PLUGIN_NO_ABI, registries);
  CHECK(contains(e, std::string("plug-in ") + COHORT_TEST_PLUGIN_NO_ABI + ": "));
  CHECK(contains(e, "no entry symbol cohort_plugin_abi"));
}

TEST_CASE("a plug-in built for another ABI is refused before it registers anything") {
  Registries registries;
  const std::string e = load_error(COHORT_TEST_PLUGIN_WRONG_ABI, registries);
  CHECK(contains(e, COHORT_TEST_PLUGIN_WRONG_ABI));
  CHECK(contains(e, "built for plug-in ABI " + std::to_string(cohort::kPluginAbi + 998) +
                        ", this program has ABI " + std::to_string(cohort::kPluginAbi)));
  CHECK_FALSE(registries.aggregators.contains("test_plugin_mean"));
}

TEST_CASE("a plug-in without cohort_register is refused") {
  Registries registries;
  const std::string e = load_error(COHORT_TEST_PLUGIN_NO_REGISTER, registries);
  CHECK(contains(e, COHORT_TEST_PLUGIN_NO_REGISTER));
  CHECK(contains(e, "no entry symbol cohort_register"));
}
