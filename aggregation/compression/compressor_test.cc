// Cases every built-in compressor passes, run over the registry.
#include "cohort/aggregation/compressor.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "cohort/aggregation/error_feedback.h"
#include "cohort/aggregation/registries.h"
#include "cohort/core/error.h"
#include "../test_util.h"

using namespace cohort::aggregation;
using cohort::aggregation::testing::TestRng;

namespace {

std::vector<std::string> registered(const CompressorRegistry& reg) {
  std::vector<std::string> out;
  std::stringstream ss(reg.names());
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name.front() == ' ') name.erase(0, 1);
    out.push_back(name);
  }
  return out;
}

std::vector<float> random_vector(std::size_t d, std::uint64_t seed) {
  TestRng rng(seed);
  std::vector<float> x(d);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

}  // namespace

TEST_CASE("compressor registry: every built-in is there, with error feedback on the biased ones") {
  const auto reg = cohort::builtin_registries();
  const auto names = registered(reg.compressors);
  CHECK(names == std::vector<std::string>{"bf16", "fp16", "int8", "none", "powersgd", "qsgd",
                                          "randomk", "sign", "topk"});
  for (const auto& name : names) {
    CAPTURE(name);
    auto c = reg.compressors.create(name, {});
    const bool wrapped = dynamic_cast<ErrorFeedback*>(c.get()) != nullptr;
    const bool biased = name == "topk" || name == "randomk" || name == "sign" || name == "powersgd";
    CHECK(wrapped == biased);
    CHECK(c->encoding() == name);
    auto off = reg.compressors.create(
        name, cohort::ConfigSection("compressor", {{"error_feedback", false}}));
    CHECK(dynamic_cast<ErrorFeedback*>(off.get()) == nullptr);
  }
  CHECK_THROWS_WITH_AS(reg.compressors.create("zip", {}), doctest::Contains("topk"),
                       cohort::ConfigError);
  CHECK_THROWS_WITH_AS(
      reg.compressors.create("qsgd",
                             cohort::ConfigSection("compressor", {{"levels", std::int64_t{4}}})),
      doctest::Contains("levels"), cohort::ConfigError);
  CHECK_THROWS_AS(
      reg.compressors.create("topk", cohort::ConfigSection("compressor", {{"k", std::int64_t{3}},
                                                                          {"k_fraction", 0.1}})),
      cohort::ConfigError);
}

TEST_CASE("every compressor: round trip, self-describing header, malformed bytes refused") {
  const auto reg = cohort::builtin_registries();
  const std::size_t d = 1000;
  const auto x = random_vector(d, 3);
  for (const auto& name : registered(reg.compressors)) {
    CAPTURE(name);
    auto c = reg.compressors.create(name, {});
    auto state = c->make_state(d);
    std::vector<std::byte> bytes;
    c->encode(x, state.get(), 17, bytes);
    CHECK(encoded_element_count(bytes) == d);
    if (name != "none") CHECK(bytes.size() < 4 * d);  // it shrinks
    std::vector<float> out(d), out2(d);
    c->decode(bytes, out);
    decode_builtin(bytes, out2);
    CHECK(out == out2);
    for (float v : out) REQUIRE(std::isfinite(v));

    // Wrong output size, truncation, a trailing byte: ProtocolError, never a crash.
    std::vector<float> small(d - 1);
    CHECK_THROWS_AS(c->decode(bytes, small), cohort::ProtocolError);
    for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{8}, bytes.size() - 1}) {
      CHECK_THROWS_AS(c->decode(std::span(bytes).first(cut), out), cohort::ProtocolError);
    }
    auto longer = bytes;
    longer.push_back(std::byte{0});
    CHECK_THROWS_AS(c->decode(longer, out), cohort::ProtocolError);
    auto bad_version = bytes;
    bad_version[1] = std::byte{2};
    CHECK_THROWS_AS(c->decode(bad_version, out), cohort::ProtocolError);
    // Random corruption: decodes to something or throws ProtocolError (never anything else).
    TestRng rng(99);
    for (int trial = 0; trial < 300; ++trial) {
      auto mutated = bytes;
      for (int k = 0; k < 3; ++k) {
        mutated[rng.next() % mutated.size()] = static_cast<std::byte>(rng.next() & 0xff);
      }
      try {
        decode_builtin(mutated, out);
      } catch (const cohort::ProtocolError&) {
      }
    }
    // Non-finite input: a loud KernelError on the encoding side.
    auto bad = x;
    bad[5] = std::numeric_limits<float>::quiet_NaN();
    auto state2 = c->make_state(d);
    CHECK_THROWS_AS(c->encode(bad, state2.get(), 1, bytes), cohort::KernelError);
  }
}

TEST_CASE("encodings of a format are refused by another format's decoder") {
  const auto reg = cohort::builtin_registries();
  auto topk = reg.compressors.create("topk", {});
  auto sign = reg.compressors.create("sign", {});
  const auto x = random_vector(64, 5);
  auto state = sign->make_state(64);
  std::vector<std::byte> bytes;
  sign->encode(x, state.get(), 0, bytes);
  CHECK(encoded_format(bytes) == WireFormat::kSign);
  std::vector<float> out(64);
  CHECK_THROWS_AS(topk->decode(bytes, out), cohort::ProtocolError);
  const std::vector<std::byte> junk{std::byte{77}, std::byte{1}, std::byte{0}, std::byte{0},
                                    std::byte{1},  std::byte{0}, std::byte{0}, std::byte{0}};
  CHECK_THROWS_AS(decode_builtin(junk, std::span(out).first(1)), cohort::ProtocolError);
}

TEST_CASE("compression seeds differ per round and client; stateful contract is checked") {
  CHECK(compression_seed(1, 2, 3) == compression_seed(1, 2, 3));
  CHECK(compression_seed(1, 2, 3) != compression_seed(1, 2, 4));
  CHECK(compression_seed(1, 2, 3) != compression_seed(1, 3, 3));
  const auto reg = cohort::builtin_registries();
  auto ef = reg.compressors.create("topk", {});
  std::vector<std::byte> bytes;
  const auto x = random_vector(10, 1);
  CHECK_THROWS_AS(ef->encode(x, nullptr, 0, bytes), cohort::InternalError);
  auto wrong = ef->make_state(11);
  CHECK_THROWS_AS(ef->encode(x, wrong.get(), 0, bytes), cohort::InternalError);
  auto plain = reg.compressors.create("fp16", {});
  CHECK(plain->make_state(10) == nullptr);
}
