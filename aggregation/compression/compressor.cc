// Shared parts of the built-in wire encodings: header inspection, decode_builtin, seeds, and the
// error_feedback option.
#include "cohort/aggregation/compressor.h"

#include "cohort/aggregation/error_feedback.h"
#include "cohort/core/random.h"
#include "wire.h"

namespace cohort::aggregation {

std::size_t encoded_element_count(std::span<const std::byte> bytes) {
  return detail::ByteReader(bytes).raw_header().count;
}

WireFormat encoded_format(std::span<const std::byte> bytes) {
  return detail::ByteReader(bytes).raw_header().format;
}

void decode_builtin(std::span<const std::byte> bytes, std::span<float> out) {
  switch (encoded_format(bytes)) {
    case WireFormat::kDenseF32: return detail::decode_dense(bytes, out);
    case WireFormat::kFp16: return detail::decode_fp16(bytes, out);
    case WireFormat::kBf16: return detail::decode_bf16(bytes, out);
    case WireFormat::kInt8: return detail::decode_int8(bytes, out);
    case WireFormat::kQsgd: return detail::decode_qsgd(bytes, out);
    case WireFormat::kTopK: return detail::decode_topk(bytes, out);
    case WireFormat::kRandomK: return detail::decode_randomk(bytes, out);
    case WireFormat::kSign: return detail::decode_sign(bytes, out);
    case WireFormat::kLowRank: return detail::decode_lowrank(bytes, out);
  }
  throw ProtocolError("unknown compressed format");  // unreachable: raw_header() checks
}

std::uint64_t compression_seed(std::uint64_t run_seed, std::uint64_t round, std::uint64_t client) {
  return derive_seed(run_seed, round, client);
}

namespace detail {

std::unique_ptr<Compressor> with_error_feedback(const ConfigSection& options,
                                                std::unique_ptr<Compressor> c, bool ef_default) {
  if (!options.get_bool("error_feedback", ef_default)) return c;
  return std::make_unique<ErrorFeedback>(std::move(c));
}

}  // namespace detail
}  // namespace cohort::aggregation
