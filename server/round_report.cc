#include "round_report.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cohort/core/units.h"

namespace cohort::server {

void Line::add(const TaskReport& r) {
  ++reports;
  loss_sum += r.loss_sum;
  samples += r.samples;
  record.bytes += r.bytes;
  record.uplink += r.uplink;
  record.train_s = std::max(record.train_s, r.train_s);
  record.comm_s = std::max(record.comm_s, r.comm_s);
  record.selected = reports;
  record.train_loss = samples ? loss_sum / static_cast<double>(samples) : 0;
}

bool Line::ready(TimePoint now) const {
  return (!waiting || now > eval_deadline) && (reports >= record.clients || now > reports_deadline);
}

RoundReport::RoundReport(const Clock& clock, MetricsSink& metrics, bool buffered,
                         std::uint64_t rounds, double dp_noise, double dp_delta, bool regression)
    : clock_(clock),
      metrics_(metrics),
      buffered_(buffered),
      regression_(regression),
      rounds_(rounds),
      dp_noise_(dp_noise),
      dp_delta_(dp_delta),
      started_(clock.now()) {}

void RoundReport::queue(Line line) {
  if (buffered_) {
    while (line.reports < line.record.clients && !waiting_reports_.empty()) {
      line.add(waiting_reports_.front());
      waiting_reports_.pop_front();
    }
  }
  lines_.push_back(std::move(line));
  flush(clock_.now());
}

void RoundReport::flush(TimePoint now) {
  while (!lines_.empty()) {
    Line& line = lines_.front();
    if (!line.ready(now)) break;
    print(line);
    lines_.pop_front();
  }
}

void RoundReport::add_task_report(const TaskReport& r) {
  auto line = std::find_if(lines_.begin(), lines_.end(),
                           [](const Line& l) { return l.reports < l.record.clients; });
  if (line != lines_.end()) {
    line->add(r);
    flush(clock_.now());
  } else {
    waiting_reports_.push_back(r);
  }
}

void RoundReport::add_evaluation(const transport::ClientReport& r) {
  for (auto& line : lines_) {
    if (line.waiting && line.eval_id == r.round) {
      line.waiting = false;
      line.eval = r;
    }
  }
  flush(clock_.now());
}

void RoundReport::stop_waiting(TimePoint now) {
  for (auto& line : lines_) {
    line.waiting = false;
    line.reports_deadline = now;
  }
  flush(clock_.now());
}

void RoundReport::print(const Line& line) {
  const RoundRecord& r = line.record;
  const auto& eval = line.eval;
  total_bytes_ += r.bytes;
  total_uplink_ += r.uplink;
  const double elapsed = std::chrono::duration<double>(clock_.now() - started_).count();
  const std::uint64_t done = line.committed;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) *
                                    static_cast<double>(rounds_ - std::min(done, rounds_))
                              : 0;
  char line_text[512];
  char dp[48] = "";
  if (r.epsilon >= 0)
    std::snprintf(dp, sizeof dp, " | DP eps %.3g (delta %.0e)", r.epsilon, dp_delta_);
  // train.loss = mse: "test mse X" and no accuracy (a regression has none).
  char test[64];
  if (regression_) {
    std::snprintf(test, sizeof test, "test mse %s",
                  eval ? std::to_string(eval->eval_loss).substr(0, 8).c_str() : "-");
  } else {
    std::snprintf(
        test, sizeof test, "test loss %s | accuracy %s",
        eval ? std::to_string(eval->eval_loss).substr(0, 6).c_str() : "-",
        eval ? (std::to_string(eval->eval_accuracy * 100).substr(0, 5) + "%").c_str() : "-");
  }
  std::snprintf(line_text, sizeof line_text,
                "%s %3llu/%llu | %s %zu/%zu | train loss %.4f | %s | %s (up %s) | %.1fs (train "
                "%.1fs, comm %.1fs)%s | ETA %.0fs",
                buffered_ ? "step " : "round", static_cast<unsigned long long>(done),
                static_cast<unsigned long long>(rounds_), buffered_ ? "updates" : "clients",
                r.clients, r.selected, r.train_loss, test, human_bytes(r.bytes).c_str(),
                human_bytes(r.uplink).c_str(), r.round_s, r.train_s, r.comm_s, dp, eta);
  std::printf("%s\n", line_text);
  std::fflush(stdout);
  std::vector<MetricField> f{{"round", done},
                             {"round_id", line.round_id},
                             {"clients", static_cast<std::uint64_t>(r.clients)},
                             {"selected", static_cast<std::uint64_t>(r.selected)},
                             {"train_loss", r.train_loss},
                             {"bytes", r.bytes},
                             {"total_bytes", total_bytes_},
                             {"uplink_bytes", r.uplink},
                             {"total_uplink_bytes", total_uplink_},
                             {"round_seconds", r.round_s},
                             {"train_seconds", r.train_s},
                             {"comm_seconds", r.comm_s},
                             {"wall_seconds", elapsed}};
  if (eval) {
    f.push_back({"test_loss", static_cast<double>(eval->eval_loss)});
    if (!regression_) f.push_back({"test_accuracy", static_cast<double>(eval->eval_accuracy)});
    f.push_back({"test_count", eval->eval_count});
    last_accuracy_ = eval->eval_accuracy;
    last_loss_ = eval->eval_loss;
  }
  if (r.epsilon >= 0) {
    f.push_back({"dp_epsilon", r.epsilon});
    f.push_back({"dp_delta", dp_delta_});
    f.push_back({"dp_noise_multiplier", dp_noise_});
    f.push_back({"dp_sampling_rate", line.sampling_rate});
  }
  metrics_.write("round", f);
}

std::vector<ScalarEvent> round_scalars() {
  return {{.event = "round",
           .step_field = "round",
           .tags = {{"train_loss", "train/loss"},
                    {"test_loss", "test/loss"},
                    {"test_accuracy", "test/accuracy"},
                    {"round_seconds", "round/seconds"},
                    {"train_seconds", "round/train_seconds"},
                    {"comm_seconds", "round/comm_seconds"},
                    {"bytes", "bytes/round"},
                    {"uplink_bytes", "bytes/uplink"},
                    {"total_bytes", "bytes/total"},
                    {"clients", "clients/updates"},
                    {"selected", "clients/selected"},
                    {"dp_epsilon", "dp/epsilon"}}}};
}

}  // namespace cohort::server
