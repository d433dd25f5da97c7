// TensorBoard event files: CRC32C, TFRecord framing, and a written file decoded back by hand.
// (tests/integration/tensorboard_test.py reads the files with TensorBoard's own reader.)
#include "cohort/core/tensorboard.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "cohort/core/error.h"

namespace {

using cohort::MetricField;

// A folder under the temp dir, removed with everything in it.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("cohort-tb-test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

std::uint64_t le(std::string_view b, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i)
    v |= std::uint64_t{static_cast<std::uint8_t>(b[i])} << (8 * i);
  return v;
}

// The records of an event file, each checked against its two CRCs.
std::vector<std::string> read_records(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  for (int i = 0; i < 10000 && at < all.size(); ++i) {
    REQUIRE(all.size() - at >= 12);
    const std::string_view view(all);
    const std::uint64_t n = le(view.substr(at), 8);
    REQUIRE(le(view.substr(at + 8), 4) == cohort::masked_crc32c(view.substr(at, 8)));
    REQUIRE(all.size() - at >= 16 + n);
    const std::string_view data = view.substr(at + 12, n);
    REQUIRE(le(view.substr(at + 12 + n), 4) == cohort::masked_crc32c(data));
    records.emplace_back(data);
    at += 16 + n;
  }
  CHECK(at == all.size());
  return records;
}

// A protobuf message decoded just far enough for the Event: field number -> its raw values
// (varint and fixed as integers, length-delimited as bytes).
struct Fields {
  std::multimap<std::uint32_t, std::uint64_t> numbers;
  std::multimap<std::uint32_t, std::string> bytes;
};

std::uint64_t varint(std::string_view b, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    REQUIRE(at < b.size());
    const auto c = static_cast<std::uint8_t>(b[at++]);
    v |= std::uint64_t{c & 0x7Fu} << shift;
    if (!(c & 0x80)) return v;
  }
  FAIL("varint too long");
  return 0;
}

Fields decode(std::string_view b) {
  Fields f;
  std::size_t at = 0;
  for (int i = 0; i < 1000 && at < b.size(); ++i) {
    const std::uint64_t key = varint(b, at);
    const auto field = static_cast<std::uint32_t>(key >> 3);
    switch (key & 7) {
      case 0: f.numbers.emplace(field, varint(b, at)); break;
      case 1: f.numbers.emplace(field, le(b.substr(at), 8)), at += 8; break;
      case 5: f.numbers.emplace(field, le(b.substr(at), 4)), at += 4; break;
      case 2: {
        const std::uint64_t n = varint(b, at);
        REQUIRE(at + n <= b.size());
        f.bytes.emplace(field, std::string(b.substr(at, n)));
        at += n;
        break;
      }
      default: FAIL("unexpected wire type " << (key & 7));
    }
  }
  CHECK(at == b.size());
  return f;
}

struct Scalar {
  std::int64_t step;
  std::string tag;
  float value;
};

// The scalar events of `records` (the first, the file version, checked and left out).
std::vector<Scalar> scalars(const std::vector<std::string>& records) {
  REQUIRE(!records.empty());
  const Fields version = decode(records[0]);
  CHECK(version.bytes.find(3)->second == "brain.Event:2");
  CHECK(std::bit_cast<double>(version.numbers.find(1)->second) > 1.6e9);  // a Unix time
  std::vector<Scalar> out;
  for (std::size_t i = 1; i < records.size(); ++i) {
    const Fields e = decode(records[i]);
    CHECK(std::bit_cast<double>(e.numbers.find(1)->second) > 1.6e9);
    const Fields summary = decode(e.bytes.find(5)->second);
    REQUIRE(summary.bytes.count(1) == 1);
    const Fields value = decode(summary.bytes.find(1)->second);
    out.push_back(
        {static_cast<std::int64_t>(e.numbers.find(2)->second), value.bytes.find(1)->second,
         std::bit_cast<float>(static_cast<std::uint32_t>(value.numbers.find(2)->second))});
  }
  return out;
}

}  // namespace

