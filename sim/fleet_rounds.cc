// cohort-sim's fleet (fleet.h), its rounds: planning on the virtual clock, the jobs of the
// selected clients, local training on the thread pool, pushes in client-id order, the reports to
// the coordinator and the round records.
#include <time.h>

#include <algorithm>
#include <cstdio>

#include "cohort/client/local_work.h"
#include "cohort/client/shard_client.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "fleet.h"
#include "measurements.h"

namespace cohort::sim {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

using namespace std::chrono_literals;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;

void Fleet::plan(Collecting col) {
  std::sort(col.clients.begin(), col.clients.end(),
            [](const Member& a, const Member& b) { return a.client < b.client; });
  const std::uint64_t bytes_down = model_bytes(), bytes_up = bytes_down;  // dense fp32 both ways
  std::vector<Selected> sel(col.clients.size());
  std::vector<ClientTime> times(col.clients.size());
  std::vector<DeviceProfile> profiles(col.clients.size());
  std::vector<std::size_t> steps(col.clients.size());
  std::vector<std::uint64_t> samples(col.clients.size());
  for (std::size_t i = 0; i < col.clients.size(); ++i) {
    const std::uint32_t c = col.clients[i].client;
    COHORT_CHECK(memory_.fits(c)) << name_of(c) << " cannot train: it never registered";
    const DeviceProfile p = profiles[i] = profile(c);
    // The work the coordinator asked this client for: its compute time follows it.
    steps[i] = col.clients[i].local_steps > 0 ? col.clients[i].local_steps : options_.steps;
    samples[i] = samples_per_round(rows_.size(c), options_.batch_size, options_.epochs, steps[i],
                                   options_.drop_last);
    // Under a memory budget its training runs in micro-batches: slower by the plan's factor.
    times[i] = client_time(p, {.bytes_down = bytes_down,
                               .bytes_up = bytes_up,
                               .flops = training_flops(model_size_, samples[i]),
                               .slowdown = memory_.slowdown(c)});
    sel[i].finish_s = times[i].total();
    sel[i].silent =
        !is_online(p, sim_.seed, c, col.round, sim_now_) || drops_out(p, sim_.seed, c, col.round);
    ++summary_.selections[c];
  }
  const RoundPlan plan =
      plan_round(sel, sim_.server.clients_per_round, sim_.server.round_deadline_s);
  active_.emplace();
  Active& a = *active_;
  a.round = col.round;
  a.rs = col.rs;
  a.wall_start = Clock::now();
  if (summary_.rounds == 0) {
    first_round_wall_ = a.wall_start;
    summary_.setup_seconds = std::chrono::duration<double>(a.wall_start - started_).count();
  }
  auto& rec = a.record;
  rec.seq = ++summary_.rounds;
  rec.round_id = col.round;
  rec.selected = col.clients.size();
  rec.completed = plan.completes;
  rec.committed = plan.completes >= sim_.server.min_updates;
  rec.sim_round_s = plan.close_s;
  sim_now_ += plan.close_s;
  rec.sim_total_s = sim_now_;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 0; i < col.clients.size(); ++i) {
      const Fate f = plan.fate[i];
      if ((pass == 0) != (f == Fate::kCompletes)) continue;
      if (f == Fate::kCut) ++rec.cut;
      if (f == Fate::kStraggler) ++rec.stragglers;
      if (f == Fate::kSilent) {
        ++rec.silent;
        continue;
      }
      // Bytes are counted from the plan (what the protocol moves for this client), so a record
      // does not depend on how far late clients got when training ended; bytes_measured counts
      // what really moved.
      rec.bytes += bytes_down + (f == Fate::kCompletes ? bytes_up : 0);
      auto job = std::make_unique<Job>();
      job->kind = f == Fate::kCompletes ? Job::Kind::kTrain : Job::Kind::kPullOnly;
      job->client = col.clients[i].client;
      job->rs = col.rs;
      job->rs.local_steps = col.clients[i].local_steps;
      job->fate = f;
      job->profile = profiles[i];
      job->time = times[i];
      job->steps = steps[i];
      job->samples = samples[i];
      a.jobs.push_back(std::move(job));
    }
  }
  a.completers = plan.completes;
  flush_records(false);  // the previous round asked for no evaluation if none is pending
}

