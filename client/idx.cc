#include "cohort/client/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

// Refuse headers that claim more than this; a corrupt header must not trigger a huge allocation.
constexpr std::uint64_t kMaxIdxBytes = std::uint64_t{1} << 34;
constexpr unsigned kReadChunk = 1u << 20;

std::size_t element_size(IdxType type) {
  switch (type) {
    case IdxType::kUint8:
    case IdxType::kInt8: return 1;
    case IdxType::kInt16: return 2;
    case IdxType::kInt32:
    case IdxType::kFloat32: return 4;
    case IdxType::kFloat64: return 8;
  }
  return 0;
}

bool is_known_type(std::uint8_t code) {
  return code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D ||
         code == 0x0E;
}

std::string type_name(IdxType type) {
  switch (type) {
    case IdxType::kUint8: return "unsigned byte";
    case IdxType::kInt8: return "signed byte";
    case IdxType::kInt16: return "int16";
    case IdxType::kInt32: return "int32";
    case IdxType::kFloat32: return "float32";
    case IdxType::kFloat64: return "float64";
  }
  return "unknown";
}

std::string hex32(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08X", v);
  return text;
}

// "0x00000803 (unsigned byte, 3 dimensions)" or a range form when several are acceptable.
std::string describe_expected(const IdxExpectation& expect) {
  const std::uint32_t type = expect.type ? static_cast<std::uint32_t>(*expect.type) : 0;
  std::string dims =
      expect.min_dims == expect.max_dims
          ? std::to_string(expect.min_dims) + " dimension" + (expect.min_dims == 1 ? "" : "s")
          : std::to_string(expect.min_dims) + " to " + std::to_string(expect.max_dims) +
                " dimensions";
  if (expect.type && expect.min_dims == expect.max_dims) {
    return hex32((type << 8) | static_cast<std::uint32_t>(expect.min_dims)) + " (IDX " +
           type_name(*expect.type) + ", " + dims + ")";
  }
  if (expect.type) {
    return hex32((type << 8) | static_cast<std::uint32_t>(expect.min_dims)) + ".." +
           hex32((type << 8) | static_cast<std::uint32_t>(expect.max_dims)) + " (IDX " +
           type_name(*expect.type) + ", " + dims + ")";
  }
  return "an IDX magic number 0x0000TTNN with " + dims;
}

struct GzCloser {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw DataError(path.string() + ": " + what);
}

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) fail(path, "no such file (expected an IDX file)");
    if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, expected an IDX file");
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail(path, std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(file_.get(), 1u << 17);
  }

  // Reads up to `n` bytes into `out`; returns how many arrived before the end of the data.
  std::size_t read(std::uint8_t* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const auto want = static_cast<unsigned>(std::min<std::size_t>(n - got, kReadChunk));
      const int r = gzread(file_.get(), out + got, want);
      if (r < 0) check_error();
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    check_error();
    return got;
  }

  // A gzip stream cut short reads as a short count (reported as truncation by the caller); any
  // other zlib error is corruption.
  void check_error() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    if (code == Z_OK || code == Z_BUF_ERROR) return;
    if (code == Z_ERRNO) fail(path_, std::string("read error: ") + std::strerror(errno));
    fail(path_, std::string("corrupt gzip data: ") + (message ? message : "unknown zlib error"));
  }

 private:
  const std::filesystem::path& path_;
  GzFile file_;
};

}  // namespace

std::size_t IdxArray::count() const {
  std::size_t n = 1;
  for (const auto d : dims) n *= d;
  return n;
}

IdxArray read_idx(const std::filesystem::path& path, const IdxExpectation& expect) {
  Reader reader(path);
  std::array<std::uint8_t, 4> magic{};
  const std::size_t got_magic = reader.read(magic.data(), magic.size());
  if (got_magic < magic.size()) {
    fail(path, "truncated: expected a 4-byte IDX magic number " + describe_expected(expect) +
                   ", got " + std::to_string(got_magic) + " bytes");
  }
  const std::uint32_t magic_value = (std::uint32_t{magic[0]} << 24) |
                                    (std::uint32_t{magic[1]} << 16) |
                                    (std::uint32_t{magic[2]} << 8) | magic[3];
  const std::size_t ndims = magic[3];
  const bool bad = magic[0] != 0 || magic[1] != 0 || !is_known_type(magic[2]) ||
                   (expect.type && magic[2] != static_cast<std::uint8_t>(*expect.type)) ||
                   ndims < expect.min_dims || ndims > expect.max_dims || ndims == 0;
  if (bad) {
    fail(path, "wrong magic number: expected " + describe_expected(expect) + ", got " +
                   hex32(magic_value));
  }

  IdxArray out;
  out.type = static_cast<IdxType>(magic[2]);
  std::vector<std::uint8_t> header(4 * ndims);
  const std::size_t got_header = reader.read(header.data(), header.size());
  if (got_header < header.size()) {
    fail(path, "truncated: expected " + std::to_string(header.size()) +
                   " bytes of dimensions, got " + std::to_string(got_header));
  }
  std::uint64_t total = element_size(out.type);
  out.dims.resize(ndims);
  for (std::size_t i = 0; i < ndims; ++i) {
    const std::uint8_t* p = header.data() + 4 * i;
    out.dims[i] = (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) |
                  (std::uint32_t{p[2]} << 8) | p[3];
    total *= out.dims[i];
    if (total > kMaxIdxBytes) {
      fail(path, "implausible dimensions: more than " + std::to_string(kMaxIdxBytes) + " bytes");
    }
  }

  // Grow while reading instead of trusting the header with one big allocation.
  out.bytes.reserve(std::min<std::uint64_t>(total, std::uint64_t{1} << 28));
  std::size_t got = 0;
  while (got < total) {
    const std::size_t step = std::min<std::uint64_t>(total - got, std::uint64_t{1} << 26);
    out.bytes.resize(got + step);
    const std::size_t r = reader.read(out.bytes.data() + got, step);
    got += r;
    if (r < step) break;
  }
  if (got < total) {
    fail(path, "truncated: expected " + std::to_string(total) + " bytes of " +
                   std::string(expect.noun) + ", got " + std::to_string(got));
  }
  std::uint8_t extra = 0;
  if (reader.read(&extra, 1) != 0) {
    fail(path, "expected " + std::to_string(total) + " bytes of " + std::string(expect.noun) +
                   " after the header, but the file is longer");
  }
  return out;
}

