#include "cohort/client/data_source.h"

#include <glob.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cohort/client/npy.h"
#include "cohort/core/error.h"

namespace cohort::client {
namespace {

std::string shape_text(const Shape& s) {
  return std::to_string(s.channels) + "x" + std::to_string(s.height) + "x" +
         std::to_string(s.width);
}

Shape parse_shape(std::string_view text) {
  if (text.empty()) return {0, 0, 0};
  std::size_t v[3] = {0, 0, 0};
  std::size_t i = 0;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  for (; i < 3 && p < end; ++i) {
    const auto [q, ec] = std::from_chars(p, end, v[i]);
    if (ec != std::errc() || v[i] == 0) break;
    p = q;
    if (p < end && (*p == 'x' || *p == 'X'))
      ++p;
    else
      break;
  }
  if (i != 2 || p != end) {
    throw ConfigError("data.shape must be CxHxW with positive sizes (e.g. 1x28x28), got '" +
                      std::string(text) + "'");
  }
  return {v[0], v[1], v[2]};
}

void scale_features(Dataset& data, double factor) {
  const auto f = static_cast<float>(factor);
  for (float& x : data.mutable_features()) x *= f;
}

Dataset load_file(const DataOptions& o, const std::string& path, const std::string& labels,
                  const std::vector<std::string>& arrays) {
  if (o.format == DataFormat::kCsv) {
    return load_csv_dataset(path, {.label_column = o.label_column,
                                   .label_name = o.label_name,
                                   .header = o.header,
                                   .delimiter = o.delimiter,
                                   .shape = o.shape,
                                   .targets = o.targets});
  }
  return load_npy_dataset(path, labels,
                          {.label_column = o.label_column,
                           .shape = o.shape,
                           .features_array = arrays.front(),
                           .labels_array = arrays.size() > 1 ? arrays[1] : std::string(),
                           .targets = o.targets});
}

bool is_pattern(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

// The files a pattern names (glob(3): sorted, so the order of the rows does not depend on the
// file system). DataError when none does.
std::vector<std::string> expand_pattern(const std::string& pattern, const char* key) {
  glob_t found{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> files;
  if (rc == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) files.emplace_back(found.gl_pathv[i]);
  }
  globfree(&found);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    throw DataError(pattern + ": no file matches (" + key + ")");
  }
  if (rc != 0) throw DataError(pattern + ": cannot read a folder of the pattern (" + key + ")");
  return files;
}

// data.train or data.test: one file, or every file a pattern matches, their rows one after the
// other in file-name order (each file is checked as it would be alone; their shapes must agree).
Dataset load_files(const DataOptions& o, const std::string& path, const std::string& labels,
                   const std::vector<std::string>& arrays, const char* key) {
  if (!is_pattern(path)) return load_file(o, path, labels, arrays);
  const auto files = expand_pattern(path, key);
  if (files.size() == 1) return load_file(o, files.front(), labels, arrays);
  std::vector<Dataset> parts;
  std::size_t rows = 0, classes = 0;
  for (const auto& f : files) {
    parts.push_back(load_file(o, f, labels, arrays));
    if (!(parts.back().shape() == parts.front().shape())) {
      throw DataError(f + ": examples of shape " + shape_text(parts.back().shape()) + ", but " +
                      files.front() + " has " + shape_text(parts.front().shape()) + " (" + key +
                      " = " + path + ")");
    }
    rows += parts.back().size();
    classes = std::max(classes, parts.back().num_classes());
  }
  const Shape shape = parts.front().shape();
  const std::size_t d = parts.front().feature_dim();
  const std::size_t t = parts.front().target_dim();
  FloatBuffer features(rows * d);
  std::vector<std::int32_t> all_labels;
  std::vector<float> all_targets;
  all_labels.reserve(t > 0 ? 0 : rows);
  all_targets.reserve(rows * t);
  std::size_t at = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto& p = parts[i];
    if (p.target_dim() != t) {
      throw DataError(files[i] + ": " + std::to_string(p.target_dim()) +
                      " targets per example, but " + files.front() + " has " + std::to_string(t) +
                      " (" + key + " = " + path + ")");
    }
    std::copy(p.features().begin(), p.features().end(), features.begin() + at * d);
    all_labels.insert(all_labels.end(), p.labels().begin(), p.labels().end());
    all_targets.insert(all_targets.end(), p.targets().begin(), p.targets().end());
    at += p.size();
    p = Dataset();  // each part's memory goes as soon as it is copied
  }
  if (t > 0) return Dataset::regression(std::move(features), std::move(all_targets), t, shape);
  return Dataset(std::move(features), std::move(all_labels), shape, classes);
}

// "FEATURES,LABELS" or "FEATURES": the .npz members of data.arrays or data.test_arrays.
std::vector<std::string> parse_arrays(const char* key, const std::string& text) {
  std::vector<std::string> names;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    names.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (names.size() > 2 || names.front().empty() || names.back().empty()) {
    throw ConfigError(std::string(key) +
                      " must be FEATURES,LABELS or FEATURES (member names), got '" + text + "'");
  }
  return names;
}

// data.arrays and data.test_arrays, refused for a file that is no .npz archive.
void read_npz_arrays(const Config& config, DataOptions& o) {
  for (const bool test : {false, true}) {
    const char* key = test ? "data.test_arrays" : "data.arrays";
    const std::string& file = test ? o.test : o.train;
    if (config.is_set(key) && std::filesystem::path(file).extension() != ".npz") {
      throw ConfigError(std::string(key) + " names the members of a .npz archive; " +
                        (test ? "data.test" : "data.train") + " is not one");
    }
  }
  o.train_arrays = parse_arrays("data.arrays", config.get_string("data.arrays"));
  const std::string test = config.get_string("data.test_arrays");
  o.test_arrays = test.empty() ? o.train_arrays : parse_arrays("data.test_arrays", test);
}

}  // namespace

