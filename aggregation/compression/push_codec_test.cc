#include "cohort/aggregation/push_codec.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

struct Collected {
  std::vector<float> out;
  std::vector<std::size_t> offsets;
};

// Feeds `payload` to a decoder in chunks of `chunk` bytes and returns what it decoded.
Collected decode_in_chunks(std::span<const std::byte> payload, std::size_t elements,
                           WireFormat format, std::size_t chunk) {
  Collected c;
  c.out.assign(elements, NAN);
  PushDecoder d;
  d.reset(elements, format);
  std::vector<float> scratch;
  for (std::size_t at = 0; at < payload.size(); at += chunk) {
    const auto piece = payload.subspan(at, std::min(chunk, payload.size() - at));
    REQUIRE(d.feed(piece, scratch, [&](std::size_t offset, std::span<const float> v) {
      c.offsets.push_back(offset);
      std::copy(v.begin(), v.end(), c.out.begin() + static_cast<std::ptrdiff_t>(offset));
      return true;
    }));
  }
  d.finish();
  return c;
}

std::vector<float> gaussian(std::size_t d, std::uint64_t seed) {
  TestRng rng(seed);
  std::vector<float> x(d);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

}  // namespace

TEST_CASE("push codec: every built-in round-trips over pieces, whatever the chunking") {
  const auto reg = cohort::builtin_registries();
  // Two full pieces and a partial one, so pieces and chunks never line up.
  const std::size_t d = 2 * kPushPieceElements + 1234;
  const auto x = gaussian(d, 3);
  const char* names[] = {"none", "fp16",    "bf16", "int8",    "qsgd",
                         "topk", "randomk", "sign", "powersgd"};
  for (const char* name : names) {
    INFO(name);
    auto c = reg.compressors.create(name, cohort::ConfigSection("compressor", {}));
    PushEncoder enc(*c, d);
    std::vector<std::byte> payload;
    enc.encode(x, 42, payload);
    CHECK(payload.size() <= max_push_bytes(d));
    // The reference: each piece decoded on its own by the compressor.
    std::vector<float> want(d);
    std::size_t at = 0;
    for (std::size_t first = 0; first < d; first += kPushPieceElements) {
      std::uint32_t len = 0;
      std::memcpy(&len, payload.data() + at, 4);
      const std::size_t n = std::min(kPushPieceElements, d - first);
      c->decode(std::span(payload).subspan(at + 4, len), std::span(want).subspan(first, n));
      at += 4 + len;
    }
    CHECK(at == payload.size());
    for (std::size_t chunk : {std::size_t{1} << 20, std::size_t{4093}, payload.size()}) {
      const auto got = decode_in_chunks(payload, d, enc.format(), chunk);
      CHECK(got.offsets == std::vector<std::size_t>{0, kPushPieceElements, 2 * kPushPieceElements});
      CHECK(got.out == want);
    }
  }
}

TEST_CASE("push codec: top-k 1% shrinks the payload over 40x, error feedback state persists") {
  const auto reg = cohort::builtin_registries();
  auto c = reg.compressors.create(
      "topk",
      cohort::ConfigSection("compressor", {{"k_fraction", 0.01}, {"error_feedback", true}}));
  const std::size_t d = 100000;
  PushEncoder enc(*c, d);
  const auto x = gaussian(d, 5);
  std::vector<std::byte> payload;
  enc.encode(x, 1, payload);
  // k = 1000: 12 + 4k values + min(4k, d/8) index bytes, + 4 framing.
  CHECK(payload.size() == 4 + 12 + 4000 + 4000);
  CHECK(4.0 * d / static_cast<double>(payload.size()) > 40.0);
  // Round 2 with a zero input sends the top of the residual: not all zeros.
  std::vector<float> zeros(d, 0.0f), sent(d);
  enc.encode(zeros, 2, payload);
  const auto got = decode_in_chunks(payload, d, enc.format(), payload.size());
  double norm = 0;
  for (float v : got.out) norm += static_cast<double>(v) * v;
  CHECK(norm > 0);
}

TEST_CASE("push codec: malformed payloads throw ProtocolError, never read out of bounds") {
  const auto reg = cohort::builtin_registries();
  auto c = reg.compressors.create("topk", cohort::ConfigSection("compressor", {}));
  const std::size_t d = 5000;
  PushEncoder enc(*c, d);
  std::vector<std::byte> good;
  enc.encode(gaussian(d, 7), 1, good);
  auto fails = [&](std::vector<std::byte> bad, std::size_t elements, WireFormat format) {
    PushDecoder dec;
    dec.reset(elements, format);
    std::vector<float> scratch;
    auto sink = [](std::size_t, std::span<const float>) { return true; };
    try {
      dec.feed(bad, scratch, sink);
      dec.finish();
    } catch (const cohort::ProtocolError&) {
      return true;
    }
    return false;
  };
  CHECK_FALSE(fails(good, d, WireFormat::kTopK));
  CHECK(fails(good, d + 1, WireFormat::kTopK));  // fewer elements than announced
  CHECK(fails(good, d - 1, WireFormat::kTopK));  // a piece past the end
  CHECK(fails(good, d, WireFormat::kFp16));      // not the announced format
  CHECK(fails({good.begin(), good.end() - 3}, d, WireFormat::kTopK));  // truncated
  auto longer = good;
  longer.push_back(std::byte{0});
  CHECK(fails(longer, d, WireFormat::kTopK));  // a stray byte after the last piece
  auto huge = good;
  const std::uint32_t len = 0xffffffffu;
  std::memcpy(huge.data(), &len, 4);
  CHECK(fails(huge, d, WireFormat::kTopK));  // a length beyond the bound
  // Flipped bytes anywhere: an error or a decode, never a crash (ASan/UBSan runs check reads).
  TestRng rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    auto bad = good;
    const auto at = static_cast<std::size_t>(rng.uniform() * static_cast<double>(bad.size()));
    bad[std::min(at, bad.size() - 1)] ^= static_cast<std::byte>(1 + trial % 255);
    (void)fails(bad, d, WireFormat::kTopK);
  }
  std::vector<std::byte> garbage(64, std::byte{0x5a});
  CHECK(fails(garbage, d, WireFormat::kTopK));
}

TEST_CASE("push codec: a sink that refuses stops decoding") {
  const auto reg = cohort::builtin_registries();
  auto c = reg.compressors.create("fp16", cohort::ConfigSection("compressor", {}));
  const std::size_t d = kPushPieceElements + 10;
  PushEncoder enc(*c, d);
  std::vector<std::byte> payload;
  enc.encode(gaussian(d, 11), 1, payload);
  PushDecoder dec;
  dec.reset(d, enc.format());
  std::vector<float> scratch;
  int calls = 0;
  CHECK_FALSE(dec.feed(payload, scratch, [&](std::size_t, std::span<const float>) {
    ++calls;
    return false;
  }));
  CHECK(calls == 1);
  CHECK(wire_format_of("topk") == WireFormat::kTopK);
  CHECK_FALSE(wire_format_of("my_codec").has_value());
}
