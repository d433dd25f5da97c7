// NumPy .npy datasets and .npz archives of them (format versions 1 to 3, C order, little-endian or
// single-byte numbers: float32/64, int8/16/32/64, uint8/16/32/64, bool), as Python users have them:
//   np.save("train.npy", np.column_stack([X, y]))   one file, the label in a column, or
//   np.save("x.npy", X); np.save("y.npy", y)        features (N, ...) and labels (N,) apart.
// For regression (NpyOptions::targets, train.loss = mse) the labels are float targets: a labels
// array (N,) or (N, T) gives T per example, a label column one.
// The file is mapped, not read, and converted once into the dataset's float buffer. Every failure
// is a one-line DataError naming the file, and for a bad value its row and column (from 1), e.g.
// "x.npy:17:3: not a finite number: nan". Stateless and thread-safe.
#pragma once

#include <filesystem>
#include <string>

#include "cohort/client/dataset.h"

namespace cohort::client {

struct NpyOptions {
  // One file: the label column (from 0; negative from the end). Ignored with a labels file.
  int label_column = -1;
  // Features per example as C x H x W; default from the array: (N, D) -> D x 1 x 1,
  // (N, H, W) -> 1 x H x W, (N, C, H, W) -> C x H x W. When set, its size must match.
  Shape shape = {0, 0, 0};
  std::size_t num_classes = 0;  // 0: max label + 1
  // A .npz archive (np.savez, compressed or not): the members holding the features and the
  // labels (empty: a label column in the features, as above).
  std::string features_array = "x";
  std::string labels_array = "y";
  // Regression: the labels (a labels array of shape (N,) or (N, T), or the label column) are
  // finite float targets, T per example (a Dataset::regression).
  bool targets = false;
};

// features: (N, D) with a label column, or with `labels` (N,) or (N, 1) (targets: (N, T)) any
// (N, ...) array; or a .npz archive whose members options.features_array and
// options.labels_array hold them.
Dataset load_npy_dataset(const std::filesystem::path& features,
                         const std::filesystem::path& labels = {}, const NpyOptions& options = {});

}  // namespace cohort::client
