#include "cohort/client/csv.h"

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/core/error.h"
#include "mapped_file.h"

namespace cohort::client {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// "origin:line:column: what" (line and column from 1), or "origin:line: what" when column is 0.
[[noreturn]] void fail(std::string_view origin, std::size_t line, std::size_t column,
                       const std::string& what) {
  std::string where = std::string(origin) + ":" + std::to_string(line);
  if (column > 0) where += ":" + std::to_string(column);
  throw DataError(where + ": " + what);
}

void split(std::string_view line, char delimiter, std::vector<std::string_view>& fields) {
  fields.clear();
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = line.find(delimiter, start);
    fields.push_back(
        trim(line.substr(start, at == std::string_view::npos ? line.npos : at - start)));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
}

// A finite float in f (a leading '+' allowed), else false.
bool parse_finite(std::string_view f, float& value) {
  const char* first = f.data();
  if (!f.empty() && f.front() == '+') ++first;
  const auto [p, ec] = std::from_chars(first, f.data() + f.size(), value);
  return !f.empty() && ec == std::errc() && p == f.data() + f.size() && std::isfinite(value);
}

bool is_number(std::string_view f) {
  float value = 0.0f;
  const char* first = f.data();
  if (!f.empty() && f.front() == '+') ++first;
  const auto [p, ec] = std::from_chars(first, f.data() + f.size(), value);
  return !f.empty() && ec == std::errc() && p == f.data() + f.size();
}

// The text's lines one at a time, numbered from 1, skipping none.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {}
  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    line = trim(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    ++number_;
    return true;
  }
  [[nodiscard]] std::size_t number() const { return number_; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t number_ = 0;
};

// Lines that are not blank: an upper bound of the data rows, for sizing the features once.
std::size_t count_rows(std::string_view text) {
  std::size_t rows = 0;
  Lines lines(text);
  std::string_view line;
  while (lines.next(line)) rows += line.empty() ? 0 : 1;
  return rows;
}

}  // namespace

Dataset parse_csv_dataset(std::string_view text, std::string_view origin,
                          const CsvOptions& options) {
  std::vector<std::string_view> fields;
  std::vector<std::int32_t> labels;
  std::vector<float> targets;  // options.targets
  FloatBuffer features;
  std::size_t columns = 0, label_index = 0, row = 0, capacity = 0;
  Lines lines(text);
  std::string_view line;
  while (lines.next(line)) {
    const std::size_t line_no = lines.number();
    if (line_no <= options.skip_rows || line.empty()) continue;
    split(line, options.delimiter, fields);
    if (columns == 0) {
      columns = fields.size();
      // The header: said so, or (auto) a first row in which no cell is a number (a row mixing
      // numbers and text is data, and its bad cell is reported below).
      bool header = options.header == CsvHeader::kYes;
      if (options.header == CsvHeader::kAuto) {
        header = true;
        for (const auto f : fields) header = header && !is_number(f);
      }
      long index = options.label_column < 0 ? static_cast<long>(columns) + options.label_column
                                            : options.label_column;
      if (!options.label_name.empty()) {
        if (!header) {
          fail(origin, line_no, 0,
               "the label column is named '" + options.label_name +
                   "', but the file has no header row (data.header = yes names the first row)");
        }
        index = -1;
        std::string names;
        for (std::size_t c = 0; c < fields.size(); ++c) {
          if (fields[c] == options.label_name) index = static_cast<long>(c);
          names += (c > 0 ? ", " : "") + std::string(fields[c]);
        }
        if (index < 0) {
          fail(origin, line_no, 0,
               "no column named '" + options.label_name + "' (the header names: " + names + ")");
        }
      }
      if (index < 0 || index >= static_cast<long>(columns) || columns < 2) {
        fail(origin, line_no, 0,
             "label column " + std::to_string(options.label_column) +
                 " does not exist in a row of " + std::to_string(columns) +
                 " columns (need a label and at least one feature)");
      }
      label_index = static_cast<std::size_t>(index);
      if (header) continue;
    }
    if (fields.size() != columns) {
      fail(
          origin, line_no, 0,
          "expected " + std::to_string(columns) + " columns, got " + std::to_string(fields.size()));
    }
    if (row == capacity) {  // sized once from the count of non-blank lines
      capacity = std::max<std::size_t>(count_rows(text), 1);
      features = FloatBuffer(capacity * (columns - 1));
      if (options.targets) {
        targets.reserve(capacity);
      } else {
        labels.reserve(capacity);
      }
    }
    float* out = features.data() + row * (columns - 1);
    for (std::size_t c = 0; c < fields.size(); ++c) {
      const std::string_view f = fields[c];
      float value = 0.0f;
      if (c == label_index && options.targets) {
        if (!parse_finite(f, value)) {
          fail(origin, line_no, c + 1,
               "expected a finite number as the target, got '" + std::string(f) + "'");
        }
        targets.push_back(value);
        continue;
      }
      if (c == label_index) {
        std::int64_t label = -1;
        const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), label);
        if (ec != std::errc() || p != f.data() + f.size() || label < 0 ||
            label > std::int64_t{1} << 30) {
          fail(origin, line_no, c + 1,
               "expected a non-negative integer label, got '" + std::string(f) + "'");
        }
        labels.push_back(static_cast<std::int32_t>(label));
        continue;
      }
      if (!parse_finite(f, value)) {
        fail(origin, line_no, c + 1, "not a finite number: '" + std::string(f) + "'");
      }
      *out++ = value * options.scale;
    }
    ++row;
  }
  if (row == 0) {
    throw DataError(std::string(origin) + ": no data rows (expected a " +
                    (options.targets ? "target" : "label") + " column and feature columns)");
  }
  const std::size_t dim = columns - 1;
  Shape shape = options.shape;
  if (shape.size() == 0) shape = {dim, 1, 1};
  if (shape.size() != dim) {
    throw DataError(std::string(origin) + ": " + std::to_string(dim) +
                    " feature columns, but the configured shape holds " +
                    std::to_string(shape.size()));
  }
  if (row < capacity) {  // a header or skipped rows: trim to the rows read
    FloatBuffer exact(std::span<const float>(features.data(), row * dim));
    features = std::move(exact);
  }
  try {
    if (options.targets)
      return Dataset::regression(std::move(features), std::move(targets), 1, shape);
    return Dataset(std::move(features), std::move(labels), shape, options.num_classes);
  } catch (const DataError& e) {
    throw DataError(std::string(origin) + ": " + e.what());
  }
}

Dataset load_csv_dataset(const std::filesystem::path& path, const CsvOptions& options) {
  const detail::MappedFile file(path, "expected a CSV file");
  return parse_csv_dataset(file.text(), path.string(), options);
}

}  // namespace cohort::client
