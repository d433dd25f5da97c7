// data.*: CSV and NumPy files, their bad inputs (one line naming file, line and column), scaling,
// the keys, and the model/data check.
#include "cohort/client/data_source.h"

#include <doctest/doctest.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "cohort/client/npy.h"
#include "cohort/core/error.h"
#include "cohort/kernels/model_zoo.h"
#include "test_util.h"

namespace cohort::client {
namespace {

using testing::error_of;
using testing::write_npy;

// A zip archive of .npy members (name -> the .npy bytes), each stored or deflated, optionally
// with ZIP64 sizes as numpy writes them (force_zip64).
std::string npy_bytes(const std::string& descr, const std::string& shape, const void* data,
                      std::size_t bytes) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

void put(std::string& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void write_npz(const std::filesystem::path& path,
               const std::vector<std::pair<std::string, std::string>>& members, bool deflated,
               bool zip64) {
  std::string file, directory;
  for (const auto& [name, raw] : members) {
    std::string packed = raw;
    if (deflated) {
      packed.assign(compressBound(raw.size()) + 64, '\0');
      z_stream z{};
      REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
      z.avail_in = static_cast<uInt>(raw.size());
      z.next_out = reinterpret_cast<Bytef*>(packed.data());
      z.avail_out = static_cast<uInt>(packed.size());
      REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
      packed.resize(z.total_out);
      deflateEnd(&z);
    }
    const std::string member = name + ".npy";
    const std::uint64_t offset = file.size();
    std::string extra;
    if (zip64) {
      put(extra, 1, 2);
      put(extra, 24, 2);
      put(extra, raw.size(), 8);
      put(extra, packed.size(), 8);
      put(extra, offset, 8);
    }
    const std::uint64_t big = 0xffffffffu;
    put(file, 0x04034b50, 4);
    put(file, 45, 2);
    put(file, 0, 2);
    put(file, deflated ? 8 : 0, 2);
    put(file, 0, 4);  // time, date
    put(file, 0, 4);  // crc (not checked)
    put(file, zip64 ? big : packed.size(), 4);
    put(file, zip64 ? big : raw.size(), 4);
    put(file, member.size(), 2);
    put(file, 0, 2);
    file += member;
    file += packed;
    put(directory, 0x02014b50, 4);
    put(directory, 45, 2);
    put(directory, 45, 2);
    put(directory, 0, 2);
    put(directory, deflated ? 8 : 0, 2);
    put(directory, 0, 4);
    put(directory, 0, 4);
    put(directory, zip64 ? big : packed.size(), 4);
    put(directory, zip64 ? big : raw.size(), 4);
    put(directory, member.size(), 2);
    put(directory, extra.size(), 2);
    put(directory, 0, 2);  // comment
    put(directory, 0, 2);  // disk
    put(directory, 0, 2);
    put(directory, 0, 4);
    put(directory, zip64 ? big : offset, 4);
    directory += member;
    directory += extra;
  }
  const std::uint64_t at = file.size();
  file += directory;
  put(file, 0x06054b50, 4);
  put(file, 0, 4);
  put(file, members.size(), 2);
  put(file, members.size(), 2);
  put(file, directory.size(), 4);
  put(file, at, 4);
  put(file, 0, 2);
  std::ofstream(path, std::ios::binary) << file;
}

Config config_with(const std::vector<std::string>& settings) {
  ConfigSchema schema;
  schema.add("data.dir", std::string("/nonexistent"), "");
  add_data_source_keys(schema);
  Config c(schema);
  for (const auto& s : settings) {
    const auto eq = s.find('=');
    c.set(std::string_view(s).substr(0, eq), std::string_view(s).substr(eq + 1));
  }
  return c;
}

TEST_CASE("CSV: a header named label column, auto header, 1-based line and column in errors") {
  testing::TempDir dir;
  testing::write_text(dir.file("t.csv").string(), "a,b,species\n0.5,1,2\n1.5,2,0\n");
  const Dataset d = load_csv_dataset(dir.file("t.csv").string(),
                                     {.label_name = "species", .header = CsvHeader::kAuto});
  REQUIRE(d.size() == 2);
  CHECK(d.labels()[0] == 2);
  CHECK(d.row(1)[0] == doctest::Approx(1.5));
  CHECK(error_of([&] {
          (void)load_csv_dataset(dir.file("t.csv").string(), {.label_name = "kind"});
        }).ends_with("t.csv:1: no column named 'kind' (the header names: a, b, species)"));
  // The bad inputs: each one line with file, line and column.
  const std::string f = dir.file("bad.csv").string();
  const auto bad = [&](const std::string& text) {
    testing::write_text(f, text);
    return error_of([&] { (void)load_csv_dataset(f, {.label_column = -1}); });
  };
  CHECK(bad("1,2,0\n3,1\n") == f + ":2: expected 3 columns, got 2");         // a short row
  CHECK(bad("1,2,0\n3,x,1\n") == f + ":2:2: not a finite number: 'x'");      // non-numeric
  CHECK(bad("1,2,0\nnan,1,1\n") == f + ":2:1: not a finite number: 'nan'");  // NaN
  CHECK(bad("1,2,0\n1,inf,1\n") == f + ":2:2: not a finite number: 'inf'");  // Inf
  CHECK(bad("1,2,0\n1,2,-3\n") == f + ":2:3: expected a non-negative integer label, got '-3'");
  CHECK(bad("").starts_with(f + ": no data rows"));  // empty
  CHECK(bad("\n\n").starts_with(f + ": no data rows"));
}

TEST_CASE("NumPy: one array with a label column, or features and labels apart, any dtype") {
  testing::TempDir dir;
  const float rows[] = {0.5f, 1.0f, 2.0f, 1.5f, 2.5f, 0.0f};  // (2, 3), label last
  write_npy(dir.file("a.npy").string(), "<f4", "(2, 3)", rows, sizeof rows);
  const Dataset a = load_npy_dataset(dir.file("a.npy").string());
  REQUIRE(a.size() == 2);
  CHECK(a.feature_dim() == 2);
  CHECK(a.labels()[0] == 2);
  CHECK(a.row(1)[1] == doctest::Approx(2.5));
  const std::uint8_t pixels[] = {0, 255, 10, 20, 30, 40, 50, 60};  // (2, 2, 2) images
  const std::int64_t labels[] = {3, 1};
  write_npy(dir.file("x.npy").string(), "|u1", "(2, 2, 2)", pixels, sizeof pixels);
  write_npy(dir.file("y.npy").string(), "<i8", "(2,)", labels, sizeof labels);
  const Dataset b = load_npy_dataset(dir.file("x.npy").string(), dir.file("y.npy").string());
  CHECK(b.shape() == Shape{1, 2, 2});
  CHECK(b.row(0)[1] == 255.0f);
  CHECK(b.labels()[0] == 3);

  const double nan_row[] = {1.0, std::numeric_limits<double>::quiet_NaN(), 0.0};
  write_npy(dir.file("nan.npy").string(), "<f8", "(1, 3)", nan_row, sizeof nan_row);
  CHECK(error_of([&] { (void)load_npy_dataset(dir.file("nan.npy").string()); }) ==
        dir.file("nan.npy").string() + ":1:2: not a finite number: nan");
  const float bad_label[] = {1.0f, 2.0f, 0.5f};
  write_npy(dir.file("label.npy").string(), "<f4", "(1, 3)", bad_label, sizeof bad_label);
  CHECK(error_of([&] { (void)load_npy_dataset(dir.file("label.npy").string()); })
            .starts_with(dir.file("label.npy").string() +
                         ":1:3: expected a non-negative integer label"));
  write_npy(dir.file("short.npy").string(), "<f4", "(4, 3)", rows, sizeof rows);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("short.npy").string());
        }).starts_with(dir.file("short.npy").string() + ": truncated"));
  write_npy(dir.file("big.npy").string(), ">f4", "(2, 3)", rows, sizeof rows);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("big.npy").string());
        }).find("not supported") != std::string::npos);
  write_npy(dir.file("f.npy").string(), "<f4", "(2, 3)", rows, sizeof rows, /*fortran=*/true);
  CHECK(error_of([&] { (void)load_npy_dataset(dir.file("f.npy").string()); }).find("Fortran") !=
        std::string::npos);
  write_npy(dir.file("empty.npy").string(), "<f4", "(0, 3)", rows, 0);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("empty.npy").string());
        }).starts_with(dir.file("empty.npy").string() + ": no rows"));
  write_npy(dir.file("huge.npy").string(), "<f4", "(1152921504606846976, 3)", rows, sizeof rows);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("huge.npy").string());
        }).find("too large to be real") != std::string::npos);
  write_npy(dir.file("wrap.npy").string(), "<f4", "(4294967296, 4294967296)", rows, sizeof rows);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("wrap.npy").string());
        }).find("too large to be real") != std::string::npos);
  testing::write_text(dir.file("text.npy").string(), "1,2,3\n");
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("text.npy").string());
        }).starts_with(dir.file("text.npy").string() + ": not a NumPy .npy file"));
  write_npy(dir.file("y3.npy").string(), "<i8", "(1,)", labels, sizeof labels[0]);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("x.npy").string(), dir.file("y3.npy").string());
        }).starts_with(dir.file("y3.npy").string() + ": expected 2 labels"));
}

