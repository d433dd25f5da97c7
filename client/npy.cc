#include "cohort/client/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw DataError(origin + ": " + what);
}

// A parsed .npy file: its element type, shape and the mapped bytes of its data.
class NpyArray {
 public:
  explicit NpyArray(const std::filesystem::path& path) : origin_(path.string()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) fail(origin_, "no such file (expected .npy)");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(origin_, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      fail(origin_, "cannot stat");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        fail(origin_, std::string("cannot map: ") + std::strerror(errno));
      }
      base_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
    parse();
  }
  NpyArray(const NpyArray&) = delete;
  NpyArray& operator=(const NpyArray&) = delete;
  ~NpyArray() {
    if (base_ != nullptr) ::munmap(const_cast<unsigned char*>(base_), size_);
  }

  [[nodiscard]] const std::string& origin() const { return origin_; }
  [[nodiscard]] const std::vector<std::size_t>& shape() const { return shape_; }
  [[nodiscard]] std::size_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  [[nodiscard]] std::size_t row_size() const {
    std::size_t n = 1;
    for (std::size_t i = 1; i < shape_.size(); ++i) n *= shape_[i];
    return n;
  }
  // Element i (in C order) as a double.
  [[nodiscard]] double at(std::size_t i) const {
    const unsigned char* p = data_ + i * width_;
    switch (kind_) {
      case 'f':
        if (width_ == 4) return load<float>(p);
        return load<double>(p);
      case 'i':
        if (width_ == 1) return load<std::int8_t>(p);
        if (width_ == 2) return load<std::int16_t>(p);
        if (width_ == 4) return load<std::int32_t>(p);
        return static_cast<double>(load<std::int64_t>(p));
      case 'b': return *p != 0 ? 1.0 : 0.0;
      default:  // 'u'
        if (width_ == 1) return *p;
        if (width_ == 2) return load<std::uint16_t>(p);
        if (width_ == 4) return load<std::uint32_t>(p);
        return static_cast<double>(load<std::uint64_t>(p));
    }
  }

 private:
  template <typename T>
  static double load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  }

  // The header: magic, version, length, then a Python dict literal such as
  // {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 785), }
  void parse() {
    static constexpr unsigned char kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (size_ < 10 || std::memcmp(base_, kMagic, sizeof kMagic) != 0) {
      fail(origin_, "not a NumPy .npy file (no \\x93NUMPY magic)");
    }
    const unsigned major = base_[6];
    std::size_t header_len = 0, offset = 0;
    if (major == 1) {
      header_len = base_[8] | (static_cast<std::size_t>(base_[9]) << 8);
      offset = 10;
    } else if (major == 2 || major == 3) {
      if (size_ < 12) fail(origin_, "truncated header");
      header_len = base_[8] | (static_cast<std::size_t>(base_[9]) << 8) |
                   (static_cast<std::size_t>(base_[10]) << 16) |
                   (static_cast<std::size_t>(base_[11]) << 24);
      offset = 12;
    } else {
      fail(origin_, "unsupported .npy format version " + std::to_string(major));
    }
    if (offset + header_len > size_) fail(origin_, "truncated header");
    const std::string_view h(reinterpret_cast<const char*>(base_ + offset), header_len);
    const std::string descr = value_of(h, "descr");
    if (descr.size() < 3 || descr.front() != '\'' || descr.back() != '\'') {
      fail(origin_, "cannot read the dtype in the header: " + std::string(h));
    }
    const std::string type = descr.substr(1, descr.size() - 2);  // e.g. <f4
    const char order = type[0];
    kind_ = type[1];
    width_ = static_cast<std::size_t>(std::atoi(type.c_str() + 2));
    const bool known = (kind_ == 'f' && (width_ == 4 || width_ == 8)) ||
                       ((kind_ == 'i' || kind_ == 'u') &&
                        (width_ == 1 || width_ == 2 || width_ == 4 || width_ == 8)) ||
                       (kind_ == 'b' && width_ == 1);
    if (!known || order == '>' || (order != '<' && order != '|' && order != '=')) {
      fail(origin_, "dtype '" + type +
                        "' is not supported (little-endian float32/64, int/uint 8-64 or bool)");
    }
    if (value_of(h, "fortran_order").starts_with("True")) {
      fail(origin_, "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
    }
    const std::string dims = value_of(h, "shape");
    if (dims.empty() || dims.front() != '(') fail(origin_, "cannot read the shape in the header");
    std::size_t count = 1;
    for (std::size_t i = 1; i < dims.size();) {
      if (std::isdigit(static_cast<unsigned char>(dims[i])) != 0) {
        std::size_t v = 0;
        while (i < dims.size() && std::isdigit(static_cast<unsigned char>(dims[i])) != 0) {
          v = v * 10 + static_cast<std::size_t>(dims[i++] - '0');
        }
        shape_.push_back(v);
        count *= v;
      } else {
        ++i;
      }
    }
    data_ = base_ + offset + header_len;
    if (count * width_ > size_ - offset - header_len) {
      fail(origin_, "truncated: the header's shape needs " + std::to_string(count * width_) +
                        " bytes of data, the file holds " +
                        std::to_string(size_ - offset - header_len));
    }
  }

  // The text after 'key': up to the next top-level comma (a tuple counts as one value).
  static std::string value_of(std::string_view h, std::string_view key) {
    std::string quoted(1, '\'');
    quoted.append(key).push_back('\'');
    std::size_t at = h.find(quoted);
    if (at == std::string_view::npos) return {};
    at = h.find(':', at + quoted.size());
    if (at == std::string_view::npos) return {};
    ++at;
    while (at < h.size() && h[at] == ' ') ++at;
    std::size_t end = at;
    int depth = 0;
    while (end < h.size() && !(depth == 0 && (h[end] == ',' || h[end] == '}'))) {
      if (h[end] == '(') ++depth;
      if (h[end] == ')') --depth;
      ++end;
    }
    return std::string(h.substr(at, end - at));
  }

  std::string origin_;
  const unsigned char* base_ = nullptr;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  char kind_ = 'f';
  std::size_t width_ = 4;
  std::vector<std::size_t> shape_;
};

