// cohort-sim's reporting: one record per closed round, written as a sim_round JSON line
// (sim.metrics_file) and a CSV row (sim.csv_file), and the live progress line on stderr.
// Private to sim/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "cohort/core/metrics.h"
#include "cohort/core/tensorboard.h"
#include "cohort/core/units.h"
#include "cohort/sim/sim.h"
#include "options.h"

namespace cohort::sim {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "1.5d", "2.0h", "3.4m", "5.6s".
std::string human_duration(double seconds);

// One round as the fleet saw it: its plan on the simulated clock, what it moved and trained, and
// its evaluation when one was asked for.
struct RoundRecord {
  std::uint64_t seq = 0, round_id = 0;
  std::size_t selected = 0, completed = 0, cut = 0, stragglers = 0, silent = 0;
  bool committed = false;
  double sim_round_s = 0, sim_total_s = 0;
  double loss_sum = 0;
  std::uint64_t samples = 0, bytes = 0;
  // Local steps of the updates the shards took (`updates` of them): the work each was given.
  std::size_t updates = 0, steps_min = 0, steps_max = 0, steps_sum = 0;
  // With memory budgets (memory_budgets = true; JSON only): how many of those updates were
  // trained in micro-batches, and how many recomputing activations.
  bool memory_budgets = false;
  std::size_t micro_batched = 0, recomputed = 0;
  double wall_round_s = 0, wall_train_s = 0, wall_train_cpu_s = 0;
  bool evaluated = false;
  double test_loss = 0, test_accuracy = 0;
  bool has_accuracy = true;  // false for train.loss = mse: test_loss is the MSE, no accuracy
  // Secure aggregation: the stages' share of sim_round_s, and their bytes (within `bytes`).
  double secagg_s = 0;
  std::uint64_t secagg_bytes = 0;
};

// What the progress line shows, filled in by the fleet.
struct ProgressView {
  bool registering = false;  // still registering: only the two counts below and wall_s
  std::size_t registered = 0, clients = 0;
  std::uint64_t round = 0, rounds = 0;  // current (or last written) round, server.rounds
  std::size_t reported = 0, selected = 0;
  double eta_s = 0, sim_s = 0, wall_s = 0;
};

// Writes the round records and the progress line. Not thread-safe: the fleet's thread uses it.
class Reporter {
 public:
  // Opens the metrics file and the CSV (with its header), each unless its name is empty. Throws
  // ConfigError if either cannot be written.
  explicit Reporter(const ReportOptions& options);

  // Writes `r` as a sim_round JSON line and a CSV row; `wall_s` is host time since the start.
  // The record becomes the one the progress line shows.
  void write(const RoundRecord& r, double wall_s);

  // Writes the run's sim_summary JSON line: rounds, simulated time, final accuracy, and how
  // often the clients were selected and had an update taken (min, max, mean over all clients,
  // and how many never had one).
  void write_summary(const Summary& s);

  // Whether a progress line is due: always after a round (when sim.progress is on), otherwise at
  // most every 0.25 s and only on a terminal.
  [[nodiscard]] bool progress_due(bool round_done) const;
  // Prints the progress line (over the previous one on a terminal; a new line after a round).
  void print_progress(const ProgressView& view, bool round_done);
  // Ends the progress line on a terminal.
  void finish_progress();

  [[nodiscard]] std::uint64_t total_bytes() const { return total_bytes_; }
  // The last record written, if any.
  [[nodiscard]] const RoundRecord* last() const { return have_last_ ? &last_ : nullptr; }

 private:
  std::optional<TensorBoardScalars> tensorboard_;  // before metrics_, which may write there
  MetricsSink metrics_;
  std::ofstream csv_;
  bool progress_ = true, tty_ = false;
  Clock::time_point last_progress_;
  std::uint64_t total_bytes_ = 0;  // payload bytes of every round written so far
  RoundRecord last_;
  bool have_last_ = false;
};

}  // namespace cohort::sim
