// Where a program's examples come from (data.* keys): Fashion-MNIST-named IDX files in data.dir,
// or the user's own CSV or NumPy files (data.train, data.test), scaled as data.scale says. The
// same keys and the same loader serve cohort-client (federated and decentralized) and cohort-sim;
// a client with its own file trains on all of it (data.part = 0/1) or on a part of it.
//
//   data.format = auto | idx | csv | npy    auto: by data.train's extension, idx without one
//   data.train, data.test                   files (.csv, .npy): both, the model is evaluated
//                                           on data.test
//   data.train_labels, data.test_labels     npy: labels (N,) beside features (N, ...)
//   data.arrays = "x,y"                     npz (np.savez, compressed or not): the members
//   data.test_arrays = ""                   holding features and labels (one name: a label
//                                           column); test: data.arrays unless set (keras'
//                                           mnist.npz: x_train,y_train and x_test,y_test)
//   data.label = -1                         csv/npy: the label column, from 0 (negative: from
//                                           the end), or (csv) its name in the header row
//   data.header = auto | yes | no           csv: auto takes a first row of names as a header
//   data.delimiter = ","                    csv
//   data.shape = ""                         features per example as CxHxW (e.g. 1x28x28 for a
//                                           CNN); default flat, or the .npy array's own
//   data.scale = auto | none | divide:C | standardize
//                                           auto: IDX pixels / 255 (decentralized runs
//                                           standardize them, as they always did), CSV/NPY as
//                                           stored; standardize: the training set's mean and
//                                           standard deviation over all features, applied to
//                                           both sets (each client computes them on its own
//                                           training file: with local files they differ)
//
// Regression (train.loss = mse; DataOptions::targets): the label column of a CSV or .npy file is
// a finite float target (T = 1), and a labels array (data.train_labels, or a .npz's second
// member) of shape (N,) or (N, T) gives T targets per example; Fashion-MNIST's IDX files hold
// class labels and are refused. Targets are used as stored (data.scale scales features only).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cohort/client/csv.h"
#include "cohort/client/idx.h"
#include "cohort/core/config.h"
#include "cohort/kernels/network.h"

namespace cohort::client {

struct FeatureScaling {
  enum class Kind { kAuto, kNone, kDivide, kStandardize };
  Kind kind = Kind::kAuto;
  double divisor = 1.0;  // kDivide

  // "auto", "none", "divide:C" (C > 0) or "standardize"; ConfigError otherwise.
  static FeatureScaling parse(std::string_view text);
  [[nodiscard]] std::string to_string() const;
};

enum class DataFormat { kIdx, kCsv, kNpy };

struct DataOptions {
  std::string dir{kFashionMnistDir};  // data.dir: IDX
  DataFormat format = DataFormat::kIdx;
  std::string train, test, train_labels, test_labels;
  // .npz: the members holding features and labels, for each file ({name}: a label column).
  std::vector<std::string> train_arrays{"x", "y"}, test_arrays{"x", "y"};
  int label_column = -1;
  std::string label_name;  // csv: overrides label_column
  CsvHeader header = CsvHeader::kAuto;
  char delimiter = ',';
  Shape shape = {0, 0, 0};
  FeatureScaling scale;
  // Regression (train.loss = mse): load float targets instead of class labels. Not a data.* key:
  // each program sets it from its train.loss.
  bool targets = false;

  // "Fashion-MNIST (IDX, DIR)" or "csv FILE (test FILE)", for logs and banners.
  [[nodiscard]] std::string describe() const;
};

// The data.* keys above, with their defaults (data.dir, data.partition and data.seed are each
// program's own).
void add_data_source_keys(ConfigSchema& schema);
// Reads and checks them: ConfigError naming the key for a bad value or a combination that cannot
// work (a labels file without npy, data.format = idx with data.train, ...).
DataOptions data_options_from(const Config& config);

// The training set and the test set, scaled. idx_auto: what
// data.scale = auto means for IDX pixels. DataError (one line, naming the file, and the line and
// column of a bad value) for anything wrong in the files (also training and test files with
// different numbers of targets); ConfigError for options.targets with IDX files.
TrainTest load_data(const DataOptions& options,
                    FeatureScaling idx_auto = FeatureScaling{FeatureScaling::Kind::kDivide, 255});

// ConfigError unless the model takes the data's examples: one line naming the model, its input,
// the data and their shape.
void check_model_input(const kernels::NetworkSpec& spec, std::string_view model_name,
                       const Dataset& data, std::string_view data_name);

// ConfigError unless the model's outputs fit the data: as many outputs as the targets per example
// (regression), or at least as many as the classes. One line naming the model and the data.
void check_model_output(const kernels::NetworkSpec& spec, std::string_view model_name,
                        const Dataset& data, std::string_view data_name);

}  // namespace cohort::client