FeatureScaling FeatureScaling::parse(std::string_view text) {
  if (text == "auto") return {};
  if (text == "none") return {Kind::kNone, 1.0};
  if (text == "standardize") return {Kind::kStandardize, 1.0};
  if (text.starts_with("divide:")) {
    const std::string number(text.substr(7));
    char* end = nullptr;
    const double c = std::strtod(number.c_str(), &end);
    if (!number.empty() && end == number.c_str() + number.size() && std::isfinite(c) && c > 0) {
      return {Kind::kDivide, c};
    }
  }
  throw ConfigError("data.scale must be auto, none, divide:C (C > 0) or standardize, got '" +
                    std::string(text) + "'");
}

std::string FeatureScaling::to_string() const {
  switch (kind) {
    case Kind::kAuto: return "auto";
    case Kind::kNone: return "none";
    case Kind::kStandardize: return "standardize";
    case Kind::kDivide: {
      std::string s = std::to_string(divisor);
      s.erase(s.find_last_not_of('0') + 1);
      if (s.back() == '.') s.pop_back();
      return "divide:" + s;
    }
  }
  return "auto";
}

std::string DataOptions::describe() const {
  if (format == DataFormat::kIdx) return "Fashion-MNIST (IDX, " + dir + ")";
  std::string s = (format == DataFormat::kCsv ? "csv " : "npy ") + train;
  if (!test.empty()) s += " (test " + test + ")";
  return s;
}

void add_data_source_keys(ConfigSchema& schema) {
  schema
      .add("data.format", std::string("auto"),
           "auto | idx | csv | npy (auto: by data.train's extension; idx, Fashion-MNIST's files "
           "in data.dir, without data.train)")
      .add("data.train", std::string(""),
           "your training file (.csv, .npy or .npz) instead of data.dir; a pattern "
           "(parts/*.csv) takes every file it matches, in name order")
      .add("data.test", std::string(""), "your test file, or a pattern (needed with data.train)")
      .add("data.train_labels", std::string(""), "npy: the labels (N,) of data.train's (N, ...)")
      .add("data.test_labels", std::string(""), "npy: the labels of data.test")
      .add("data.arrays", std::string("x,y"),
           "npz: the members holding the features and the labels (one name: a label column)")
      .add("data.test_arrays", std::string(""),
           "npz: the same for data.test (default: data.arrays)")
      .add("data.label", std::string("-1"),
           "csv/npy: the label column from 0 (negative: from the end) or, csv, its header name")
      .add("data.header", std::string("auto"),
           "csv: yes | no | auto (auto: a first row without numbers is a header)")
      .add("data.delimiter", std::string(","), "csv: the field separator (one character)")
      .add("data.shape", std::string(""),
           "features per example as CxHxW, e.g. 1x28x28 for a CNN (default: flat, or the .npy "
           "array's own)")
      .add("data.scale", std::string("auto"),
           "auto | none | divide:C | standardize (auto: IDX pixels / 255, CSV/NPY as stored; "
           "standardize: the training file's mean and deviation)");
}