TEST_CASE("crc32c and its mask are TFRecord's") {
  CHECK(cohort::crc32c("123456789") == 0xE3069283u);  // the standard check value
  CHECK(cohort::crc32c("") == 0u);
  const std::uint32_t crc = cohort::crc32c("abc");
  CHECK(cohort::masked_crc32c("abc") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST_CASE("a TFRecord is length, its masked CRC, the data and its masked CRC") {
  const std::string r = cohort::tfrecord("hello");
  REQUIRE(r.size() == 8 + 4 + 5 + 4);
  CHECK(le(r, 8) == 5);
  CHECK(le(std::string_view(r).substr(8), 4) == cohort::masked_crc32c(r.substr(0, 8)));
  CHECK(r.substr(12, 5) == "hello");
  CHECK(le(std::string_view(r).substr(17), 4) == cohort::masked_crc32c("hello"));
}

TEST_CASE("a scalar event is Event{wall_time, step, summary{value{tag, simple_value}}}") {
  // Bytes as protobuf encodes them: keys 0x09 (double), 0x10 (varint), 0x2a (message), 0x0a
  // (string), 0x15 (float).
  const std::string e = cohort::encode_scalar_event(1.0, 3, "a", 0.5f);
  const std::string expected(
      "\x09\x00\x00\x00\x00\x00\x00\xf0\x3f"
      "\x10\x03"
      "\x2a\x0a\x0a\x08\x0a\x01"
      "a"
      "\x15\x00\x00\x00\x3f",
      9 + 2 + 12);
  CHECK(e == expected);
}

TEST_CASE("a writer's file decodes back to its scalars, the file version first") {
  ScratchDir dir;
  cohort::TensorBoardWriter w(dir.path / "run");
  CHECK(w.path().parent_path() == dir.path / "run");
  CHECK(w.path().filename().string().starts_with("events.out.tfevents."));
  w.scalar("test/accuracy", 1, 0.25f, 1.7e9);
  w.scalar("train/loss", 1000000000000, -2.5f, 1.7e9);
  REQUIRE(w.flush());
  const auto s = scalars(read_records(w.path()));
  REQUIRE(s.size() == 2);
  CHECK(s[0].tag == "test/accuracy");
  CHECK(s[0].step == 1);
  CHECK(s[0].value == 0.25f);
  CHECK(s[1].tag == "train/loss");
  CHECK(s[1].step == 1000000000000);
  CHECK(s[1].value == -2.5f);
  // A second writer in the same second keeps its own file.
  cohort::TensorBoardWriter w2(dir.path / "run");
  CHECK(w2.path() != w.path());
}

TEST_CASE("a folder that cannot be made is a ConfigError naming it") {
  ScratchDir dir;
  std::filesystem::create_directories(dir.path);
  std::ofstream(dir.path / "file") << "x";
  const auto bad = dir.path / "file" / "tb";
  try {
    cohort::TensorBoardWriter w(bad);
    FAIL("no error");
  } catch (const cohort::ConfigError& e) {
    CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
  }
}

TEST_CASE("a sink's round records become scalars, step = round, only the fields present") {
  ScratchDir dir;
  cohort::TensorBoardScalars tb(
      dir.path,
      {{"round", "round", {{"train_loss", "train/loss"}, {"test_accuracy", "test/accuracy"}}},
       {"other", "step", {{"x", "other/x"}}}});
  cohort::MetricsSink sink("");  // no file: the observer still sees every record
  tb.attach(sink);
  sink.write("round", {{"round", std::uint64_t{1}}, {"train_loss", 2.0}, {"bytes", 10.0}});
  sink.write("client", {{"round", std::uint64_t{1}}, {"train_loss", 9.0}});  // not mapped
  sink.write("round", {{"round", std::uint64_t{2}}, {"train_loss", 1.5}, {"test_accuracy", 0.75}});
  sink.write("other", {{"x", true}});                                         // no step: skipped
  sink.write("other", {{"step", std::int64_t{7}}, {"x", std::string("s")}});  // a string: none
  sink.write("other", {{"step", std::int64_t{8}}, {"x", std::int64_t{4}}});
  const auto s = scalars(read_records(tb.path()));
  REQUIRE(s.size() == 4);
  CHECK((s[0].step == 1 && s[0].tag == "train/loss" && s[0].value == 2.0f));
  CHECK((s[1].step == 2 && s[1].tag == "train/loss" && s[1].value == 1.5f));
  CHECK((s[2].step == 2 && s[2].tag == "test/accuracy" && s[2].value == 0.75f));
  CHECK((s[3].step == 8 && s[3].tag == "other/x" && s[3].value == 4.0f));
}
