// CSV datasets: one example per line, one integer class-label column and numeric feature columns;
// or, for regression (CsvOptions::targets, train.loss = mse), the same column read as one float
// target per example (T = 1).
//
// Every failure is a one-line DataError naming the file, line and column (both from 1, as editors
// count), e.g. "iris.csv:17: expected 5 columns, got 4" or "iris.csv:3:2: not a finite number:
// 'abc'". A file is mapped, not read into memory, and its features are written once into a buffer
// sized from its line count: a 1 GB file does not cost 2 GB. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "cohort/client/dataset.h"

namespace cohort::client {

enum class CsvHeader { kNo, kYes, kAuto };  // auto: a first row with a non-number is a header

struct CsvOptions {
  // Index of the label column from 0; negative counts from the end (-1 is the last column).
  int label_column = 0;
  // The label column's name in the header row (overrides label_column; needs a header).
  std::string label_name;
  // Lines skipped at the top of the file, before any header.
  std::size_t skip_rows = 0;
  CsvHeader header = CsvHeader::kAuto;
  char delimiter = ',';
  // Every feature is multiplied by this (1/255 for pixel values stored as 0..255).
  float scale = 1.0f;
  // Per-example shape; default (D, 1, 1) with D taken from the first row. When set, its size must
  // equal the number of feature columns.
  Shape shape = {0, 0, 0};
  // 0 means max label + 1.
  std::size_t num_classes = 0;
  // Regression: the label column holds a finite float target (a Dataset::regression with T = 1).
  bool targets = false;
};

// Loads the whole file. Blank lines are skipped; fields may be surrounded by spaces. Labels must be
// non-negative integers (targets: finite numbers). Throws DataError for a missing file, a ragged
// row, a non-numeric field or a bad label or target, and for a file with no rows.
Dataset load_csv_dataset(const std::filesystem::path& path, const CsvOptions& options = {});

// The same, from text already in memory; `origin` names it in errors.
Dataset parse_csv_dataset(std::string_view text, std::string_view origin,
                          const CsvOptions& options = {});

}  // namespace cohort::client
