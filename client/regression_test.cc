// train.loss = mse on the client side: regression targets in CSV and NumPy files (and their bad
// cells, one line naming file, line and column), the dataset, partitions, the options, and the
// stock trainer on a linear problem, whole and micro-batched.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "cohort/client/csv.h"
#include "cohort/client/data_source.h"
#include "cohort/client/dataset.h"
#include "cohort/client/npy.h"
#include "cohort/client/partition.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/core/random.h"
#include "cohort/kernels/device.h"
#include "cohort/kernels/model_zoo.h"
#include "test_util.h"

namespace cohort::client {
namespace {

using Values = std::map<std::string, Value, std::less<>>;
using testing::error_of;
using testing::write_npy;

// y = 2 x0 - x1 + 0.5 x2 + 1 + noise (sd 0.1) for x ~ N(0, 1)^3: the noise variance is 0.01 and
// the targets' variance about 6.3.
Dataset linear(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  FloatBuffer x(n * 3);
  std::vector<float> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < 3; ++k) x[i * 3 + k] = static_cast<float>(rng.normal());
    y[i] = static_cast<float>(2 * x[i * 3] - x[i * 3 + 1] + 0.5 * x[i * 3 + 2] + 1 +
                              0.1 * rng.normal());
  }
  return Dataset::regression(std::move(x), std::move(y), 1, Shape{3, 1, 1});
}

double variance(std::span<const float> v) {
  double sum = 0, sq = 0;
  for (const float x : v) sum += x, sq += static_cast<double>(x) * x;
  const double mean = sum / static_cast<double>(v.size());
  return sq / static_cast<double>(v.size()) - mean * mean;
}