std::int32_t label_value(const NpyArray& a, std::size_t i, std::size_t row, std::size_t column) {
  const double v = a.at(i);
  if (!(v >= 0) || v != std::floor(v) || v > static_cast<double>(std::int64_t{1} << 30)) {
    fail(a.origin() + ":" + std::to_string(row + 1) + ":" + std::to_string(column + 1),
         "expected a non-negative integer label, got " + std::to_string(v));
  }
  return static_cast<std::int32_t>(v);
}

}  // namespace

Dataset load_npy_dataset(const std::filesystem::path& features_path,
                         const std::filesystem::path& labels_path, const NpyOptions& options) {
  const NpyArray x(features_path);
  const std::size_t n = x.rows();
  if (x.shape().empty() || n == 0)
    fail(x.origin(), "no rows (an array of shape (N, ...) with N > 0)");
  std::vector<std::int32_t> labels;
  labels.reserve(n);
  std::size_t dim = x.row_size();
  long label_column = -1;  // in x, or -1 with a labels file
  std::optional<NpyArray> y;
  if (!labels_path.empty()) {
    y.emplace(labels_path);
    if (y->rows() != n || y->row_size() != 1) {
      fail(y->origin(), "expected " + std::to_string(n) + " labels (shape (" + std::to_string(n) +
                            ",)) for the " + std::to_string(n) + " rows of " + x.origin());
    }
    for (std::size_t i = 0; i < n; ++i) labels.push_back(label_value(*y, i, i, 0));
  } else {
    if (x.shape().size() != 2 || x.shape()[1] < 2) {
      fail(x.origin(), "one array holds features and labels as (N, D + 1) columns; this one has " +
                           std::to_string(x.shape().size()) +
                           " dimensions (for (N, ...) features give the labels in their own file)");
    }
    const long cols = static_cast<long>(x.shape()[1]);
    label_column = options.label_column < 0 ? cols + options.label_column : options.label_column;
    if (label_column < 0 || label_column >= cols) {
      fail(x.origin(), "label column " + std::to_string(options.label_column) +
                           " does not exist in " + std::to_string(cols) + " columns");
    }
    dim = static_cast<std::size_t>(cols - 1);
  }
  Shape shape = options.shape;
  if (shape.size() == 0) {
    const auto& d = x.shape();
    if (label_column >= 0 || d.size() == 2)
      shape = {dim, 1, 1};
    else if (d.size() == 3)
      shape = {1, d[1], d[2]};
    else if (d.size() == 4)
      shape = {d[1], d[2], d[3]};
    else
      shape = {dim, 1, 1};
  }
  if (shape.size() != dim) {
    fail(x.origin(), std::to_string(dim) + " features per row, but the configured shape holds " +
                         std::to_string(shape.size()));
  }
  FloatBuffer features(n * dim);
  float* out = features.data();
  const std::size_t width = x.row_size();
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t c = 0; c < width; ++c) {
      if (static_cast<long>(c) == label_column) {
        labels.push_back(label_value(x, r * width + c, r, c));
        continue;
      }
      const double v = x.at(r * width + c);
      if (!std::isfinite(v) || std::abs(v) > 3.4e38) {
        fail(x.origin() + ":" + std::to_string(r + 1) + ":" + std::to_string(c + 1),
             "not a finite number: " + std::to_string(v));
      }
      *out++ = static_cast<float>(v);
    }
  }
  try {
    return Dataset(std::move(features), std::move(labels), shape, options.num_classes);
  } catch (const DataError& e) {
    throw DataError((y ? y->origin() : x.origin()) + ": " + e.what());
  }
}

}  // namespace cohort::client