TEST_CASE("NumPy .npz archives: stored, deflated or ZIP64 members, named by data.arrays") {
  testing::TempDir dir;
  const float x[] = {0.5f, 1.0f, 1.5f, 2.0f};  // (2, 2)
  const std::int64_t y[] = {1, 0};
  const std::vector<std::pair<std::string, std::string>> members{
      {"x", npy_bytes("<f4", "(2, 2)", x, sizeof x)}, {"y", npy_bytes("<i8", "(2,)", y, sizeof y)}};
  for (const bool deflated : {false, true}) {
    for (const bool zip64 : {false, true}) {
      CAPTURE(deflated);
      CAPTURE(zip64);
      const std::string f = dir.file("d.npz").string();
      write_npz(f, members, deflated, zip64);
      const Dataset d = load_npy_dataset(f);
      REQUIRE(d.size() == 2);
      CHECK(d.row(1)[1] == 2.0f);
      CHECK(d.labels()[0] == 1);
    }
  }
  const std::string f = dir.file("d.npz").string();
  CHECK(error_of([&] { (void)load_npy_dataset(f, {}, {.features_array = "x_train"}); }) ==
        f + ": no array 'x_train' (it holds: x, y; data.arrays names them)");
  testing::write_text(dir.file("bad.npz"), "not a zip at all, long enough to look for one");
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("bad.npz").string());
        }).find("not a zip archive") != std::string::npos);
  // Keras' layout: both sets in one archive, chosen by data.arrays and data.test_arrays.
  write_npz(dir.file("k.npz"),
            {{"x_train", members[0].second},
             {"y_train", members[1].second},
             {"x_test", members[0].second},
             {"y_test", members[1].second}},
            true, true);
  const auto keras = data_options_from(config_with(
      {"data.train=" + dir.file("k.npz").string(), "data.test=" + dir.file("k.npz").string(),
       "data.arrays=x_train,y_train", "data.test_arrays=x_test,y_test"}));
  CHECK(load_data(keras).test.size() == 2);
  CHECK(error_of([&] {
          (void)data_options_from(
              config_with({"data.train=" + dir.file("t.csv").string(),
                           "data.test=" + dir.file("t.csv").string(), "data.arrays=a,b"}));
        }).starts_with("data.arrays names the members of a .npz archive"));
}