TEST_CASE("a regression dataset holds N x T targets and no labels") {
  FloatBuffer x(3 * 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  const Dataset d = Dataset::regression(std::move(x), {1, 2, 3, 4, 5, 6}, 2, Shape{2, 1, 1});
  CHECK(d.size() == 3);
  CHECK(d.is_regression());
  CHECK(d.target_dim() == 2);
  CHECK(d.labels().empty());
  CHECK(d.num_classes() == 0);
  CHECK(d.target_row(2)[1] == 6.0f);
  const std::vector<std::uint32_t> rows{2, 0};
  const Dataset s = d.subset(rows);
  CHECK(s.is_regression());
  CHECK(s.size() == 2);
  CHECK(s.target_row(0)[0] == 5.0f);
  CHECK(s.row(1)[1] == 1.0f);
  CHECK_THROWS_AS(Dataset::regression(FloatBuffer(4), {1, 2, 3}, 2, Shape{2, 1, 1}), DataError);
  CHECK_THROWS_AS(Dataset::regression(FloatBuffer(4), {1, 2}, 0, Shape{2, 1, 1}), DataError);
  CHECK(error_of([] {
          (void)Dataset::regression(FloatBuffer(4), {1, std::numeric_limits<float>::infinity()}, 1,
                                    Shape{2, 1, 1});
        }) == "dataset: target 1 of example 2 is not a finite number");
  CHECK_FALSE(Dataset(FloatBuffer(2), {0, 1}, Shape{1, 1, 1}).is_regression());
}

TEST_CASE("CSV targets: the label column as a float; bad cells name file, line and column") {
  testing::TempDir dir;
  const std::string f = dir.file("r.csv").string();
  testing::write_text(f, "a,b,price\n1,2,3.25\n\n4,5,-0.5e1\n6,7,+2\n");
  const Dataset d = load_csv_dataset(f, {.label_name = "price", .targets = true});
  REQUIRE(d.size() == 3);
  CHECK(d.is_regression());
  CHECK(d.target_dim() == 1);
  CHECK(d.targets()[0] == 3.25f);
  CHECK(d.targets()[1] == -5.0f);
  CHECK(d.targets()[2] == 2.0f);
  CHECK(d.row(1)[0] == 4.0f);
  // The same file as class labels stops at the first non-integer, as before.
  CHECK(error_of([&] { (void)load_csv_dataset(f, {.label_name = "price"}); }) ==
        f + ":2:3: expected a non-negative integer label, got '3.25'");
  const auto bad = [&](const std::string& text) {
    testing::write_text(f, text);
    return error_of([&] { (void)load_csv_dataset(f, {.label_column = -1, .targets = true}); });
  };
  CHECK(bad("1,2,0.5\n3,4,abc\n") == f + ":2:3: expected a finite number as the target, got 'abc'");
  CHECK(bad("1,2,nan\n") == f + ":1:3: expected a finite number as the target, got 'nan'");
  CHECK(bad("1,2,0\n1,2,-inf\n") == f + ":2:3: expected a finite number as the target, got '-inf'");
  CHECK(bad("1,2,0\n1,2,\n") == f + ":2:3: expected a finite number as the target, got ''");
  CHECK(bad("1,x,0\n") == f + ":1:2: not a finite number: 'x'");  // features as before
  CHECK(bad("a,b,y\n").starts_with(f + ": no data rows (expected a target column"));
}

TEST_CASE("NumPy targets: a label column, (N,) or (N, T) arrays, .npz; bad values and shapes") {
  testing::TempDir dir;
  const float rows[] = {0.5f, 1.0f, 2.5f, 1.5f, 2.5f, -0.25f};  // (2, 3), target last
  write_npy(dir.file("a.npy"), "<f4", "(2, 3)", rows, sizeof rows);
  const Dataset a = load_npy_dataset(dir.file("a.npy"), {}, {.targets = true});
  REQUIRE(a.size() == 2);
  CHECK(a.target_dim() == 1);
  CHECK(a.targets()[1] == -0.25f);
  CHECK(a.feature_dim() == 2);

  const double x[] = {1, 2, 3, 4, 5, 6};   // (3, 2) features
  const double y2[] = {1, 2, 3, 4, 5, 6};  // (3, 2) targets: T = 2
  const std::int64_t y1[] = {10, 20, 30};  // (3,) integer targets, read as floats
  write_npy(dir.file("x.npy"), "<f8", "(3, 2)", x, sizeof x);
  write_npy(dir.file("y2.npy"), "<f8", "(3, 2)", y2, sizeof y2);
  write_npy(dir.file("y1.npy"), "<i8", "(3,)", y1, sizeof y1);
  const Dataset b = load_npy_dataset(dir.file("x.npy"), dir.file("y2.npy"), {.targets = true});
  CHECK(b.target_dim() == 2);
  CHECK(b.target_row(2)[0] == 5.0f);
  const Dataset c = load_npy_dataset(dir.file("x.npy"), dir.file("y1.npy"), {.targets = true});
  CHECK(c.target_dim() == 1);
  CHECK(c.targets()[2] == 30.0f);
  // As class labels, (N, 2) is refused, as before.
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("x.npy"), dir.file("y2.npy"));
        }).find("expected 3 labels") != std::string::npos);

  const double nan_targets[] = {1, std::numeric_limits<double>::quiet_NaN(), 3, 4, 5, 6};
  write_npy(dir.file("nan.npy"), "<f8", "(3, 2)", nan_targets, sizeof nan_targets);
  CHECK(error_of([&] {
          (void)load_npy_dataset(dir.file("x.npy"), dir.file("nan.npy"), {.targets = true});
        }) ==
        dir.file("nan.npy").string() + ":1:2: expected a finite number as the target, got nan");
  const float inf_rows[] = {0.5f, 1.0f, std::numeric_limits<float>::infinity()};
  write_npy(dir.file("inf.npy"), "<f4", "(1, 3)", inf_rows, sizeof inf_rows);
  CHECK(error_of([&] { (void)load_npy_dataset(dir.file("inf.npy"), {}, {.targets = true}); }) ==
        dir.file("inf.npy").string() + ":1:3: expected a finite number as the target, got inf");
  const double four[] = {1, 2, 3, 4};
  write_npy(dir.file("y4.npy"), "<f8", "(4,)", four, sizeof four);
  CHECK(
      error_of([&] {
        (void)load_npy_dataset(dir.file("x.npy"), dir.file("y4.npy"), {.targets = true});
      }).starts_with(dir.file("y4.npy").string() + ": expected 3 targets (shape (3,) or (3, T))"));
}

