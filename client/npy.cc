#include "cohort/client/npy.h"

#include <zlib.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/error.h"
#include "mapped_file.h"

namespace cohort::client {
namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw DataError(origin + ": " + what);
}

// A parsed .npy file: its element type, shape and the mapped bytes of its data.
class NpyArray {
 public:
  // The array in bytes [base, base + size), which must outlive it; origin names it in errors.
  NpyArray(std::string origin, const unsigned char* base, std::size_t size)
      : origin_(std::move(origin)), base_(base), size_(size) {
    parse();
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
          if (v > (std::size_t{1} << 48))
            fail(origin_, "the header's shape " + dims + " is too large to be real");
        }
        shape_.push_back(v);
        if (v != 0 && count > (std::size_t{1} << 48) / v) {
          fail(origin_, "the header's shape " + dims + " is too large to be real");
        }
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
  std::size_t size_ = 0;
  const unsigned char* data_ = nullptr;
  char kind_ = 'f';
  std::size_t width_ = 4;
  std::vector<std::size_t> shape_;
};

// Little-endian fields of a zip archive, bounds-checked.
class ZipReader {
 public:
  ZipReader(std::string origin, const unsigned char* base, std::size_t size)
      : origin_(std::move(origin)), base_(base), size_(size) {}

  // The bytes of member `name` (stored: in place; deflated: inflated into `inflated`).
  std::span<const unsigned char> member(const std::string& name,
                                        std::vector<unsigned char>& inflated) const {
    std::size_t eocd = size_ < 22 ? npos : size_ - 22;
    const std::size_t lowest = size_ > 22 + 65535 ? size_ - 22 - 65535 : 0;
    while (eocd != npos && u32(eocd) != 0x06054b50u) eocd = eocd > lowest ? eocd - 1 : npos;
    if (eocd == npos) fail(origin_, "not a zip archive (.npz): no end-of-directory record");
    std::uint64_t entries = u16(eocd + 10), at = u32(eocd + 16);
    if ((entries == 0xffffu || at == 0xffffffffu) && eocd >= 20 && u32(eocd - 20) == 0x07064b50u) {
      const std::uint64_t z = u64(eocd - 20 + 8);  // the ZIP64 end-of-directory record
      if (u32(z) != 0x06064b50u) fail(origin_, "damaged ZIP64 directory");
      entries = u64(z + 32);
      at = u64(z + 48);
    }
    std::string names;
    for (std::uint64_t e = 0; e < entries; ++e) {
      if (u32(at) != 0x02014b50u) fail(origin_, "damaged zip directory");
      const unsigned method = u16(at + 10);
      std::uint64_t packed = u32(at + 20), size = u32(at + 24), local = u32(at + 42);
      const std::size_t name_len = u16(at + 28), extra_len = u16(at + 30), note_len = u16(at + 32);
      const std::string entry(reinterpret_cast<const char*>(bytes(at + 46, name_len)), name_len);
      const std::size_t next = at + 46 + name_len + extra_len + note_len;
      if (entry != name + ".npy") {
        if (entry.ends_with(".npy"))
          names += (names.empty() ? "" : ", ") + entry.substr(0, entry.size() - 4);
        at = next;
        continue;
      }
      // ZIP64 sizes and offset, for those fields set to 0xffffffff (numpy writes them).
      for (std::size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
        const unsigned id = u16(x), len = u16(x + 2);
        std::size_t field = x + 4;
        if (id == 1) {
          if (size == 0xffffffffu) size = u64(field), field += 8;
          if (packed == 0xffffffffu) packed = u64(field), field += 8;
          if (local == 0xffffffffu) local = u64(field);
        }
        x += 4 + len;
      }
      if (u32(local) != 0x04034b50u) fail(origin_, "damaged zip member '" + entry + "'");
      const std::uint64_t start = local + 30 + u16(local + 26) + u16(local + 28);
      const unsigned char* data = bytes(start, packed);
      if (method == 0) return {data, static_cast<std::size_t>(packed)};
      if (method != 8) {
        fail(origin_, "member '" + entry + "' uses compression method " + std::to_string(method) +
                          " (stored and deflate are read)");
      }
      inflated.assign(static_cast<std::size_t>(size), 0);
      z_stream z{};
      if (inflateInit2(&z, -15) != Z_OK) fail(origin_, "zlib: cannot start inflating");
      z.next_in = const_cast<unsigned char*>(data);
      z.avail_in = static_cast<uInt>(packed);
      z.next_out = inflated.data();
      z.avail_out = static_cast<uInt>(size);
      const int rc = inflate(&z, Z_FINISH);
      inflateEnd(&z);
      if (rc != Z_STREAM_END || z.total_out != size) {
        fail(origin_, "member '" + entry + "' does not inflate to its " + std::to_string(size) +
                          " bytes (a damaged archive)");
      }
      return {inflated.data(), inflated.size()};
    }
    fail(origin_, "no array '" + name + "' (it holds: " + (names.empty() ? "none" : names) +
                      "; data.arrays names them)");
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  const unsigned char* bytes(std::uint64_t at, std::uint64_t n) const {
    if (at > size_ || n > size_ - at) fail(origin_, "truncated zip archive");
    return base_ + at;
  }
  std::uint64_t le(std::uint64_t at, int n) const {
    const unsigned char* p = bytes(at, static_cast<std::uint64_t>(n));
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
  }
  unsigned u16(std::uint64_t at) const { return static_cast<unsigned>(le(at, 2)); }
  std::uint64_t u32(std::uint64_t at) const { return le(at, 4); }
  std::uint64_t u64(std::uint64_t at) const { return le(at, 8); }

  std::string origin_;
  const unsigned char* base_;
  std::size_t size_;
};

// An array from a .npy file, or a member of a .npz archive (name non-empty), kept with what
// holds its bytes.
struct OpenArray {
  std::unique_ptr<detail::MappedFile> file;
  std::vector<unsigned char> inflated;
  std::optional<NpyArray> array;

