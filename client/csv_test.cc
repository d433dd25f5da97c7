#include "cohort/client/csv.h"

#include <doctest/doctest.h>

#include <string>

#include "cohort/core/error.h"
#include "test_util.h"

namespace cohort::client {
namespace {

std::string data_error(const auto& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError>";
}

TEST_CASE("CSV with the label first, a header row and spaces") {
  const Dataset d = parse_csv_dataset("label,a,b\n1, 0.5 ,2\n\n0,-1e-1,+3\r\n2,4,5\n", "t.csv",
                                      {.label_column = 0, .skip_rows = 1});
  REQUIRE(d.size() == 3);
  CHECK(d.feature_dim() == 2);
  CHECK(d.shape() == Shape{2, 1, 1});
  CHECK(d.num_classes() == 3);
  CHECK(d.labels()[0] == 1);
  CHECK(d.labels()[1] == 0);
  CHECK(d.row(0)[0] == doctest::Approx(0.5));
  CHECK(d.row(1)[0] == doctest::Approx(-0.1));
  CHECK(d.row(1)[1] == doctest::Approx(3.0));
}

TEST_CASE("CSV with the label last, another delimiter, a scale and a shape") {
  const Dataset d = parse_csv_dataset("0;255;51;102;1\n255;0;0;0;0\n", "px.csv",
                                      {.label_column = -1,
                                       .delimiter = ';',
                                       .scale = 1.0f / 255,
                                       .shape = Shape{1, 2, 2},
                                       .num_classes = 10});
  REQUIRE(d.size() == 2);
  CHECK(d.shape() == Shape{1, 2, 2});
  CHECK(d.num_classes() == 10);
  CHECK(d.labels()[0] == 1);
  CHECK(d.row(0)[1] == doctest::Approx(1.0));
  CHECK(d.row(0)[2] == doctest::Approx(0.2));
}

TEST_CASE("CSV errors name the file and line") {
  CHECK(data_error([] { (void)parse_csv_dataset("1,2,3\n0,1\n", "r.csv"); }) ==
        "r.csv:2: expected 3 columns, got 2");
  CHECK(data_error([] { (void)parse_csv_dataset("1,2,3\n0,x,1\n", "r.csv"); }) ==
        "r.csv:2:2: not a finite number: 'x'");
  CHECK(data_error([] { (void)parse_csv_dataset("1,2\n-1,2\n", "r.csv"); }) ==
        "r.csv:2:1: expected a non-negative integer label, got '-1'");
  CHECK(data_error([] { (void)parse_csv_dataset("1.5,2\n", "r.csv"); }) ==
        "r.csv:1:1: expected a non-negative integer label, got '1.5'");
  CHECK(data_error([] {
          (void)parse_csv_dataset("a,b\n", "r.csv", {.skip_rows = 1});
        }).starts_with("r.csv: no data rows"));
  CHECK(data_error([] {
          (void)parse_csv_dataset("1,2\n", "r.csv", {.label_column = 2});
        }).starts_with("r.csv:1: label column 2 does not exist"));
  CHECK(data_error([] {
          (void)parse_csv_dataset("1,2,3\n", "r.csv", {.shape = Shape{1, 3, 1}});
        }).starts_with("r.csv: 2 feature columns"));
  CHECK(data_error([] {
          (void)parse_csv_dataset("4,2\n", "r.csv", {.num_classes = 3});
        }).starts_with("r.csv: dataset: label 4 outside [0, 3)"));
}

TEST_CASE("CSV from a file, and a missing file") {
  testing::TempDir dir;
  testing::write_text(dir.file("d.csv"), "3,1,2\n1,4,5\n");
  const Dataset d = load_csv_dataset(dir.file("d.csv"));
  CHECK(d.size() == 2);
  CHECK(d.labels()[0] == 3);
  CHECK(data_error([&] { (void)load_csv_dataset(dir.file("none.csv")); }) ==
        dir.file("none.csv").string() + ": no such file (expected a CSV file)");
}

}  // namespace
}  // namespace cohort::client
