// Byte and bit packing for the built-in compressor encodings (private header). Little-endian;
// readers throw ProtocolError instead of reading past the end.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "cohort/aggregation/compressor.h"
#include "cohort/core/error.h"

namespace cohort::aggregation::detail {

static_assert(std::endian::native == std::endian::little,
              "wire encodings are little-endian; add byte swaps for this host");

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>& out) : out_(out) { out_.clear(); }
  template <typename T>
  void put(T value) {
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  template <typename T>
  void put_array(std::span<const T> values) {
    const auto at = out_.size();
    out_.resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size_bytes());
  }
  // Appends n zero bytes and returns them; valid until the next append.
  std::span<std::byte> append(std::size_t n) {
    const auto at = out_.size();
    out_.resize(at + n, std::byte{0});
    return {out_.data() + at, n};
  }
  void header(WireFormat format, std::uint16_t param, std::size_t count) {
    if (count > 0xffffffffu) throw KernelError("compressor: vectors of 2^32 elements or more");
    put(static_cast<std::uint8_t>(format));
    put(std::uint8_t{1});
    put(param);
    put(static_cast<std::uint32_t>(count));
  }

 private:
  std::vector<std::byte>& out_;
};

struct Header {
  WireFormat format{};
  std::uint16_t param = 0;
  std::size_t count = 0;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <typename T>
  void get_array(std::span<T> out) {
    need(out.size_bytes());
    if (!out.empty()) std::memcpy(out.data(), in_.data() + at_, out.size_bytes());
    at_ += out.size_bytes();
  }
  std::span<const std::byte> take(std::size_t n) {
    need(n);
    auto s = in_.subspan(at_, n);
    at_ += n;
    return s;
  }
  std::size_t left() const { return in_.size() - at_; }
  // Throws unless n more bytes are there: call before sizing a buffer from a count on the wire.
  void expect(std::size_t n) const { need(n); }
  // The header of a built-in encoding of `expected` format for out_size elements.
  Header header(WireFormat expected, std::size_t out_size) {
    Header h = raw_header();
    if (h.format != expected) {
      throw ProtocolError("compressed update has format " +
                          std::to_string(static_cast<int>(h.format)) + ", expected " +
                          std::to_string(static_cast<int>(expected)));
    }
    if (h.count != out_size) {
      throw ProtocolError("compressed update has " + std::to_string(h.count) +
                          " elements, expected " + std::to_string(out_size));
    }
    return h;
  }
  Header raw_header() {
    Header h;
    const auto format = get<std::uint8_t>();
    const auto version = get<std::uint8_t>();
    h.param = get<std::uint16_t>();
    h.count = get<std::uint32_t>();
    if (format < 1 || format > 9) {
      throw ProtocolError("unknown compressed format " + std::to_string(format));
    }
    if (version != 1) throw ProtocolError("unknown encoding version " + std::to_string(version));
    h.format = static_cast<WireFormat>(format);
    return h;
  }
  void finish() const {
    if (at_ != in_.size()) {
      throw ProtocolError("compressed update has " + std::to_string(in_.size() - at_) +
                          " trailing bytes");
    }
  }

 private:
  void need(std::size_t n) const {
    if (n > in_.size() - at_) throw ProtocolError("compressed update is truncated");
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
};

// LSB-first bit packing of fields up to 32 bits.
class BitWriter {
 public:
  explicit BitWriter(std::byte* out) : out_(out) {}
  void put(std::uint32_t value, unsigned bits) {
    acc_ |= static_cast<std::uint64_t>(value) << filled_;
    filled_ += bits;
    while (filled_ >= 8) {
      *out_++ = static_cast<std::byte>(acc_ & 0xff);
      acc_ >>= 8;
      filled_ -= 8;
    }
  }
  void flush() {
    if (filled_ > 0) *out_++ = static_cast<std::byte>(acc_ & 0xff);
    acc_ = 0;
    filled_ = 0;
  }

 private:
  std::byte* out_;
  std::uint64_t acc_ = 0;
  unsigned filled_ = 0;
};

class BitReader {
 public:
  explicit BitReader(std::span<const std::byte> in) : in_(in) {}
  std::uint32_t get(unsigned bits) {
    while (filled_ < bits) {
      if (at_ == in_.size()) throw ProtocolError("compressed update is truncated");
      acc_ |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(in_[at_++])) << filled_;
      filled_ += 8;
    }
    const auto v = static_cast<std::uint32_t>(acc_ & ((std::uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    filled_ -= bits;
    return v;
  }

 private:
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  std::uint64_t acc_ = 0;
  unsigned filled_ = 0;
};

inline void require_finite(std::span<const float> x, const char* who) {
  for (float v : x) {
    if (!std::isfinite(v)) throw KernelError(std::string(who) + ": input has a non-finite value");
  }
}

// Decoders of the built-in formats, shared by the compressors and decode_builtin().
void decode_dense(std::span<const std::byte> bytes, std::span<float> out);
void decode_fp16(std::span<const std::byte> bytes, std::span<float> out);
void decode_bf16(std::span<const std::byte> bytes, std::span<float> out);
void decode_int8(std::span<const std::byte> bytes, std::span<float> out);
void decode_qsgd(std::span<const std::byte> bytes, std::span<float> out);
void decode_topk(std::span<const std::byte> bytes, std::span<float> out);
void decode_randomk(std::span<const std::byte> bytes, std::span<float> out);
void decode_sign(std::span<const std::byte> bytes, std::span<float> out);
void decode_lowrank(std::span<const std::byte> bytes, std::span<float> out);

// Wraps c in ErrorFeedback if options.error_feedback (default ef_default) says so.
std::unique_ptr<Compressor> with_error_feedback(const ConfigSection& options,
                                                std::unique_ptr<Compressor> c, bool ef_default);

}  // namespace cohort::aggregation::detail
