// cohort-sim's per-round records and progress line (report.h).
#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <vector>

#include "cohort/core/error.h"

namespace cohort::sim {

std::string human_duration(double s) {
  char buf[32];
  if (s >= 86400)
    std::snprintf(buf, sizeof buf, "%.1fd", s / 86400);
  else if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%.1fm", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

namespace {

// The sim_round fields written as TensorBoard scalars (metrics.tensorboard_dir/sim).
std::vector<ScalarEvent> sim_round_scalars() {
  return {{.event = "sim_round",
           .step_field = "round",
           .tags = {{"train_loss", "train/loss"},
                    {"test_loss", "test/loss"},
                    {"test_accuracy", "test/accuracy"},
                    {"sim_round_seconds", "round/sim_seconds"},
                    {"wall_round_seconds", "round/wall_seconds"},
                    {"wall_train_seconds", "round/wall_train_seconds"},
                    {"sim_seconds", "sim/seconds"},
                    {"committed", "round/committed"},
                    {"bytes", "bytes/round"},
                    {"total_bytes", "bytes/total"},
                    {"selected", "clients/selected"},
                    {"completed", "clients/completed"},
                    {"stragglers", "clients/stragglers"},
                    {"silent", "clients/silent"},
                    {"secagg_seconds", "secagg/seconds"},
                    {"secagg_bytes", "secagg/bytes"}}}};
}

}  // namespace

Reporter::Reporter(const ReportOptions& options) : metrics_(options.metrics_file) {
  if (!options.tensorboard_dir.empty()) {
    tensorboard_.emplace(options.tensorboard_dir, sim_round_scalars());
    tensorboard_->attach(metrics_);
  }
  progress_ = options.progress;
  tty_ = isatty(fileno(stderr)) != 0;
  const auto& csv = options.csv_file;
  if (!csv.empty()) {
    csv_.open(csv, std::ios::trunc);
    if (!csv_) throw ConfigError("cannot write sim.csv_file " + csv);
    csv_ << "round,round_id,committed,selected,completed,cut,stragglers,silent,train_loss,"
            "test_loss,test_accuracy,bytes,total_bytes,sim_round_seconds,sim_seconds,"
            "wall_round_seconds,wall_train_seconds,wall_seconds\n";
  }
}

void Reporter::write(const RoundRecord& r, double wall) {
  total_bytes_ += r.bytes;
  const double loss = r.samples ? r.loss_sum / static_cast<double>(r.samples) : 0.0;
  std::vector<MetricField> f{{"round", r.seq},
                             {"round_id", r.round_id},
                             {"committed", r.committed},
                             {"selected", std::uint64_t{r.selected}},
                             {"completed", std::uint64_t{r.completed}},
                             {"cut", std::uint64_t{r.cut}},
                             {"stragglers", std::uint64_t{r.stragglers}},
                             {"silent", std::uint64_t{r.silent}},
                             {"train_loss", loss},
                             {"bytes", r.bytes},
                             {"total_bytes", total_bytes_},
                             {"sim_round_seconds", r.sim_round_s},
                             {"sim_seconds", r.sim_total_s}};
  if (r.updates > 0) {
    f.push_back({"local_steps_min", std::uint64_t{r.steps_min}});
    f.push_back({"local_steps_max", std::uint64_t{r.steps_max}});
    f.push_back(
        {"local_steps_mean", static_cast<double>(r.steps_sum) / static_cast<double>(r.updates)});
  }
  if (r.secagg_bytes > 0) {
    f.push_back({"secagg_seconds", r.secagg_s});
    f.push_back({"secagg_bytes", r.secagg_bytes});
  }
  if (r.memory_budgets) {
    f.push_back({"micro_batched", std::uint64_t{r.micro_batched}});
    f.push_back({"recomputed", std::uint64_t{r.recomputed}});
  }
  if (r.evaluated) {
    f.push_back({"test_loss", r.test_loss});
    if (r.has_accuracy) f.push_back({"test_accuracy", r.test_accuracy});
  }
  f.push_back({"wall_round_seconds", r.wall_round_s});
  f.push_back({"wall_train_seconds", r.wall_train_s});
  f.push_back({"wall_train_cpu_seconds", r.wall_train_cpu_s});
  f.push_back({"wall_seconds", wall});
  metrics_.write("sim_round", f);
  if (csv_) {
    char line[512];
    std::snprintf(
        line, sizeof line,
        "%llu,%llu,%d,%zu,%zu,%zu,%zu,%zu,%.9g,%s,%s,%llu,%llu,%.9g,%.9g,%.6f,%.6f,%.6f\n",
        static_cast<unsigned long long>(r.seq), static_cast<unsigned long long>(r.round_id),
        r.committed ? 1 : 0, r.selected, r.completed, r.cut, r.stragglers, r.silent, loss,
        r.evaluated ? std::to_string(r.test_loss).c_str() : "",
        r.evaluated && r.has_accuracy ? std::to_string(r.test_accuracy).c_str() : "",
        static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(total_bytes_),
        r.sim_round_s, r.sim_total_s, r.wall_round_s, r.wall_train_s, wall);
    csv_ << line;
    csv_.flush();
  }
  last_ = r;
  have_last_ = true;
}

void Reporter::write_summary(const Summary& s) {
  const auto stats = [](const std::vector<std::uint32_t>& v) {
    std::uint64_t lo = v.empty() ? 0 : v.front(), hi = 0, sum = 0, zeros = 0;
    for (const auto x : v) {
      lo = std::min<std::uint64_t>(lo, x);
      hi = std::max<std::uint64_t>(hi, x);
      sum += x;
      zeros += x == 0 ? 1 : 0;
    }
    const double mean = v.empty() ? 0.0 : static_cast<double>(sum) / static_cast<double>(v.size());
    return std::tuple{lo, hi, mean, zeros};
  };
  const auto [p_min, p_max, p_mean, p_never] = stats(s.participation);
  const auto [s_min, s_max, s_mean, s_never] = stats(s.selections);
  std::vector<MetricField> f{{"rounds", s.rounds},
                             {"committed", s.committed},
                             {"sim_seconds", s.sim_seconds},
                             {"clients", std::uint64_t{s.participation.size()}},
                             {"participation_min", p_min},
                             {"participation_max", p_max},
                             {"participation_mean", p_mean},
                             {"never_participated", p_never},
                             {"selected_min", s_min},
                             {"selected_max", s_max},
                             {"selected_mean", s_mean},
                             {"never_selected", s_never},
                             {"clients_unfit", std::uint64_t{s.clients_unfit}}};
  if (s.final_accuracy >= 0) {
    f.push_back({"final_accuracy", s.final_accuracy});
    f.push_back({"final_loss", s.final_loss});
  } else if (s.regression) {
    f.push_back({"final_loss", s.final_loss});  // the test MSE
  }
  f.push_back({"wall_seconds", s.wall_seconds});
  metrics_.write("sim_summary", f);
}

bool Reporter::progress_due(bool round_done) const {
  if (!progress_) return false;
  if (round_done) return true;
  return tty_ && seconds_since(last_progress_) >= 0.25;
}

void Reporter::print_progress(const ProgressView& v, bool round_done) {
  last_progress_ = Clock::now();
  std::string line;
  char buf[512];
  if (v.registering) {
    std::snprintf(buf, sizeof buf, "registering %zu/%zu clients | %.0fs", v.registered, v.clients,
                  v.wall_s);
    line = buf;
  } else {
    std::string acc = " | accuracy -", loss = "loss -";
    if (have_last_ && last_.evaluated) {
      // train.loss = mse: the test loss is the MSE, and no accuracy is shown.
      std::snprintf(buf, sizeof buf, " | accuracy %.2f%%", last_.test_accuracy * 100);
      acc = last_.has_accuracy ? buf : "";
      std::snprintf(buf, sizeof buf, last_.has_accuracy ? "loss %.4f" : "mse %.6g",
                    last_.test_loss);
      loss = buf;
    }
    std::snprintf(buf, sizeof buf,
                  "round %llu/%llu | clients %zu/%zu | test %s%s | %s | "
                  "simulated %s | wall %.0fs | ETA %.0fs",
                  static_cast<unsigned long long>(v.round),
                  static_cast<unsigned long long>(v.rounds), v.reported, v.selected, loss.c_str(),
                  acc.c_str(), human_bytes(static_cast<double>(total_bytes_)).c_str(),
                  human_duration(v.sim_s).c_str(), v.wall_s, v.eta_s);
    line = buf;
  }
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    if (round_done) std::fputc('\n', stderr);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void Reporter::finish_progress() {
  if (progress_ && tty_) std::fputc('\n', stderr);
}

}  // namespace cohort::sim