TEST_CASE("data.* keys: formats by extension, scaling, and refusals naming the key") {
  testing::TempDir dir;
  testing::write_text(dir.file("train.csv").string(), "x1,x2,y\n0,10,0\n2,30,1\n4,50,1\n");
  testing::write_text(dir.file("test.csv").string(), "x1,x2,y\n2,30,0\n");
  const auto csv = data_options_from(config_with({"data.train=" + dir.file("train.csv").string(),
                                                  "data.test=" + dir.file("test.csv").string()}));
  CHECK(csv.format == DataFormat::kCsv);
  TrainTest plain = load_data(csv);
  CHECK(plain.train.row(2)[1] == 50.0f);  // auto: CSV as stored
  auto scaled = csv;
  scaled.scale = FeatureScaling::parse("divide:10");
  CHECK(load_data(scaled).test.row(0)[1] == doctest::Approx(3.0));
  scaled.scale = FeatureScaling::parse("standardize");
  const TrainTest s = load_data(scaled);
  double sum = 0;
  for (const float v : s.train.features()) sum += v;
  CHECK(sum == doctest::Approx(0.0).epsilon(1e-5));
  CHECK(FeatureScaling::parse("divide:255").to_string() == "divide:255");

  CHECK(error_of([] { (void)FeatureScaling::parse("divide:0"); }).starts_with("data.scale"));
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.train=" + dir.file("train.csv").string()}));
        }).starts_with("data.test"));
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.train=/x/data.parquet", "data.test=/x/t"}));
        }).find("set data.format") != std::string::npos);
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.format=idx", "data.train=/x/a.csv"}));
        }).starts_with("data.format = idx"));
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.label=name"}));
        }).starts_with("data.label applies"));
  CHECK(error_of([&] {
          (void)data_options_from(
              config_with({"data.train=" + dir.file("train.csv").string(),
                           "data.test=" + dir.file("test.csv").string(), "data.shape=3x0x1"}));
        }).starts_with("data.shape"));
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.train=" + dir.file("train.csv").string(),
                                               "data.test=" + dir.file("test.csv").string(),
                                               "data.train_labels=" + dir.file("y.npy").string()}));
        }).starts_with("data.train_labels"));
}

