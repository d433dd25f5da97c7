// Compressed pushes: how one client's update of a shard range travels on the wire when a
// Compressor encodes it, and how the shard decodes it as it streams in.
//
// The range is cut into pieces of at most kPushPieceElements elements (1 MiB of fp32, the
// transport's chunk size), each encoded on its own by the compressor (so top-k keeps k per piece,
// error feedback keeps one residual per piece), and the payload is the pieces in order, each
// framed as
//   u32 byte length (little-endian) | a built-in encoding (compressor.h: self-describing header)
// A shard decodes every piece as soon as its bytes are in, into a float buffer it reuses, and
// folds it in at its element offset, so a streaming rule stays streaming and memory stays
// O(piece) per transfer whatever the model size.
//
// PushEncoder: one per (client, shard range); it owns the compressor states, so error feedback and
// PowerSGD's warm start persist across rounds. Not thread-safe. PushDecoder: one per transfer in
// flight; not thread-safe. Both throw as documented per method.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/aggregation/compressor.h"

namespace cohort::aggregation {

inline constexpr std::size_t kPushPieceElements = std::size_t{1} << 18;

// The built-in wire format behind an encoding name ("topk" -> kTopK, "fp16" -> kFp16, "powersgd"
// -> kLowRank, "none" -> kDenseF32); nullopt for a name no built-in decoder reads.
[[nodiscard]] std::optional<WireFormat> wire_format_of(std::string_view encoding);

// The largest payload a well-formed compressed push of `elements` elements may have: what a
// shard allows before it has seen a byte (every built-in encoding fits; bigger is refused).
[[nodiscard]] std::uint64_t max_push_bytes(std::uint64_t elements);

class PushEncoder {
 public:
  // `compressor` must outlive the encoder. Makes the states of every piece of `size` elements.
  // Throws ConfigError if the compressor's encoding has no built-in wire format (a shard could not
  // decode it).
  PushEncoder(const Compressor& compressor, std::size_t size);

  // out = the framed pieces of x. REQUIRES x.size() == size(). Piece i is encoded with seed
  // derive(seed, i). Throws KernelError for a non-finite x (Compressor::encode).
  void encode(std::span<const float> x, std::uint64_t seed, std::vector<std::byte>& out);

  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] WireFormat format() const { return format_; }

 private:
  const Compressor& compressor_;
  std::size_t size_;
  WireFormat format_;
  std::vector<std::unique_ptr<CompressorState>> states_;  // one per piece
  std::vector<std::byte> piece_;                          // reused between calls
};

class PushDecoder {
 public:
  // Called with each decoded piece: its first element (relative to the range) and its values
  // (valid during the call only). Returns false to stop decoding (the update was refused).
  using Sink = std::function<bool(std::size_t offset, std::span<const float> values)>;

  // Starts a transfer of `elements` elements in `format`; keeps the capacity of earlier ones.
  void reset(std::size_t elements, WireFormat format);

  // Takes the next bytes of the payload, in order; decodes every piece they complete into
  // `scratch` (grown when needed, never shrunk: reuse one per shard) and hands it to `sink`.
  // Returns false if the sink did. Throws ProtocolError for a malformed piece: a length of 0 or
  // over the bound, a wrong format, a piece past the range's end, or what decode_builtin() refuses.
  bool feed(std::span<const std::byte> bytes, std::vector<float>& scratch, const Sink& sink);

  // The payload is complete: throws ProtocolError unless exactly `elements` elements were
  // decoded and no partial piece is left.
  void finish() const;

  [[nodiscard]] std::size_t decoded() const { return decoded_; }

 private:
  bool take_piece(std::span<const std::byte> piece, std::vector<float>& scratch, const Sink& sink);

  std::size_t elements_ = 0, decoded_ = 0;
  WireFormat format_ = WireFormat::kDenseF32;
  std::vector<std::byte> pending_;  // a piece (or its length prefix) split across chunks
};

}  // namespace cohort::aggregation
