#include "cohort/client/csv.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::client {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

[[noreturn]] void fail(std::string_view origin, std::size_t line, const std::string& what) {
  throw DataError(std::string(origin) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace

Dataset parse_csv_dataset(std::string_view text, std::string_view origin,
                          const CsvOptions& options) {
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::string_view> fields;
  std::size_t columns = 0;
  std::size_t label_index = 0;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line_no <= options.skip_rows || line.empty()) continue;

    fields.clear();
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = line.find(options.delimiter, start);
      fields.push_back(
          trim(line.substr(start, comma == std::string_view::npos ? line.npos : comma - start)));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (columns == 0) {
      columns = fields.size();
      const long index = options.label_column < 0
                             ? static_cast<long>(columns) + options.label_column
                             : options.label_column;
      if (index < 0 || index >= static_cast<long>(columns) || columns < 2) {
        fail(origin, line_no,
             "label column " + std::to_string(options.label_column) +
                 " does not exist in a row of " + std::to_string(columns) +
                 " columns (need a label and at least one feature)");
      }
      label_index = static_cast<std::size_t>(index);
    } else if (fields.size() != columns) {
      fail(
          origin, line_no,
          "expected " + std::to_string(columns) + " columns, got " + std::to_string(fields.size()));
    }
    for (std::size_t c = 0; c < fields.size(); ++c) {
      const std::string_view f = fields[c];
      if (c == label_index) {
        std::int64_t label = -1;
        const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), label);
        if (ec != std::errc() || p != f.data() + f.size() || label < 0 ||
            label > std::int64_t{1} << 30) {
          fail(origin, line_no,
               "column " + std::to_string(c) + ": expected a non-negative integer label, got '" +
                   std::string(f) + "'");
        }
        labels.push_back(static_cast<std::int32_t>(label));
        continue;
      }
      float value = 0.0f;
      const char* first = f.data();
      if (!f.empty() && f.front() == '+') ++first;
      const auto [p, ec] = std::from_chars(first, f.data() + f.size(), value);
      if (ec != std::errc() || p != f.data() + f.size() || f.empty() || !std::isfinite(value)) {
        fail(origin, line_no,
             "column " + std::to_string(c) + ": not a finite number: '" + std::string(f) + "'");
      }
      features.push_back(value * options.scale);
    }
  }
  if (labels.empty()) {
    throw DataError(std::string(origin) +
                    ": no data rows (expected a label column and feature "
                    "columns)");
  }
  const std::size_t dim = columns - 1;
  Shape shape = options.shape;
  if (shape.size() == 0) shape = {dim, 1, 1};
  if (shape.size() != dim) {
    throw DataError(std::string(origin) + ": " + std::to_string(dim) +
                    " feature columns, but the configured shape holds " +
                    std::to_string(shape.size()));
  }
  try {
    return Dataset(FloatBuffer(std::span<const float>(features)), std::move(labels), shape,
                   options.num_classes);
  } catch (const DataError& e) {
    throw DataError(std::string(origin) + ": " + e.what());
  }
}

Dataset load_csv_dataset(const std::filesystem::path& path, const CsvOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw DataError(path.string() + ": no such file (expected a CSV file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path.string() + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_csv_dataset(text.str(), path.string(), options);
}

}  // namespace cohort::client
