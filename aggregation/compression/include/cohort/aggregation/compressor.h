// Compression of updates (the Compressor plug-in; docs/ALGORITHMS.md section 7).
//
// A Compressor turns a float span into the bytes of a named wire encoding and back. It is an
// immutable algorithm plus options: encode() and decode() are const and thread-safe. Anything
// that persists between a client's calls (the error-feedback residual, PowerSGD's warm-start Q)
// lives in an explicit CompressorState the caller owns, one per client and per tensor it encodes
// (make_state(); nullptr for stateless compressors), so 10,000 simulated clients share one
// Compressor. Randomised compressors (qsgd, randomk, stochastic int8, powersgd's first Q) draw
// only from the seed passed to encode(): pass a fresh one per (round, client, tensor), e.g.
// compression_seed(run_seed, round, client).
//
// Built-in wire encodings (all little-endian) start with an 8-byte header:
//   u8 format (WireFormat), u8 version (1), u16 format parameter, u32 element count d
// and are self-describing: decode() needs no options, and decode_builtin() decodes any of them.
// Each call encodes one self-contained piece, so a client may encode per tensor or per transport
// chunk and the server decode each piece as it arrives. Sizes for d elements (bytes):
//   none 8+4d; fp16, bf16 8+2d; int8 12+4*scales+d; qsgd 12+4*buckets+ceil(d(1+ceil(log2(s+1)))/8);
//   topk 12+4k+min(4k, ceil(d/8)); randomk 20+4k (a seed, not indices); sign 12+ceil(d/8);
//   powersgd 17+4r(a+b) for the a x b view (dense 9+4d when that is not smaller).
// decode() throws ProtocolError on anything malformed (wrong format, version, length, element
// count other than out.size(), out-of-range index or level); it never reads out of bounds.
// encode() throws KernelError if x has a non-finite value (a diverged client should fail loudly,
// not send garbage); it reuses out's capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/config.h"

namespace cohort::aggregation {

// Per-client state of a stateful compressor. Owned by the caller; use it with the compressor that
// made it only, from one thread at a time.
class CompressorState {
 public:
  virtual ~CompressorState() = default;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  // Name of the wire encoding encode() writes ("topk", ...); a wrapper reports its inner one.
  [[nodiscard]] virtual std::string_view encoding() const = 0;
  // True when E[decode(encode(x))] = x. Biased compressors belong under ErrorFeedback (7.1).
  [[nodiscard]] virtual bool is_unbiased() const = 0;
  // State for a client encoding vectors of `size` elements; nullptr when stateless.
  [[nodiscard]] virtual std::unique_ptr<CompressorState> make_state(std::size_t /*size*/) const {
    return nullptr;
  }
  // out = encoding of x. REQUIRES: state is what make_state(x.size()) returned (nullptr for a
  // stateless compressor); InternalError otherwise.
  virtual void encode(std::span<const float> x, CompressorState* state, std::uint64_t seed,
                      std::vector<std::byte>& out) const = 0;
  // out = the decoded vector. Throws ProtocolError on malformed bytes or a count != out.size().
  virtual void decode(std::span<const std::byte> bytes, std::span<float> out) const = 0;
};

// Built-in wire formats (the first header byte).
enum class WireFormat : std::uint8_t {
  kDenseF32 = 1,
  kFp16 = 2,
  kBf16 = 3,
  kInt8 = 4,
  kQsgd = 5,
  kTopK = 6,
  kRandomK = 7,
  kSign = 8,
  kLowRank = 9,
};
inline constexpr std::size_t kWireHeaderBytes = 8;

// The element count of a built-in encoding; ProtocolError if `bytes` does not start with a valid
// header. Lets a receiver size its output before decoding.
[[nodiscard]] std::size_t encoded_element_count(std::span<const std::byte> bytes);
// The format byte of a built-in encoding (ProtocolError when invalid).
[[nodiscard]] WireFormat encoded_format(std::span<const std::byte> bytes);
// Decodes any built-in encoding (by its header) into out; ProtocolError as Compressor::decode.
void decode_builtin(std::span<const std::byte> bytes, std::span<float> out);

// A seed for one encode() call from a run seed, the round and the client.
[[nodiscard]] std::uint64_t compression_seed(std::uint64_t run_seed, std::uint64_t round,
                                             std::uint64_t client);

using CompressorFactory = std::function<std::unique_ptr<Compressor>(const ConfigSection& options)>;

// Names come from config: compressor = { name = "topk", k_fraction = 0.01 }. Built-ins and their
// option keys (every one also takes error_feedback = true|false, which wraps it in ErrorFeedback;
// the default is true for the biased topk, unscaled randomk, sign and powersgd, else false):
//   none                      fp32 as is
//   fp16, bf16                2-byte casts, round to nearest even
//   int8   chunk = 0, stochastic = false   s = max|x|/127 per chunk of `chunk` (0: one scale)
//   qsgd   s = 255, bucket_size = 512, norm = "l2" | "max"    (7.2; unbiased)
//   topk   k | k_fraction = 0.01           k = max(1, floor(d k_fraction)), capped at d
//   randomk  k | k_fraction = 0.01, scaled = false   scaled: values times d/k, unbiased
//   sign                      (||x||_1 / d) sign(x), sign(0) = +1 (7.3)
//   powersgd rank = 2, cols = 0            rank-r power step on a matrix view (see powersgd.h)
class CompressorRegistry {
 public:
  // Throws ConfigError if the name is taken.
  void add(std::string name, CompressorFactory factory);
  // Throws ConfigError listing the known names if `name` is unknown, or naming a bad option.
  [[nodiscard]] std::unique_ptr<Compressor> create(std::string_view name,
                                                   const ConfigSection& options) const;
  [[nodiscard]] bool contains(std::string_view name) const;
  [[nodiscard]] std::string names() const;

 private:
  std::map<std::string, CompressorFactory, std::less<>> factories_;
};

void add_builtin_compressors(CompressorRegistry& registry);

}  // namespace cohort::aggregation
