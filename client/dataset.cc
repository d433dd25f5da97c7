#include "cohort/client/dataset.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cohort/core/error.h"

namespace cohort::client {

Dataset::Dataset(FloatBuffer features, std::vector<std::int32_t> labels, Shape shape,
                 std::size_t num_classes)
    : features_(std::move(features)),
      labels_(std::move(labels)),
      shape_(shape),
      size_(labels_.size()),
      num_classes_(num_classes) {
  if (features_.size() != labels_.size() * shape_.size()) {
    throw DataError("dataset: " + std::to_string(features_.size()) + " feature values for " +
                    std::to_string(labels_.size()) + " labels of " + std::to_string(shape_.size()) +
                    " features each");
  }
  std::int32_t max_label = -1;
  for (const auto label : labels_) {
    if (label < 0) throw DataError("dataset: negative label " + std::to_string(label));
    max_label = std::max(max_label, label);
  }
  if (num_classes_ == 0) {
    num_classes_ = static_cast<std::size_t>(max_label + 1);
  } else if (max_label >= static_cast<std::int32_t>(num_classes_)) {
    throw DataError("dataset: label " + std::to_string(max_label) + " outside [0, " +
                    std::to_string(num_classes_) + ")");
  }
}

Dataset Dataset::regression(FloatBuffer features, std::vector<float> targets,
                            std::size_t target_dim, Shape shape) {
  if (target_dim == 0) throw DataError("dataset: regression targets need at least one value");
  if (targets.size() % target_dim != 0) {
    throw DataError("dataset: " + std::to_string(targets.size()) + " target values are not " +
                    std::to_string(target_dim) + " per example");
  }
  const std::size_t n = targets.size() / target_dim;
  if (features.size() != n * shape.size()) {
    throw DataError("dataset: " + std::to_string(features.size()) + " feature values for " +
                    std::to_string(n) + " examples of " + std::to_string(shape.size()) +
                    " features each");
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (!std::isfinite(targets[i])) {
      throw DataError("dataset: target " + std::to_string(i % target_dim + 1) + " of example " +
                      std::to_string(i / target_dim + 1) + " is not a finite number");
    }
  }
  Dataset out;
  out.features_ = std::move(features);
  out.targets_ = std::move(targets);
  out.shape_ = shape;
  out.size_ = n;
  out.target_dim_ = target_dim;
  return out;
}

Dataset Dataset::subset(std::span<const std::uint32_t> indices) const {
  const std::size_t d = feature_dim();
  const std::size_t t = target_dim_;
  FloatBuffer features(indices.size() * d);
  std::vector<std::int32_t> labels(is_regression() ? 0 : indices.size());
  std::vector<float> targets(indices.size() * t);
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::size_t i = indices[k];
    if (i >= size()) {
      throw DataError("dataset: index " + std::to_string(i) + " out of range for " +
                      std::to_string(size()) + " examples");
    }
    std::copy_n(features_.data() + i * d, d, features.data() + k * d);
    if (is_regression()) {
      std::copy_n(targets_.data() + i * t, t, targets.data() + k * t);
    } else {
      labels[k] = labels_[i];
    }
  }
  if (is_regression()) return regression(std::move(features), std::move(targets), t, shape_);
  return Dataset(std::move(features), std::move(labels), shape_, num_classes_);
}

std::vector<std::size_t> Dataset::label_counts() const {
  std::vector<std::size_t> counts(num_classes_, 0);
  for (const auto label : labels_) ++counts[static_cast<std::size_t>(label)];
  return counts;
}

FeatureStats feature_stats(const Dataset& data) {
  const auto values = data.features();
  if (values.empty()) return {};
  double sum = 0.0;
  double sum_sq = 0.0;
  for (const float v : values) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const auto n = static_cast<double>(values.size());
  const double mean = sum / n;
  const double var = std::max(0.0, sum_sq / n - mean * mean);
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(var))};
}

void standardize(Dataset& data, FeatureStats stats) {
  if (!(stats.stddev > 0.0f)) {
    throw ConfigError("standardize: standard deviation must be positive, got " +
                      std::to_string(stats.stddev));
  }
  const float inv = 1.0f / stats.stddev;
  for (float& v : data.mutable_features()) v = (v - stats.mean) * inv;
}

}  // namespace cohort::client