DataOptions data_options_from(const Config& config) {
  DataOptions o;
  o.dir = config.get_string("data.dir");
  o.train = config.get_string("data.train");
  o.test = config.get_string("data.test");
  o.train_labels = config.get_string("data.train_labels");
  o.test_labels = config.get_string("data.test_labels");
  const std::string format = config.get_string("data.format");
  if (format == "auto") {
    const std::string ext = std::filesystem::path(o.train).extension().string();
    if (o.train.empty()) {
      o.format = DataFormat::kIdx;
    } else if (ext == ".csv" || ext == ".txt" || ext == ".tsv") {
      o.format = DataFormat::kCsv;
    } else if (ext == ".npy" || ext == ".npz") {
      o.format = DataFormat::kNpy;
    } else {
      throw ConfigError("data.format = auto cannot tell the format of '" + o.train +
                        "' from its extension: set data.format = csv or npy");
    }
  } else if (format == "idx") {
    o.format = DataFormat::kIdx;
  } else if (format == "csv") {
    o.format = DataFormat::kCsv;
  } else if (format == "npy") {
    o.format = DataFormat::kNpy;
  } else {
    throw ConfigError("data.format must be auto, idx, csv or npy, got '" + format + "'");
  }
  if (o.format == DataFormat::kIdx && !o.train.empty()) {
    throw ConfigError(
        "data.format = idx reads Fashion-MNIST's files from data.dir; data.train is "
        "for csv or npy files");
  }
  if (o.format != DataFormat::kIdx && o.train.empty()) {
    throw ConfigError("data.format = " + format + " needs data.train (the training file)");
  }
  if (o.format != DataFormat::kIdx && o.test.empty()) {
    throw ConfigError(
        "data.test: with data.train, give a test file too (it may be a held-out "
        "part of your data): the model is evaluated on it");
  }
  if (o.format != DataFormat::kNpy && (!o.train_labels.empty() || !o.test_labels.empty())) {
    throw ConfigError("data.train_labels and data.test_labels are for data.format = npy");
  }
  if (!o.test_labels.empty() && o.test.empty()) {
    throw ConfigError("data.test_labels is set but data.test is not");
  }
  if (o.train_labels.empty() != o.test_labels.empty() && !o.test.empty()) {
    throw ConfigError("give labels files for both data.train and data.test, or for neither");
  }
  for (const auto& [key, files, labels] : {std::tuple{"data.train", o.train, o.train_labels},
                                           std::tuple{"data.test", o.test, o.test_labels}}) {
    if (is_pattern(files) && !labels.empty()) {
      throw ConfigError(std::string(key) + " = '" + files +
                        "' is a pattern, and a labels file pairs with one features file: put "
                        "the labels in a column of each file, or use .npz files");
    }
  }
  if (o.format == DataFormat::kIdx) {
    for (const char* key : {"data.label", "data.header", "data.delimiter", "data.shape"}) {
      if (config.is_set(key)) {
        throw ConfigError(std::string(key) +
                          " applies to csv and npy files, not to IDX (data.dir)");
      }
    }
  }
  read_npz_arrays(config, o);
  const std::string label = config.get_string("data.label");
  int column = 0;
  const auto [p, ec] = std::from_chars(label.data(), label.data() + label.size(), column);
  if (ec == std::errc() && p == label.data() + label.size()) {
    o.label_column = column;
  } else if (o.format == DataFormat::kCsv && !label.empty()) {
    o.label_name = label;
  } else {
    throw ConfigError("data.label must be a column index (negative: from the end)" +
                      std::string(o.format == DataFormat::kCsv ? " or a header name" : "") +
                      ", got '" + label + "'");
  }
  const std::string header = config.get_string("data.header");
  if (header == "auto")
    o.header = CsvHeader::kAuto;
  else if (header == "yes")
    o.header = CsvHeader::kYes;
  else if (header == "no")
    o.header = CsvHeader::kNo;
  else
    throw ConfigError("data.header must be auto, yes or no, got '" + header + "'");
  const std::string delimiter = config.get_string("data.delimiter");
  if (delimiter == "\\t" || delimiter == "tab") {
    o.delimiter = '\t';
  } else if (delimiter.size() == 1 && delimiter != "\n" && delimiter != "\"") {
    o.delimiter = delimiter[0];
  } else {
    throw ConfigError("data.delimiter must be one character (or \\t), got '" + delimiter + "'");
  }
  o.shape = parse_shape(config.get_string("data.shape"));
  o.scale = FeatureScaling::parse(config.get_string("data.scale"));
  return o;
}