TEST_CASE("data.train as a pattern: every matching file, in name order; refusals name the file") {
  testing::TempDir dir;
  testing::write_text(dir.file("part-1.csv").string(), "x1,x2,y\n3,30,1\n4,40,2\n");
  testing::write_text(dir.file("part-0.csv").string(), "x1,x2,y\n1,10,0\n2,20,1\n");
  testing::write_text(dir.file("part-2.csv").string(), "x1,x2,y\n5,50,0\n");
  testing::write_text(dir.file("test.csv").string(), "x1,x2,y\n2,30,0\n");
  const std::string pattern = (dir.path() / "part-*.csv").string();
  const auto o = data_options_from(
      config_with({"data.train=" + pattern, "data.test=" + dir.file("test.csv").string()}));
  CHECK(o.format == DataFormat::kCsv);  // the pattern's extension
  const TrainTest t = load_data(o);
  REQUIRE(t.train.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(t.train.row(i)[0] == static_cast<float>(i + 1));
  CHECK(t.train.num_classes() == 3);
  CHECK(t.train.labels()[3] == 2);
  // One file of another width: named, with the first file's shape.
  testing::write_text(dir.file("part-3.csv").string(), "x1,x2,x3,y\n1,2,3,0\n");
  CHECK(error_of([&] { (void)load_data(o); })
            .starts_with(dir.file("part-3.csv").string() + ": examples of shape 3x1x1, but " +
                         dir.file("part-0.csv").string() + " has 2x1x1"));
  // A bad row in the third file names that file, its line and column.
  testing::write_text(dir.file("part-3.csv").string(), "x1,x2,y\n1,x,0\n");
  CHECK(error_of([&] { (void)load_data(o); }) ==
        dir.file("part-3.csv").string() + ":2:2: not a finite number: 'x'");
  auto none = o;
  none.train = (dir.path() / "nothing-*.csv").string();
  CHECK(error_of([&] { (void)load_data(none); }) == none.train + ": no file matches (data.train)");
  CHECK(error_of([&] {
          (void)data_options_from(config_with({"data.train=" + (dir.path() / "*.npy").string(),
                                               "data.train_labels=y.npy", "data.test=t.npy",
                                               "data.test_labels=ty.npy"}));
        }).find("is a pattern, and a labels file pairs with one features file") !=
        std::string::npos);
}

TEST_CASE("a model that does not take the data's examples is refused, naming both") {
  testing::TempDir dir;
  testing::write_text(dir.file("d.csv").string(), "1,2,3,0\n");
  const Dataset d = load_csv_dataset(dir.file("d.csv").string(), {.label_column = -1});
  const auto spec = kernels::make_network_spec("mlp:784-10");
  CHECK(error_of([&] { check_model_input(spec, "mlp:784-10", d, "csv d.csv"); }) ==
        "the model mlp:784-10 takes 784 inputs per example (784x1x1), but csv d.csv has 3 "
        "features per example (3x1x1)");
  check_model_input(kernels::make_network_spec("mlp:3-4-2"), "mlp:3-4-2", d, "csv d.csv");
}

}  // namespace
}  // namespace cohort::client
