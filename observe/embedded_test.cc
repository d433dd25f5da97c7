#include "cohort/observe/embedded.h"

#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("embedded_file returns each embedded file's bytes, unchanged") {
  const std::string dir = COHORT_DASHBOARD_DIR;
  const struct {
    const char* name;
    std::string path;
  } files[] = {{"index.html", dir + "/index.html"},
               {"dashboard.js", dir + "/dashboard.js"},
               {"chart.js", COHORT_CHART_JS}};
  for (const auto& file : files) {
    CAPTURE(file.name);
    const auto bytes = cohort::observe::embedded_file(file.name);
    REQUIRE(bytes.has_value());
    CHECK(*bytes == read_file(file.path));
  }
  CHECK(cohort::observe::embedded_file("chart.js")->find("Chart.js v3") != std::string_view::npos);
}

TEST_CASE("embedded_file knows no other name") {
  CHECK_FALSE(cohort::observe::embedded_file("").has_value());
  CHECK_FALSE(cohort::observe::embedded_file("index.htm").has_value());
  CHECK_FALSE(cohort::observe::embedded_file("/static/chart.js").has_value());
  CHECK_FALSE(cohort::observe::embedded_file("index.html\n").has_value());
}