TrainTest load_data(const DataOptions& o, FeatureScaling idx_auto) {
  TrainTest out;
  FeatureScaling scale = o.scale;
  if (o.format == DataFormat::kIdx && o.targets) {
    throw ConfigError(
        "train.loss = mse needs float targets: Fashion-MNIST's IDX files (data.dir) hold class "
        "labels; give your own csv or npy files (data.train, data.test)");
  }
  if (o.format == DataFormat::kIdx) {
    out = load_fashion_mnist(o.dir);  // pixels / 255
    if (scale.kind == FeatureScaling::Kind::kAuto) scale = idx_auto;
    // Scaling is of the stored values (0..255); the loader divided them by 255 already.
    if (scale.kind == FeatureScaling::Kind::kNone) {
      scale = {FeatureScaling::Kind::kDivide, 1.0};
    }
    if (scale.kind == FeatureScaling::Kind::kDivide) {
      scale.divisor /= 255.0;
    }
  } else {
    out.train = load_files(o, o.train, o.train_labels, o.train_arrays, "data.train");
    if (!o.test.empty()) {
      out.test = load_files(o, o.test, o.test_labels, o.test_arrays, "data.test");
      if (out.test.feature_dim() != out.train.feature_dim() ||
          !(out.test.shape() == out.train.shape())) {
        throw DataError(o.test + ": examples of shape " + shape_text(out.test.shape()) + ", but " +
                        o.train + " has " + shape_text(out.train.shape()));
      }
      if (out.test.target_dim() != out.train.target_dim()) {
        throw DataError(o.test + ": " + std::to_string(out.test.target_dim()) +
                        " targets per example, but " + o.train + " has " +
                        std::to_string(out.train.target_dim()));
      }
    }
    if (scale.kind == FeatureScaling::Kind::kAuto) scale = {FeatureScaling::Kind::kNone, 1.0};
  }
  if (scale.kind == FeatureScaling::Kind::kDivide && scale.divisor != 1.0) {
    scale_features(out.train, 1.0 / scale.divisor);
    if (!out.test.empty()) scale_features(out.test, 1.0 / scale.divisor);
  } else if (scale.kind == FeatureScaling::Kind::kStandardize) {
    const FeatureStats stats = feature_stats(out.train);
    if (!(stats.stddev > 0)) {
      throw DataError(
          (o.format == DataFormat::kIdx ? o.dir : o.train) +
          ": every feature value is the same: data.scale = standardize cannot scale it");
    }
    standardize(out.train, stats);
    if (!out.test.empty()) standardize(out.test, stats);
  }
  return out;
}

void check_model_input(const kernels::NetworkSpec& spec, std::string_view model_name,
                       const Dataset& data, std::string_view data_name) {
  const kernels::Shape& in = spec.input_shape();
  const std::size_t want = in.size(), have = data.feature_dim();
  if (want == have) return;
  throw ConfigError("the model " + std::string(model_name) + " takes " + std::to_string(want) +
                    " inputs per example (" + std::to_string(in.channels) + "x" +
                    std::to_string(in.height) + "x" + std::to_string(in.width) + "), but " +
                    std::string(data_name) + " has " + std::to_string(have) +
                    " features per example (" + shape_text(data.shape()) + ")");
}

void check_model_output(const kernels::NetworkSpec& spec, std::string_view model_name,
                        const Dataset& data, std::string_view data_name) {
  const std::size_t outputs = spec.output_size();
  if (data.is_regression() && data.target_dim() != outputs) {
    throw ConfigError("the model " + std::string(model_name) + " has " + std::to_string(outputs) +
                      " outputs, but " + std::string(data_name) + " has " +
                      std::to_string(data.target_dim()) +
                      " targets per example (train.loss = mse fits one output to each)");
  }
  if (!data.is_regression() && data.num_classes() > outputs) {
    throw ConfigError("the model " + std::string(model_name) + " has " + std::to_string(outputs) +
                      " outputs, but " + std::string(data_name) + " has labels up to " +
                      std::to_string(data.num_classes() - 1));
  }
}

}  // namespace cohort::client
