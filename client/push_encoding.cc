#include "cohort/client/push_encoding.h"

#include <array>
#include <string>
#include <utility>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

using aggregation::WireFormat;
using transport::Encoding;

constexpr std::array<std::pair<Encoding, WireFormat>, 9> kRows{{
    {Encoding::kDenseF32, WireFormat::kDenseF32},
    {Encoding::kDenseF16, WireFormat::kFp16},
    {Encoding::kDenseBf16, WireFormat::kBf16},
    {Encoding::kInt8, WireFormat::kInt8},
    {Encoding::kQsgd, WireFormat::kQsgd},
    {Encoding::kTopK, WireFormat::kTopK},
    {Encoding::kRandomK, WireFormat::kRandomK},
    {Encoding::kSign, WireFormat::kSign},
    {Encoding::kPowerSgd, WireFormat::kLowRank},
}};

}  // namespace

std::optional<WireFormat> wire_format(Encoding e) {
  for (const auto& [encoding, format] : kRows) {
    if (encoding == e) return format;
  }
  return std::nullopt;
}

Encoding push_encoding(WireFormat f) {
  for (const auto& [encoding, format] : kRows) {
    if (format == f) return encoding;
  }
  throw InternalError("no push encoding for wire format " + std::to_string(static_cast<int>(f)));
}

}  // namespace cohort::client
