#include "cohort/core/config.h"

#include <doctest/doctest.h>

#include "cohort/core/error.h"

namespace {
cohort::ConfigSchema schema() {
  cohort::ConfigSchema s;
  s.add("server.rounds", std::int64_t{10}, "rounds")
      .add("server.lr", 0.1, "learning rate")
      .add("server.name", std::string("a"), "name")
      .add("tls.enabled", true, "use TLS")
      .add_secret("tls.password", std::string(""), "key password")
      .add_section("aggregator", "aggregation rule and its options");
  return s;
}
}  // namespace

TEST_CASE("defaults, then TOML, then overrides") {
  auto c = cohort::Config(schema());
  CHECK(c.get_int("server.rounds") == 10);
  c.merge_toml("[server]\nrounds = 20\nlr = 1\n", "test.toml");
  CHECK(c.get_int("server.rounds") == 20);
  CHECK(c.get_double("server.lr") == 1.0);  // an int where a float is declared is fine
  c.apply_override("server.rounds=30");
  CHECK(c.get_int("server.rounds") == 30);
  CHECK(c.is_set("server.rounds"));
  CHECK_FALSE(c.is_set("server.name"));
}

TEST_CASE("an unknown key is an error naming the key and the closest valid ones") {
  auto c = cohort::Config(schema());
  try {
    c.merge_toml("server.roundz = 3\n", "bad.toml");
    FAIL("no error");
  } catch (const cohort::ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find("server.roundz") != std::string::npos);
    CHECK(what.find("server.rounds") != std::string::npos);
    CHECK(what.find("bad.toml") != std::string::npos);
  }
  CHECK_THROWS_AS(c.apply_override("nope.key=1"), cohort::ConfigError);
}

TEST_CASE("a wrong type is an error naming the key") {
  auto c = cohort::Config(schema());
  CHECK_THROWS_WITH_AS(c.merge_toml("server.rounds = \"many\"\n", "x"),
                       doctest::Contains("server.rounds"), cohort::ConfigError);
  CHECK_THROWS_WITH_AS(c.apply_override("server.rounds=1.5"), doctest::Contains("int"),
                       cohort::ConfigError);
  CHECK_THROWS_AS(c.apply_override("tls.enabled=maybe"), cohort::ConfigError);
  CHECK_THROWS_AS(c.apply_override("server.rounds"), cohort::ConfigError);
  CHECK_THROWS_AS(c.merge_toml("this is not toml", "x"), cohort::ConfigError);
}

TEST_CASE("free-form sections reach plug-ins through ConfigSection") {
  auto c = cohort::Config(schema());
  c.merge_toml("aggregator = { name = \"trimmed_mean\", beta = 0.1, keep = 3 }\n", "x");
  auto s = c.section("aggregator");
  CHECK(s.get_string("name", "") == "trimmed_mean");
  CHECK(s.get_double("beta", 0) == doctest::Approx(0.1));
  CHECK(s.get_double("keep", 0) == 3.0);
  CHECK(s.get_int("missing", 7) == 7);
  CHECK_THROWS_AS((void)s.get_int("beta", 0), cohort::ConfigError);
  const std::string_view known[] = {"name", "beta"};
  CHECK_THROWS_WITH_AS(s.require_known(known), doctest::Contains("aggregator.keep"),
                       cohort::ConfigError);
}

TEST_CASE("dump redacts secrets") {
  auto c = cohort::Config(schema());
  c.apply_override("tls.password=hunter2");
  const std::string d = c.dump();
  CHECK(d.find("hunter2") == std::string::npos);
  CHECK(d.find("server.rounds = 10") != std::string::npos);
}

TEST_CASE("free-form overrides are typed as numbers before booleans") {
  auto c = cohort::Config(schema());
  c.apply_override("aggregator.keep=1");
  c.apply_override("aggregator.on=true");
  c.apply_override("aggregator.beta=0.5");
  c.apply_override("aggregator.name=median");
  auto s = c.section("aggregator");
  CHECK(s.get_int("keep", 0) == 1);
  CHECK(s.get_bool("on", false));
  CHECK(s.get_double("beta", 0) == 0.5);
  CHECK(s.get_string("name", "") == "median");
}
