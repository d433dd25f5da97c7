#include "cohort/client/dataset.h"

#include <doctest/doctest.h>

#include <vector>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

Dataset three_rows() {
  const std::vector<float> x{0, 1, 2, 3, 4, 5};
  return Dataset(FloatBuffer(std::span<const float>(x)), {2, 0, 2}, Shape{2, 1, 1});
}

TEST_CASE("a Dataset checks its sizes and labels") {
  const Dataset d = three_rows();
  CHECK(d.size() == 3);
  CHECK(d.feature_dim() == 2);
  CHECK(d.num_classes() == 3);
  CHECK(d.row(2)[1] == 5.0f);
  CHECK(d.label_counts() == std::vector<std::size_t>{1, 0, 2});
  CHECK_THROWS_AS(Dataset(FloatBuffer(5), {0, 1, 2}, Shape{2, 1, 1}), DataError);
  CHECK_THROWS_AS(Dataset(FloatBuffer(2), {-1}, Shape{2, 1, 1}), DataError);
  CHECK_THROWS_AS(Dataset(FloatBuffer(2), {3}, Shape{2, 1, 1}, 3), DataError);
}

TEST_CASE("subset copies rows in order; standardize uses the given stats") {
  Dataset d = three_rows();
  const std::vector<std::uint32_t> rows{2, 0};
  const Dataset s = d.subset(rows);
  CHECK(s.size() == 2);
  CHECK(s.row(0)[0] == 4.0f);
  CHECK(s.labels()[1] == 2);
  CHECK(s.num_classes() == 3);
  const std::vector<std::uint32_t> bad{3};
  CHECK_THROWS_AS((void)d.subset(bad), DataError);

  const FeatureStats stats = feature_stats(d);
  CHECK(stats.mean == doctest::Approx(2.5));
  CHECK(stats.stddev == doctest::Approx(1.7078251));
  standardize(d, stats);
  const FeatureStats after = feature_stats(d);
  CHECK(after.mean == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(after.stddev == doctest::Approx(1.0));
  CHECK_THROWS_AS(standardize(d, {0.0f, 0.0f}), ConfigError);
}

}  // namespace
}  // namespace cohort::client
