// In-memory labelled datasets for local training and evaluation.
//
// A Dataset holds N examples as one contiguous, 64-byte aligned float matrix [N x D] (row i is
// example i, D = channels * height * width) and either N integer class labels (classification,
// train.loss = cross_entropy) or, made by regression(), N x T float targets and no labels
// (regression, train.loss = mse; T >= 1 values per example, the network's outputs). Images loaded
// from IDX files are scaled to [0, 1]; standardize() optionally maps them to zero mean and unit
// variance. Partitions and the trainer address examples by row index, so a dataset is loaded once
// per process and shared read-only by every simulated client.
//
// Thread-safety: a const Dataset may be read from any number of threads. Move-only (it may hold
// hundreds of MiB; copy with subset() when a copy is really meant).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cohort/core/buffer.h"
#include "cohort/kernels/network.h"

namespace cohort::client {

// Per-example shape, channels-first, as the kernels use it: images (C, H, W), a vector of D
// features (D, 1, 1).
using Shape = kernels::Shape;

// Summary statistics over every feature value of a dataset.
struct FeatureStats {
  float mean = 0.0f;
  float stddev = 1.0f;
};

class Dataset {
 public:
  Dataset() = default;
  // Throws DataError if the sizes disagree (features.size() != labels.size() * shape.size()) or a
  // label lies outside [0, num_classes). num_classes == 0 means max label + 1.
  Dataset(FloatBuffer features, std::vector<std::int32_t> labels, Shape shape,
          std::size_t num_classes = 0);
  // A regression dataset: targets holds target_dim finite values per example (N x target_dim,
  // row-major, N = targets.size() / target_dim). Throws DataError if target_dim is 0, the sizes
  // disagree or a target is NaN or infinite (loaders check first, naming file, line and column).
  static Dataset regression(FloatBuffer features, std::vector<float> targets,
                            std::size_t target_dim, Shape shape);
  Dataset(Dataset&&) noexcept = default;
  Dataset& operator=(Dataset&&) noexcept = default;

  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] bool empty() const { return size_ == 0; }
  [[nodiscard]] std::size_t feature_dim() const { return shape_.size(); }
  [[nodiscard]] const Shape& shape() const { return shape_; }
  // 0 for a regression dataset.
  [[nodiscard]] std::size_t num_classes() const { return num_classes_; }
  [[nodiscard]] std::span<const float> features() const { return features_.span(); }
  [[nodiscard]] std::span<float> mutable_features() { return features_.span(); }
  // Empty for a regression dataset.
  [[nodiscard]] std::span<const std::int32_t> labels() const { return labels_; }
  // REQUIRES: i < size().
  [[nodiscard]] std::span<const float> row(std::size_t i) const {
    return {features_.data() + i * shape_.size(), shape_.size()};
  }

  // Regression: T values per example (0 for a classification dataset), all N x T of them, and
  // example i's. REQUIRES (target_row): is_regression() and i < size().
  [[nodiscard]] bool is_regression() const { return target_dim_ > 0; }
  [[nodiscard]] std::size_t target_dim() const { return target_dim_; }
  [[nodiscard]] std::span<const float> targets() const { return targets_; }
  [[nodiscard]] std::span<const float> target_row(std::size_t i) const {
    return {targets_.data() + i * target_dim_, target_dim_};
  }

  // A new dataset holding the given rows, in that order. Throws DataError on an index >= size().
  [[nodiscard]] Dataset subset(std::span<const std::uint32_t> indices) const;
  // Count of each label, num_classes() entries (none for a regression dataset).
  [[nodiscard]] std::vector<std::size_t> label_counts() const;

 private:
  FloatBuffer features_;
  std::vector<std::int32_t> labels_;
  std::vector<float> targets_;  // regression: size_ x target_dim_
  Shape shape_;
  std::size_t size_ = 0;
  std::size_t num_classes_ = 0;
  std::size_t target_dim_ = 0;  // > 0: a regression dataset
};

// Mean and standard deviation over all feature values (accumulated in double).
FeatureStats feature_stats(const Dataset& data);
// x <- (x - stats.mean) / stats.stddev for every feature. Use the training set's stats for the test
// set too. Throws ConfigError if stats.stddev <= 0.
void standardize(Dataset& data, FeatureStats stats);

}  // namespace cohort::client