void Fleet::advance() {
  if (!active_) {
    if (!collecting_.empty()) check_stalled_collection();
    if (!active_) return;
  }
  Active& a = *active_;
  // Completers first; the others only once every completer has reported (they would report
  // after the round closed).
  while (a.next_start < a.jobs.size() && in_flight_ < window_) {
    if (a.next_start >= a.completers && !completers_reported(a)) break;
    start_job(*a.jobs[a.next_start++]);
  }
  secagg_prepare_inputs(a);
  while (a.next_push < a.completers && a.jobs[a.next_push]->trained &&
         secagg_ready(*a.jobs[a.next_push]))
    push(*a.jobs[a.next_push++]);
  if (a.next_start == a.jobs.size() &&
      std::all_of(a.jobs.begin(), a.jobs.end(), [](const auto& j) { return j->done; })) {
    close_active();
  }
}

bool Fleet::completers_reported(const Active& a) {
  for (std::size_t i = 0; i < a.completers; ++i)
    if (!a.jobs[i]->done) return false;
  return true;
}

std::shared_ptr<FloatBuffer> Fleet::take_delta() {
  FloatBuffer b;
  {
    std::lock_guard lock(spare_->mu);
    if (!spare_->buffers.empty()) {
      b = std::move(spare_->buffers.back());
      spare_->buffers.pop_back();
    }
  }
  if (b.size() != model_size_) b = FloatBuffer(model_size_);
  auto* raw = new FloatBuffer(std::move(b));
  return std::shared_ptr<FloatBuffer>(raw, [spare = spare_](FloatBuffer* p) {
    {
      std::lock_guard lock(spare->mu);
      if (spare->buffers.size() < 256) spare->buffers.push_back(std::move(*p));
    }
    delete p;
  });
}

void Fleet::start_job(Job& job) {
  ++in_flight_;
  job.start_seq = ++starts_;
  job.pulls_pending = 1;
  request_model(job);
}

void Fleet::on_pulled(Job& job) {
  job.pulled = true;
  if (job.kind == Job::Kind::kPullOnly) {
    transport::ClientReport r = base_report(job);
    char why[160];
    if (job.fate == Fate::kStraggler) {
      std::snprintf(why, sizeof why,
                    "could not push before the deadline (simulated finish %.1f s > %.1f s)",
                    job.time.total(), sim_.server.round_deadline_s);
    } else {
      std::snprintf(why, sizeof why,
                    "the round closed before this update (simulated finish %.1f s)",
                    job.time.total());
    }
    r.message = why;
    // It measured its device all the same: the coordinator learns how slow it is.
    add_measurements(job, false, r);
    send_report(job, r);
    complete(job);
    return;
  }
  submit(job);
}

