#include "cohort/aggregation/push_codec.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/random.h"

namespace cohort::aggregation {
namespace {

constexpr std::size_t kLengthBytes = sizeof(std::uint32_t);

// Worst case of any built-in encoding of n elements (compressor.h's sizes): qsgd with 16-bit
// levels and one-element buckets, 12 + 4n + ceil(17n / 8) + ..., stays under 64 + 7n.
std::uint64_t max_piece_bytes(std::uint64_t n) { return 64 + 7 * n; }

std::size_t pieces_of(std::size_t size) {
  return (size + kPushPieceElements - 1) / kPushPieceElements;
}

}  // namespace

std::optional<WireFormat> wire_format_of(std::string_view encoding) {
  if (encoding == "none") return WireFormat::kDenseF32;
  if (encoding == "fp16") return WireFormat::kFp16;
  if (encoding == "bf16") return WireFormat::kBf16;
  if (encoding == "int8") return WireFormat::kInt8;
  if (encoding == "qsgd") return WireFormat::kQsgd;
  if (encoding == "topk") return WireFormat::kTopK;
  if (encoding == "randomk") return WireFormat::kRandomK;
  if (encoding == "sign") return WireFormat::kSign;
  if (encoding == "powersgd") return WireFormat::kLowRank;
  return std::nullopt;
}

std::uint64_t max_push_bytes(std::uint64_t elements) {
  const std::uint64_t pieces = (elements + kPushPieceElements - 1) / kPushPieceElements;
  return pieces * (kLengthBytes + max_piece_bytes(0)) + 7 * elements;
}

PushEncoder::PushEncoder(const Compressor& compressor, std::size_t size)
    : compressor_(compressor), size_(size) {
  const auto format = wire_format_of(compressor.encoding());
  if (!format) {
    throw ConfigError("compressor encoding '" + std::string(compressor.encoding()) +
                      "' has no built-in wire format, so no shard could decode it");
  }
  format_ = *format;
  for (std::size_t i = 0; i < pieces_of(size); ++i) {
    const std::size_t n = std::min(kPushPieceElements, size - i * kPushPieceElements);
    states_.push_back(compressor.make_state(n));
  }
}

void PushEncoder::encode(std::span<const float> x, std::uint64_t seed,
                         std::vector<std::byte>& out) {
  COHORT_CHECK(x.size() == size_) << "push encoder for " << size_ << " elements got " << x.size();
  out.clear();
  for (std::size_t i = 0; i < states_.size(); ++i) {
    const std::size_t first = i * kPushPieceElements;
    const auto piece = x.subspan(first, std::min(kPushPieceElements, size_ - first));
    compressor_.encode(piece, states_[i].get(), derive_seed(seed, i), piece_);
    COHORT_CHECK(piece_.size() <= max_piece_bytes(piece.size()))
        << "compressor wrote " << piece_.size() << " bytes for " << piece.size() << " elements";
    const auto len = static_cast<std::uint32_t>(piece_.size());
    const std::size_t at = out.size();
    out.resize(at + kLengthBytes + piece_.size());
    std::memcpy(out.data() + at, &len, kLengthBytes);
    std::memcpy(out.data() + at + kLengthBytes, piece_.data(), piece_.size());
  }
}

void PushDecoder::reset(std::size_t elements, WireFormat format) {
  elements_ = elements;
  decoded_ = 0;
  format_ = format;
  pending_.clear();
}

bool PushDecoder::take_piece(std::span<const std::byte> piece, std::vector<float>& scratch,
                             const Sink& sink) {
  if (encoded_format(piece) != format_) {
    throw ProtocolError("compressed piece has format " +
                        std::to_string(static_cast<int>(encoded_format(piece))) +
                        ", the push announced " + std::to_string(static_cast<int>(format_)));
  }
  const std::size_t n = encoded_element_count(piece);
  if (n == 0 || n > kPushPieceElements || n > elements_ - decoded_) {
    throw ProtocolError("compressed piece of " + std::to_string(n) + " elements at element " +
                        std::to_string(decoded_) + " of " + std::to_string(elements_));
  }
  if (scratch.size() < n) scratch.resize(std::max(n, std::min(elements_, kPushPieceElements)));
  const std::span<float> values(scratch.data(), n);
  decode_builtin(piece, values);
  const std::size_t offset = decoded_;
  decoded_ += n;
  return sink(offset, values);
}

bool PushDecoder::feed(std::span<const std::byte> bytes, std::vector<float>& scratch,
                       const Sink& sink) {
  while (!bytes.empty()) {
    // Whole pieces straight from the chunk when nothing is pending: no copy.
    if (pending_.empty() && bytes.size() >= kLengthBytes) {
      std::uint32_t len = 0;
      std::memcpy(&len, bytes.data(), kLengthBytes);
      const std::size_t left = elements_ - decoded_;
      if (len == 0 || len > max_piece_bytes(std::min(left, kPushPieceElements))) {
        throw ProtocolError("compressed piece of " + std::to_string(len) + " bytes");
      }
      if (bytes.size() - kLengthBytes >= len) {
        if (!take_piece(bytes.subspan(kLengthBytes, len), scratch, sink)) return false;
        bytes = bytes.subspan(kLengthBytes + len);
        continue;
      }
    }
    // A piece split across chunks: gather it (its bound keeps pending_ small).
    std::size_t want = kLengthBytes;
    if (pending_.size() >= kLengthBytes) {
      std::uint32_t len = 0;
      std::memcpy(&len, pending_.data(), kLengthBytes);
      want = kLengthBytes + len;
    }
    const std::size_t take = std::min(want - pending_.size(), bytes.size());
    pending_.insert(pending_.end(), bytes.begin(),
                    bytes.begin() + static_cast<std::ptrdiff_t>(take));
    bytes = bytes.subspan(take);
    if (pending_.size() == kLengthBytes) {
      std::uint32_t len = 0;
      std::memcpy(&len, pending_.data(), kLengthBytes);
      const std::size_t left = elements_ - decoded_;
      if (len == 0 || len > max_piece_bytes(std::min(left, kPushPieceElements))) {
        throw ProtocolError("compressed piece of " + std::to_string(len) + " bytes");
      }
    } else if (pending_.size() > kLengthBytes && pending_.size() == want) {
      const bool go_on =
          take_piece(std::span<const std::byte>(pending_).subspan(kLengthBytes), scratch, sink);
      pending_.clear();
      if (!go_on) return false;
    }
  }
  return true;
}

void PushDecoder::finish() const {
  if (!pending_.empty()) {
    throw ProtocolError("compressed update ends inside a piece (" +
                        std::to_string(pending_.size()) + " bytes left over)");
  }
  if (decoded_ != elements_) {
    throw ProtocolError("compressed update decodes to " + std::to_string(decoded_) +
                        " elements, the push announced " + std::to_string(elements_));
  }
}

}  // namespace cohort::aggregation
