#include "cohort/client/idx.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "test_util.h"

namespace cohort::client {
namespace {

using testing::TempDir;

// Four 2x3 "images" with pixel values 0..23 and labels 0, 1, 2, 1.
struct Tiny {
  std::vector<std::uint32_t> image_dims{4, 2, 3};
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint32_t> label_dims{4};
  std::vector<std::uint8_t> labels{0, 1, 2, 1};
  Tiny() {
    for (int i = 0; i < 24; ++i) pixels.push_back(static_cast<std::uint8_t>(i * 10));
  }
};

std::string data_error(const auto& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError>";
}

void truncate_to(const std::filesystem::path& path, std::size_t bytes) {
  std::filesystem::resize_file(path, bytes);
}

TEST_CASE("IDX files round-trip raw and gzipped into a Dataset scaled to [0, 1]") {
  TempDir dir;
  const Tiny t;
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const auto images = dir.file(gzip ? "img.gz" : "img");
    const auto labels = dir.file(gzip ? "lab.gz" : "lab");
    write_idx_u8(images, t.image_dims, t.pixels, gzip);
    write_idx_u8(labels, t.label_dims, t.labels, gzip);

    const IdxArray raw = read_idx(images);
    CHECK(raw.type == IdxType::kUint8);
    CHECK(raw.dims == t.image_dims);
    CHECK(raw.bytes == t.pixels);

    const Dataset data = load_idx_dataset(images, labels);
    CHECK(data.size() == 4);
    CHECK(data.shape() == Shape{1, 2, 3});
    CHECK(data.num_classes() == 3);
    CHECK(data.labels()[2] == 2);
    CHECK(data.row(1)[0] == doctest::Approx(60.0 / 255.0));
    CHECK(data.row(3)[5] == doctest::Approx(230.0 / 255.0));
  }
  // The compressed file really is compressed: detection is by content, not by name.
  std::vector<std::uint8_t> zeros(10000, 0);
  const std::vector<std::uint32_t> dims{100, 100};
  write_idx_u8(dir.file("zeros.idx"), dims, zeros, true);
  CHECK(std::filesystem::file_size(dir.file("zeros.idx")) < 1000);
  CHECK(read_idx(dir.file("zeros.idx")).bytes == zeros);
}

TEST_CASE("a truncated IDX file is a DataError naming the file and the missing bytes") {
  TempDir dir;
  const Tiny t;
  const auto raw = dir.file("train-images-idx3-ubyte");
  write_idx_u8(raw, t.image_dims, t.pixels, false);
  truncate_to(raw, 16 + 10);
  std::string message = data_error([&] { (void)load_idx_dataset(raw, dir.file("missing")); });
  CHECK(message == raw.string() + ": truncated: expected 24 bytes of pixels, got 10");

  truncate_to(raw, 9);
  message = data_error([&] { (void)read_idx(raw); });
  CHECK(message == raw.string() + ": truncated: expected 12 bytes of dimensions, got 5");

  // A gzip stream cut in the middle reads as a short file, not as corruption.
  std::vector<std::uint8_t> big(200000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>((i * 7919) >> 3);
  const std::vector<std::uint32_t> dims{200, 1000};
  const auto gz = dir.file("big.gz");
  write_idx_u8(gz, dims, big, true);
  truncate_to(gz, std::filesystem::file_size(gz) / 2);
  message = data_error([&] { (void)read_idx(gz, {.noun = "pixels"}); });
  CHECK(message.starts_with(gz.string() + ": truncated: expected 200000 bytes of pixels, got "));
  CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("a missing file, a wrong magic number or trailing bytes are DataErrors naming the file") {
  TempDir dir;
  const Tiny t;
  const auto missing = dir.file("t10k-labels-idx1-ubyte.gz");
  std::string message = data_error([&] { (void)read_idx(missing); });
  CHECK(message.starts_with(missing.string() + ": no such file"));

  // A label file where images are expected.
  const auto labels = dir.file("labels.gz");
  write_idx_u8(labels, t.label_dims, t.labels, true);
  message = data_error([&] { (void)load_idx_dataset(labels, labels); });
  CHECK(message == labels.string() +
                       ": wrong magic number: expected 0x00000802..0x00000804 (IDX unsigned byte, "
                       "2 to 4 dimensions), got 0x00000801");

  const auto text = dir.file("not-idx.txt");
  testing::write_text(text, "hello world, this is not an IDX file");
  message = data_error(
      [&] { (void)read_idx(text, {.type = IdxType::kUint8, .min_dims = 1, .max_dims = 1}); });
  CHECK(message ==
        text.string() +
            ": wrong magic number: expected 0x00000801 (IDX unsigned byte, 1 dimension), "
            "got 0x68656C6C");

  const auto longer = dir.file("longer");
  write_idx_u8(longer, t.label_dims, t.labels, false);
  {
    std::ofstream out(longer, std::ios::binary | std::ios::app);
    out.put('x');
  }
  message = data_error([&] { (void)read_idx(longer); });
  CHECK(message ==
        longer.string() + ": expected 4 bytes of values after the header, but the file is longer");
}

TEST_CASE("images and labels of different counts are a DataError naming both files") {
  TempDir dir;
  const Tiny t;
  write_idx_u8(dir.file("img"), t.image_dims, t.pixels, false);
  const std::vector<std::uint8_t> three{0, 1, 2};
  const std::vector<std::uint32_t> dims{3};
  write_idx_u8(dir.file("lab"), dims, three, false);
  const std::string message =
      data_error([&] { (void)load_idx_dataset(dir.file("img"), dir.file("lab")); });
  CHECK(message.find(dir.file("img").string()) != std::string::npos);
  CHECK(message.find(dir.file("lab").string()) != std::string::npos);
}

TEST_CASE("load_fashion_mnist names the directory when it is missing") {
  TempDir dir;
  const std::string message = data_error([&] { (void)load_fashion_mnist(dir.file("nowhere")); });
  CHECK(message.starts_with(dir.file("nowhere").string() + ": no such directory"));
  CHECK(message.find("dataset-fashion-mnist") != std::string::npos);
}

}  // namespace
}  // namespace cohort::client