void Fleet::submit(Job& job) {
  ++training_;
  if (job.kind != Job::Kind::kEvaluate) job.delta = take_delta();
  Job* j = &job;
  pool_.submit([this, j] {
    Result res{j, nullptr};
    try {
      Slot* slot = acquire_slot();
      struct Release {
        Fleet* f;
        Slot* s;
        ~Release() { f->release_slot(s); }
      } release{this, slot};
      const FloatBuffer& model = *j->model;
      // The client's memory plan, on whichever slot trains (or evaluates) it: 0 is whole batches.
      slot->net->set_micro_batch(memory_.micro_batch(j->client));
      slot->net->set_recompute(memory_.recompute(j->client));
      j->micro_batch = slot->net->micro_batch();
      auto params = slot->net->parameters();
      std::copy(model.begin(), model.end(), params.begin());
      const auto t0 = Clock::now();
      const double cpu0 = thread_cpu_seconds();
      if (j->kind == Job::Kind::kEvaluate) {
        j->eval = slot->trainer->evaluate(test_);
      } else {
        const auto seed = sim_.data.seed * 1000003ULL + j->rs.model_version * 7919ULL + j->client;
        // The job's step count (0: train.epochs) goes to this call; the slot's trainer stays.
        j->result = slot->rule->train({.data = train_,
                                       .rows = rows_.rows(j->client, j->rows),
                                       .seed = seed,
                                       .steps = j->steps,
                                       .round = j->rs.round});
        const auto trained = slot->net->parameters();
        FloatBuffer& delta = *j->delta;
        for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = trained[i] - model[i];
      }
      j->wall_train_s = seconds_since(t0);
      j->train_cpu_s = thread_cpu_seconds() - cpu0;
    } catch (...) {
      res.error = std::current_exception();
    }
    std::lock_guard lock(results_mu_);
    results_.push_back(res);
  });
}

Slot* Fleet::acquire_slot() {
  std::unique_lock lock(slots_mu_);
  slots_cv_.wait(lock, [&] { return !free_slots_.empty(); });
  Slot* s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void Fleet::release_slot(Slot* s) {
  {
    std::lock_guard lock(slots_mu_);
    free_slots_.push_back(s);
  }
  slots_cv_.notify_one();
}

void Fleet::collect_results() {
  std::vector<Result> done;
  {
    std::lock_guard lock(results_mu_);
    done.swap(results_);
  }
  for (auto& r : done) {
    --training_;
    if (r.error) std::rethrow_exception(r.error);
    Job& job = *r.job;
    if (job.kind == Job::Kind::kEvaluate) {
      on_evaluated(job);
    } else {
      job.trained = true;
    }
  }
}

void Fleet::push(Job& job) {
  auto bytes = std::as_bytes(job.delta->span());
  std::shared_ptr<const void> owner = job.delta;
  if (job.rs.secure_aggregation) {
    auto masked = secagg_mask(job);
    bytes = std::as_bytes(std::span<const std::uint32_t>(*masked));
    owner = std::move(masked);
  }
  job.acks_pending = shards_.size();
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    const auto& s = shards_[i];
    auto e = client::push_request(
        s, client::PushFields{.round = job.rs.round,
                              .num_samples = rows_.size(job.client),
                              .base_version = job.rs.model_version,
                              .train_loss = static_cast<float>(job.result.mean_loss)});
    std::get<transport::Push>(e.body).local_work =
        static_cast<float>(client::fednova_local_work(options_, job.result.steps));
    if (job.rs.secure_aggregation)
      std::get<transport::Push>(e.body).encoding = transport::Encoding::kMaskedU32;
    const auto slice = bytes.subspan(s.begin * sizeof(float), (s.end - s.begin) * sizeof(float));
    job.bytes_up += slice.size();
    // Zero copy: ZeroMQ holds the delta until the shard has folded it in.
    send(i, job.client, std::move(e), transport::Payload{slice, owner});
  }
  job.pushed = true;
  job.delta.reset();
  job.model.reset();
}

transport::ClientReport Fleet::base_report(const Job& job) const {
  transport::ClientReport r;
  r.round = job.rs.round;
  r.model_version = job.rs.model_version;
  r.bytes_sent = job.bytes_up;
  r.bytes_received = job.bytes_down;
  r.comm_seconds = static_cast<float>(job.time.download_s + job.time.upload_s);
  return r;
}