TEST_CASE("load_data with targets: csv files, scaled features, refusals for IDX and mismatches") {
  testing::TempDir dir;
  testing::write_text(dir.file("train.csv"), "x1,x2,y\n0,10,0.5\n2,30,1.5\n4,50,2.5\n");
  testing::write_text(dir.file("test.csv"), "x1,x2,y\n2,30,-1\n");
  DataOptions o;
  o.format = DataFormat::kCsv;
  o.train = dir.file("train.csv").string();
  o.test = dir.file("test.csv").string();
  o.targets = true;
  o.scale = FeatureScaling::parse("standardize");
  const TrainTest t = load_data(o);
  CHECK(t.train.is_regression());
  CHECK(t.test.targets()[0] == -1.0f);  // targets as stored
  CHECK(t.train.targets()[2] == 2.5f);
  double sum = 0;
  for (const float v : t.train.features()) sum += v;
  CHECK(sum == doctest::Approx(0.0).epsilon(1e-5));  // features standardized
  // A pattern concatenates regression files too.
  testing::write_text(dir.file("train2.csv"), "x1,x2,y\n6,70,3.5\n");
  o.train = (dir.path() / "train*.csv").string();
  CHECK(load_data(o).train.targets().size() == 4);

  DataOptions idx;
  idx.targets = true;
  CHECK(
      error_of([&] { (void)load_data(idx); }).starts_with("train.loss = mse needs float targets"));

  const double x[] = {1, 2, 3, 4}, y2[] = {1, 2, 3, 4}, y1[] = {1, 2};
  write_npy(dir.file("x.npy"), "<f8", "(2, 2)", x, sizeof x);
  write_npy(dir.file("y2.npy"), "<f8", "(2, 2)", y2, sizeof y2);
  write_npy(dir.file("y1.npy"), "<f8", "(2,)", y1, sizeof y1);
  DataOptions npy;
  npy.format = DataFormat::kNpy;
  npy.train = npy.test = dir.file("x.npy").string();
  npy.train_labels = dir.file("y2.npy").string();
  npy.test_labels = dir.file("y1.npy").string();
  npy.targets = true;
  CHECK(error_of([&] { (void)load_data(npy); }) ==
        npy.test + ": 1 targets per example, but " + npy.train + " has 2");

  const auto spec = kernels::make_network_spec("mlp:2-4-2");
  CHECK(error_of([&] { check_model_output(spec, "mlp:2-4-2", t.train, "csv train.csv"); }) ==
        "the model mlp:2-4-2 has 2 outputs, but csv train.csv has 1 targets per example "
        "(train.loss = mse fits one output to each)");
  check_model_output(kernels::make_network_spec("mlp:2-4-1"), "mlp:2-4-1", t.train, "train");
}

TEST_CASE("partitions of a regression dataset: iid and quantity by size; label splits refused") {
  const Dataset d = linear(200, 1);
  const Partition iid = make_partition(parse_partition_spec("iid"), d, 4, 7);
  REQUIRE(iid.size() == 4);
  std::size_t total = 0;
  for (const auto& part : iid) total += part.size();
  CHECK(total == 200);
  CHECK(make_partition(parse_partition_spec("quantity:1"), d, 4, 7).size() == 4);
  for (const char* spec : {"dirichlet:0.5", "shards:2"}) {
    const std::string why =
        error_of([&] { (void)make_partition(parse_partition_spec(spec), d, 4, 7); });
    CHECK(why.starts_with("data.partition = " + std::string(spec).substr(0, 9)));
    CHECK(why.find("use iid or quantity:BETA") != std::string::npos);
    CHECK(why.find('\n') == std::string::npos);
  }
  // The same spec on the labels gives the same split as before.
  const Dataset classes(FloatBuffer(8), {0, 1, 0, 1, 0, 1, 0, 1}, Shape{1, 1, 1});
  CHECK(make_partition(parse_partition_spec("iid"), classes, 2, 3) ==
        make_partition(parse_partition_spec("iid"), classes.labels(), 2, 3));
}

