#include <doctest/doctest.h>

#include "cohort/client/push_encoding.h"

TEST_CASE("every push encoding maps to one wire format and back") {
  using cohort::transport::Encoding;
  int rows = 0;
  for (int v = 0; v <= static_cast<int>(Encoding::kPowerSgd); ++v) {
    const auto e = static_cast<Encoding>(v);
    const auto f = cohort::client::wire_format(e);
    REQUIRE(f.has_value());
    CHECK(cohort::client::push_encoding(*f) == e);
    ++rows;
  }
  CHECK(rows == 9);
  CHECK(cohort::client::wire_format(Encoding::kPowerSgd) == cohort::aggregation::WireFormat::kLowRank);
  CHECK_FALSE(cohort::client::wire_format(static_cast<Encoding>(200)).has_value());
}