void Fleet::add_measurements(const Job& job, bool pushed, transport::ClientReport& r) const {
  r.samples_per_second = static_cast<float>(virtual_samples_per_second(
      job.profile, model_size_, job.samples, memory_.slowdown(job.client)));
  std::vector<ShardBytes> shards(shards_.size());
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    const std::uint64_t bytes = (shards_[i].end - shards_[i].begin) * sizeof(float);
    shards[i] = {.shard = i, .down = bytes, .up = pushed ? bytes : 0};
  }
  r.links = virtual_links(job.profile, shards);
}

void Fleet::send_report(const Job& job, const transport::ClientReport& r) {
  const bool wait = !r.evaluated && std::any_of(evals_.begin(), evals_.end(), [&](const auto& j) {
    return j->rs.round < r.round;
  });
  if (wait || (!r.evaluated && !held_reports_.empty())) {
    held_reports_.emplace_back(job.client, r);
    return;
  }
  Envelope e;
  e.round = r.round;
  e.body = r;
  send(0, job.client, std::move(e));
}

void Fleet::release_reports() {
  while (!held_reports_.empty()) {
    const auto& [client, r] = held_reports_.front();
    if (std::any_of(evals_.begin(), evals_.end(),
                    [&](const auto& j) { return j->rs.round < r.round; }))
      return;
    Envelope e;
    e.round = r.round;
    e.body = r;
    send(0, client, std::move(e));
    held_reports_.pop_front();
  }
}

void Fleet::finish_training_job(Job& job) {
  transport::ClientReport r = base_report(job);
  r.trained = job.refusals.empty();
  if (!job.refusals.empty()) r.message = "a shard refused the update: " + job.refusals.front();
  r.num_samples = rows_.size(job.client);
  r.train_loss = static_cast<float>(job.result.mean_loss);
  r.train_seconds = static_cast<float>(job.time.compute_s);
  r.local_steps = static_cast<std::uint32_t>(job.result.steps);
  add_measurements(job, true, r);
  if (job.result.samples != job.samples && options_.rule != "stock") {
    throw DataError("cohort-sim: train.rule '" + options_.rule + "' trained " +
                    std::to_string(job.result.samples) + " samples for " + name_of(job.client) +
                    " where the virtual clock charged " + std::to_string(job.samples) +
                    " (train.epochs or train.steps x train.batch_size): a rule must process what "
                    "train.* configures for the clock to time it");
  }
  if (job.result.samples != job.samples) {
    // The virtual clock charged other work than the trainer did: its times would be wrong.
    throw InternalError("cohort-sim: " + name_of(job.client) + " trained " +
                        std::to_string(job.result.samples) +
                        " samples, the virtual clock charged " + std::to_string(job.samples));
  }
  send_report(job, r);
  auto& rec = active_->record;
  if (r.trained) {
    ++summary_.participation[job.client];
    rec.steps_min = rec.updates == 0 ? job.result.steps : std::min(rec.steps_min, job.result.steps);
    rec.steps_max = std::max(rec.steps_max, job.result.steps);
    rec.steps_sum += job.result.steps;
    ++rec.updates;
    if (job.micro_batch > 0) ++rec.micro_batched;
    if (memory_.recompute(job.client)) ++rec.recomputed;
  }
  rec.loss_sum += job.result.mean_loss * static_cast<double>(r.num_samples);
  rec.samples += r.num_samples;
  rec.wall_train_s += job.wall_train_s;
  rec.wall_train_cpu_s += job.train_cpu_s;
  summary_.train_wall_seconds += job.wall_train_s;
  summary_.train_cpu_seconds += job.train_cpu_s;
  if (!job.refusals.empty()) {
    COHORT_LOG(Warn) << name_of(job.client) << ": " << r.message;
  }
  complete(job);
}

void Fleet::complete(Job& job) {
  job.done = true;
  --in_flight_;
  job.model.reset();
  job.delta.reset();
  if (job.kind != Job::Kind::kEvaluate) summary_.bytes_measured += job.bytes_down + job.bytes_up;
}

