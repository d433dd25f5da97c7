// The coordinator's progress lines and "round" metrics: one per committed round (FedBuff: step),
// printed in order. Every eval_every rounds and after the last, the new model is evaluated on one
// client's copy of the test set; the line waits for that result (or its deadline) while later
// rounds go on and queue behind it, so no round's line is lost or merged into another's. A
// FedBuff step's line also waits for the reports of the updates it averaged, which may arrive
// after the step (report attribution: the oldest line still short of reports takes a report).
// Internal to the server library; not thread-safe (the coordinator's thread).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "cohort/core/clock.h"
#include "cohort/core/metrics.h"
#include "cohort/core/tensorboard.h"
#include "cohort/transport/messages.h"

namespace cohort::server {

// What a committed round (step) did, as its line and metrics record show it.
struct RoundRecord {
  std::size_t clients = 0, selected = 0;
  double train_loss = 0, bytes = 0, train_s = 0, comm_s = 0, round_s = 0;
  double uplink = 0;    // payload bytes the clients sent (compressed pushes count as sent)
  double epsilon = -1;  // DP: epsilon at dp.delta after this round; < 0 when DP is off
};

// A trained FedBuff task's report, kept until a step's line takes it.
struct TaskReport {
  double loss_sum = 0;  // train loss x samples
  std::uint64_t samples = 0;
  double bytes = 0, uplink = 0, train_s = 0, comm_s = 0;
};

// One committed round's line, queued until its evaluation and reports are in or overdue.
struct Line {
  std::uint64_t round_id = 0;   // federated: the round's id; FedBuff: the step
  std::uint64_t committed = 0;  // rounds (steps) committed with this one
  RoundRecord record;
  double sampling_rate = 1.0;
  bool waiting = false;       // for an evaluation
  std::uint64_t eval_id = 0;  // the RoundStart.round of the evaluation asked for
  TimePoint eval_deadline;
  std::optional<transport::ClientReport> eval;
  // FedBuff: the reports of the updates this step averaged (record.clients of them), which
  // may come in after the step; the line waits for them until `reports_deadline`.
  std::size_t reports = 0;
  double loss_sum = 0;
  std::uint64_t samples = 0;
  TimePoint reports_deadline;

  void add(const TaskReport& r);
  [[nodiscard]] bool ready(TimePoint now) const;
};

// Which fields of the "round" records become TensorBoard scalars (metrics.tensorboard_dir),
// step = the record's "round": train/loss, test/loss, test/accuracy, round/seconds,
// round/train_seconds, round/comm_seconds, bytes/round, bytes/uplink, bytes/total,
// clients/updates, clients/selected, dp/epsilon; each only in the records that have it.
std::vector<ScalarEvent> round_scalars();

class RoundReport {
 public:
  // `rounds`: server.rounds (for the ETA); `buffered`: FedBuff's wording ("step", "updates");
  // `regression`: train.loss = mse, whose evaluations have a test loss (the MSE) and no
  // accuracy, so neither the lines nor the metrics show one. The clock's now() is the start of
  // training, for the ETA and wall_seconds.
  RoundReport(const Clock& clock, MetricsSink& metrics, bool buffered, std::uint64_t rounds,
              double dp_noise, double dp_delta, bool regression = false);

  // Queues a committed round's line (FedBuff: it takes the reports that were waiting first),
  // then prints what is ready.
  void queue(Line line);
  // Prints the lines at the head of the queue whose evaluation is in or overdue.
  void flush(TimePoint now);
  // FedBuff: a trained task's report goes to the oldest line still short of reports, or waits
  // for the next step's line.
  void add_task_report(const TaskReport& r);
  // An evaluation's result goes to the line that asked for it (by RoundStart.round).
  void add_evaluation(const transport::ClientReport& r);
  // Training stopped: no line waits any longer.
  void stop_waiting(TimePoint now);

  [[nodiscard]] bool empty() const { return lines_.empty(); }
  [[nodiscard]] std::size_t pending() const { return lines_.size(); }
  [[nodiscard]] float last_accuracy() const { return last_accuracy_; }
  // The last evaluation's test loss (regression: the MSE); 0 before any.
  [[nodiscard]] float last_loss() const { return last_loss_; }
  [[nodiscard]] bool regression() const { return regression_; }
  [[nodiscard]] double total_uplink() const { return total_uplink_; }

 private:
  void print(const Line& line);

  const Clock& clock_;
  MetricsSink& metrics_;
  bool buffered_;
  bool regression_;
  std::uint64_t rounds_;
  double dp_noise_, dp_delta_;
  TimePoint started_;
  std::deque<Line> lines_;                  // committed rounds not yet printed, oldest first
  std::deque<TaskReport> waiting_reports_;  // FedBuff: reports no step's line has taken yet
  double total_bytes_ = 0, total_uplink_ = 0;
  float last_accuracy_ = 0;
  float last_loss_ = 0;
};

}  // namespace cohort::server