void write_idx_u8(const std::filesystem::path& path, std::span<const std::uint32_t> dims,
                  std::span<const std::uint8_t> values, bool gzip) {
  std::size_t count = 1;
  for (const auto d : dims) count *= d;
  COHORT_CHECK(count == values.size())
      << "write_idx_u8: " << values.size() << " values for dims of product " << count;
  COHORT_CHECK(!dims.empty() && dims.size() < 256) << "write_idx_u8: bad rank " << dims.size();
  std::vector<std::uint8_t> header{0, 0, static_cast<std::uint8_t>(IdxType::kUint8),
                                   static_cast<std::uint8_t>(dims.size())};
  for (const auto d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      header.push_back(static_cast<std::uint8_t>(d >> shift));
  }
  if (gzip) {
    GzFile file(gzopen(path.c_str(), "wb6"));
    if (!file) fail(path, std::string("cannot create: ") + std::strerror(errno));
    auto write = [&](const std::uint8_t* data, std::size_t n) {
      while (n > 0) {
        const auto step = static_cast<unsigned>(std::min<std::size_t>(n, kReadChunk));
        if (gzwrite(file.get(), data, step) != static_cast<int>(step)) fail(path, "write failed");
        data += step;
        n -= step;
      }
    };
    write(header.data(), header.size());
    write(values.data(), values.size());
    if (gzclose(file.release()) != Z_OK) fail(path, "write failed");
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot create: ") + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(header.data()),
            static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size()));
  out.close();
  if (!out) fail(path, "write failed");
}

Dataset load_idx_dataset(const std::filesystem::path& images, const std::filesystem::path& labels,
                         std::size_t num_classes) {
  const IdxArray image_array =
      read_idx(images, {.type = IdxType::kUint8, .min_dims = 2, .max_dims = 4, .noun = "pixels"});
  const IdxArray label_array =
      read_idx(labels, {.type = IdxType::kUint8, .min_dims = 1, .max_dims = 1, .noun = "labels"});
  const std::size_t n = image_array.dims[0];
  if (label_array.dims[0] != n) {
    throw DataError(labels.string() + ": " + std::to_string(label_array.dims[0]) + " labels, but " +
                    images.string() + " holds " + std::to_string(n) + " images");
  }
  Shape shape;
  const auto& d = image_array.dims;
  if (d.size() == 2) shape = {d[1], 1, 1};
  if (d.size() == 3) shape = {1, d[1], d[2]};
  if (d.size() == 4) shape = {d[1], d[2], d[3]};

  FloatBuffer features(image_array.bytes.size());
  constexpr float kScale = 1.0f / 255.0f;
  float* dst = features.data();
  for (const std::uint8_t v : image_array.bytes) *dst++ = static_cast<float>(v) * kScale;
  std::vector<std::int32_t> label_values(label_array.bytes.begin(), label_array.bytes.end());
  try {
    return Dataset(std::move(features), std::move(label_values), shape, num_classes);
  } catch (const DataError& e) {
    throw DataError(labels.string() + ": " + e.what());
  }
}

TrainTest load_fashion_mnist(const std::filesystem::path& dir, bool standardize_features) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw DataError(dir.string() +
                    ": no such directory (expected Fashion-MNIST's "
                    "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; on Debian install the "
                    "package dataset-fashion-mnist)");
  }
  auto find = [&](const std::string& stem) {
    const auto gz = dir / (stem + ".gz");
    if (std::filesystem::exists(gz, ec)) return gz;
    const auto raw = dir / stem;
    if (std::filesystem::exists(raw, ec)) return raw;
    return gz;  // read_idx reports it missing, by this name
  };
  TrainTest out{
      load_idx_dataset(find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte"), 10),
      load_idx_dataset(find("t10k-images-idx3-ubyte"), find("t10k-labels-idx1-ubyte"), 10)};
  if (standardize_features) {
    const FeatureStats stats = feature_stats(out.train);
    standardize(out.train, stats);
    standardize(out.test, stats);
  }
  return out;
}

}  // namespace cohort::client