void Fleet::close_active() {
  Active& a = *active_;
  if (a.rs.secure_aggregation) {
    // The protocol's stages lengthen the round on the virtual clock.
    const double s = secagg_charge(a, a.record);
    a.record.sim_round_s += s;
    sim_now_ += s;
    a.record.sim_total_s = sim_now_;
  }
  a.record.wall_round_s = seconds_since(a.wall_start);
  a.record.memory_budgets = memory_.has_budgets();
  summary_.round_wall_seconds = seconds_since(first_round_wall_);
  summary_.sim_seconds = sim_now_;
  if (a.record.committed) ++summary_.committed;
  summary_.bytes += a.record.bytes;
  records_[a.round] = a.record;
  active_.reset();
  // A round's line waits for its evaluation, if one was asked for.
  flush_records(false);
}

void Fleet::on_evaluated(Job& job) {
  transport::ClientReport r = base_report(job);
  r.comm_seconds = 0;
  r.evaluated = true;
  r.eval_loss = static_cast<float>(job.eval.loss);
  r.eval_accuracy = job.eval.has_accuracy ? static_cast<float>(job.eval.accuracy) : 0.0f;
  r.eval_count = job.eval.count;
  send_report(job, r);
  --in_flight_;
  job.model.reset();
  job.delta.reset();
  evaluated_[job.rs.round] = job.eval;
  summary_.eval_cpu_seconds += job.train_cpu_s;
  // train.loss = mse: the loss is the test MSE, and there is no accuracy.
  summary_.final_accuracy = job.eval.has_accuracy ? job.eval.accuracy : -1.0;
  summary_.final_loss = job.eval.loss;
  summary_.regression = !job.eval.has_accuracy;
  evals_.erase(
      std::remove_if(evals_.begin(), evals_.end(), [&](const auto& j) { return j.get() == &job; }),
      evals_.end());
  release_reports();
  flush_records(false);
}

void Fleet::flush_records(bool all) {
  while (!records_.empty()) {
    auto it = records_.begin();
    RoundRecord& rec = it->second;
    const auto ev = evaluated_.find(it->first);
    const bool eval_pending = std::any_of(evals_.begin(), evals_.end(),
                                          [&](const auto& j) { return j->rs.round == it->first; });
    const bool later_started = active_ || !collecting_.empty();
    if (ev == evaluated_.end() && !all && (eval_pending || !later_started)) return;
    if (ev != evaluated_.end()) {
      rec.evaluated = true;
      rec.test_loss = ev->second.loss;
      rec.test_accuracy = ev->second.accuracy;
      rec.has_accuracy = ev->second.has_accuracy;
      evaluated_.erase(ev);
    }
    write_record(rec);
    records_.erase(it);
  }
}

void Fleet::write_record(const RoundRecord& r) {
  reporter_.write(r, seconds_since(started_));
  progress_line(true);
}

void Fleet::progress_line(bool round_done) {
  if (!reporter_.progress_due(round_done)) return;
  ProgressView v;
  v.wall_s = seconds_since(started_);
  if (!all_registered()) {
    v.registering = true;
    v.registered = 0;  // the population registers at once, at its first Welcome
    v.clients = registrants_;
  } else {
    const std::uint64_t done = summary_.committed;
    v.eta_s = done > 0
                  ? seconds_since(first_round_wall_) / static_cast<double>(done) *
                        static_cast<double>(sim_.server.rounds - std::min(done, sim_.server.rounds))
                  : 0.0;
    v.round = summary_.rounds;
    v.rounds = sim_.server.rounds;
    if (active_ && !round_done) {
      for (const auto& j : active_->jobs) v.reported += j->done ? 1 : 0;
      v.selected = active_->record.selected;
    } else if (const RoundRecord* last = reporter_.last()) {
      v.reported = last->completed;
      v.selected = last->selected;
      v.round = last->seq;
    }
    v.sim_s = sim_now_;
  }
  reporter_.print_progress(v, round_done);
}

}  // namespace cohort::sim