TEST_CASE("train.loss: cross_entropy by default, mse, anything else refused listing both") {
  CHECK(TrainerOptions{}.loss == LossKind::kCrossEntropy);
  CHECK(trainer_options_from(ConfigSection("train", Values{})).loss == LossKind::kCrossEntropy);
  CHECK(trainer_options_from(ConfigSection("train", Values{{"loss", std::string("mse")}})).loss ==
        LossKind::kMse);
  CHECK(error_of([] {
          (void)trainer_options_from(ConfigSection("train", Values{{"loss", std::string("l1")}}));
        }) == "train.loss must be cross_entropy or mse, got 'l1'");
  CHECK(error_of([] {
          (void)trainer_options_from(ConfigSection(
              "train", Values{{"loss", std::string("mse")}, {"rule", std::string("clip:1")}}));
        }).starts_with("train.loss = mse is trained by the stock rule only"));
  CHECK(to_string(LossKind::kMse) == "mse");
  ConfigSchema schema;
  declare_trainer_options(schema, "train");
  Config config(schema);
  CHECK(config.get_string("train.loss") == "cross_entropy");
}

TEST_CASE("the stock trainer fits a linear regression with mse, whole or micro-batched") {
  const Dataset train = linear(512, 2), test = linear(256, 3);
  const double var = variance(test.targets());
  auto device = kernels::make_device("cpu");
  const auto spec = kernels::make_network_spec("mlp:3-16-1");
  TrainerOptions options;
  options.loss = LossKind::kMse;
  options.batch_size = 32;
  options.epochs = 8;
  options.optimizer.learning_rate = 0.05f;
  options.optimizer.momentum = 0.9f;
  auto net = device->make_network(spec);
  net->init(4);
  LocalTrainer trainer(*net, options);
  const EvalResult before = trainer.evaluate(test);
  const TrainResult r = trainer.train(train, 5);
  const EvalResult after = trainer.evaluate(test);
  MESSAGE("test MSE " << before.loss << " -> " << after.loss << ", target variance " << var);
  CHECK(r.steps == 8 * 16);
  CHECK(r.samples == 8 * 512);
  CHECK_FALSE(after.has_accuracy);
  CHECK(after.accuracy == 0.0);
  CHECK(after.count == 256);
  CHECK(after.loss < var / 20);
  CHECK(after.loss < before.loss / 10);
  // Over an index list: the same rows give the same MSE.
  std::vector<std::uint32_t> all(test.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  CHECK(trainer.evaluate(test, all).loss == doctest::Approx(after.loss).epsilon(1e-6));

  // Micro-batches of 5 (32 = 6 x 5 + 2), with FedProx: the same training up to float rounding.
  options.epochs = 1;
  options.prox_mu = 0.1;
  auto whole = device->make_network(spec), split = device->make_network(spec);
  whole->init(6);
  split->init(6);
  split->set_micro_batch(5);
  LocalTrainer a(*whole, options), b(*split, options);
  const double la = a.train(train, 9).mean_loss, lb = b.train(train, 9).mean_loss;
  CHECK(lb == doctest::Approx(la).epsilon(1e-4));
  double worst = 0;
  for (std::size_t i = 0; i < whole->parameter_count(); ++i) {
    worst = std::max(
        worst, std::abs(static_cast<double>(whole->parameters()[i] - split->parameters()[i])));
  }
  CHECK(worst < 1e-4);
}

TEST_CASE("a dataset of the other kind, or targets the model cannot output, is a DataError") {
  auto device = kernels::make_device("cpu");
  const auto spec = kernels::make_network_spec("mlp:3-2");
  auto net = device->make_network(spec);
  TrainerOptions mse;
  mse.loss = LossKind::kMse;
  LocalTrainer regression(*net, mse);
  const Dataset classes(FloatBuffer(6), {0, 1}, Shape{3, 1, 1});
  CHECK(error_of([&] {
          (void)regression.train(classes, 1);
        }).starts_with("train.loss = mse needs float targets"));
  CHECK(error_of([&] {
          (void)regression.evaluate(linear(4, 1));
        }).starts_with("dataset has 1 targets per example but the model outputs 2"));
  LocalTrainer classify(*net, {});
  CHECK(error_of([&] {
          (void)classify.evaluate(linear(4, 1));
        }).starts_with("train.loss = cross_entropy needs class labels"));
}

}  // namespace
}  // namespace cohort::client
