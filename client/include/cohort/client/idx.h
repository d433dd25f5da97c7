// IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed.
//
// Layout: a 4-byte magic number {0, 0, type, ndims}, ndims big-endian uint32 dimensions, then the
// values in row-major order, big-endian. Compression is detected from the first bytes (gzip's
// 1f 8b), not from the file name. Every failure to read is a one-line DataError that names the
// file and says what was expected, e.g.
//   "data/train-images-idx3-ubyte.gz: truncated: expected 47040000 bytes of pixels, got 1000".
//
// Functions here are stateless and thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cohort/client/dataset.h"

namespace cohort::client {

enum class IdxType : std::uint8_t {
  kUint8 = 0x08,
  kInt8 = 0x09,
  kInt16 = 0x0B,
  kInt32 = 0x0C,
  kFloat32 = 0x0D,
  kFloat64 = 0x0E,
};

// The raw contents of one IDX file.
struct IdxArray {
  IdxType type = IdxType::kUint8;
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> bytes;          // values as stored: big-endian, row-major
  [[nodiscard]] std::size_t count() const;  // product of dims
};

// What the caller expects to find; a mismatch is a DataError quoting the expected magic.
struct IdxExpectation {
  std::optional<IdxType> type;  // any type when empty
  std::size_t min_dims = 1;
  std::size_t max_dims = 255;
  std::string_view noun = "values";  // used in messages: "expected 60000 bytes of labels"
};

// Reads a whole IDX file. Throws DataError if it is missing, unreadable, truncated, longer than its
// header says, or has a bad magic number.
IdxArray read_idx(const std::filesystem::path& path, const IdxExpectation& expect = {});

// Writes unsigned-byte data as an IDX file, gzip-compressed when `gzip`. Throws DataError when the
// file cannot be written and InternalError if values.size() != product of dims.
void write_idx_u8(const std::filesystem::path& path, std::span<const std::uint32_t> dims,
                  std::span<const std::uint8_t> values, bool gzip);

// Loads an image file ([N, D], [N, H, W] or [N, C, H, W] unsigned bytes, scaled to [0, 1]) and its
// label file ([N] unsigned bytes). Throws DataError if either is bad or their counts differ.
// num_classes == 0 means max label + 1.
Dataset load_idx_dataset(const std::filesystem::path& images, const std::filesystem::path& labels,
                         std::size_t num_classes = 0);

// Where the Debian package dataset-fashion-mnist installs the data.
inline constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct TrainTest {
  Dataset train;
  Dataset test;
};

// Loads Fashion-MNIST (60,000 train and 10,000 test 28x28 images, 10 classes) from `dir`, which
// holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, gzipped (".gz") or not. Pixels are in
// [0, 1]; with `standardize`, both sets are standardized with the training set's mean and
// standard deviation. Throws DataError naming the directory when the files are not there.
TrainTest load_fashion_mnist(const std::filesystem::path& dir = kFashionMnistDir,
                             bool standardize = false);

}  // namespace cohort::client