  OpenArray(const std::filesystem::path& path, const std::string& name) {
    if (name.empty()) {
      file = std::make_unique<detail::MappedFile>(path, "expected .npy");
      array.emplace(path.string(), file->data(), file->size());
      return;
    }
    file = std::make_unique<detail::MappedFile>(path, "expected .npz");
    const auto bytes = ZipReader(path.string(), file->data(), file->size()).member(name, inflated);
    array.emplace(path.string() + "[" + name + "]", bytes.data(), bytes.size());
  }
};

std::int32_t label_value(const NpyArray& a, std::size_t i, std::size_t row, std::size_t column) {
  const double v = a.at(i);
  if (!(v >= 0) || v != std::floor(v) || v > static_cast<double>(std::int64_t{1} << 30)) {
    fail(a.origin() + ":" + std::to_string(row + 1) + ":" + std::to_string(column + 1),
         "expected a non-negative integer label, got " + std::to_string(v));
  }
  return static_cast<std::int32_t>(v);
}

float target_value(const NpyArray& a, std::size_t i, std::size_t row, std::size_t column) {
  const double v = a.at(i);
  if (!std::isfinite(v) || std::abs(v) > 3.4e38) {
    fail(a.origin() + ":" + std::to_string(row + 1) + ":" + std::to_string(column + 1),
         "expected a finite number as the target, got " + std::to_string(v));
  }
  return static_cast<float>(v);
}

}  // namespace

Dataset load_npy_dataset(const std::filesystem::path& features_path,
                         const std::filesystem::path& labels_path, const NpyOptions& options) {
  const bool npz = features_path.extension() == ".npz";
  if (npz && !labels_path.empty()) {
    fail(labels_path.string(), "a .npz archive names its labels array (data.arrays), not a file");
  }
  const OpenArray features_source(features_path, npz ? options.features_array : std::string());
  const NpyArray& x = *features_source.array;
  const std::size_t n = x.rows();
  if (x.shape().empty() || n == 0)
    fail(x.origin(), "no rows (an array of shape (N, ...) with N > 0)");
  std::vector<std::int32_t> labels;
  if (!options.targets) labels.reserve(n);
  std::size_t dim = x.row_size();
  long label_column = -1;  // in x, or -1 with a labels file
  std::optional<OpenArray> labels_source;
  if (!labels_path.empty() || (npz && !options.labels_array.empty())) {
    labels_source.emplace(npz ? features_path : labels_path,
                          npz ? options.labels_array : std::string());
  }
  const NpyArray* y = labels_source ? &*labels_source->array : nullptr;
  std::vector<float> targets;  // options.targets
  std::size_t target_dim = 1;
  if (y != nullptr && options.targets) {
    target_dim = y->row_size();
    if (y->rows() != n || y->shape().empty() || y->shape().size() > 2 || target_dim == 0) {
      fail(y->origin(), "expected " + std::to_string(n) + " targets (shape (" + std::to_string(n) +
                            ",) or (" + std::to_string(n) + ", T)) for the " + std::to_string(n) +
                            " rows of " + x.origin());
    }
    targets.reserve(n * target_dim);
    for (std::size_t i = 0; i < n * target_dim; ++i) {
      targets.push_back(target_value(*y, i, i / target_dim, i % target_dim));
    }
  } else if (y != nullptr) {
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
      if (static_cast<long>(c) == label_column && options.targets) {
        targets.push_back(target_value(x, r * width + c, r, c));
        continue;
      }
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
    if (options.targets) {
      return Dataset::regression(std::move(features), std::move(targets), target_dim, shape);
    }
    return Dataset(std::move(features), std::move(labels), shape, options.num_classes);
  } catch (const DataError& e) {
    throw DataError((y != nullptr ? y->origin() : x.origin()) + ": " + e.what());
  }
}

}  // namespace cohort::client
