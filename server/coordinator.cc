#include "coordinator.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/network.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;

std::uint64_t rounds_of(const Config& config, Modes modes) {
  // Data-parallel training is one long task per worker.
  if (modes.mode == transport::TrainingMode::kDataParallel) return 1;
  return static_cast<std::uint64_t>(config.get_int("server.rounds"));
}

// A [train] value as TOML: strings quoted, numbers and bools bare.
std::string to_string_value(const ConfigSection& s, const std::string& name) {
  const std::string text = s.get_string(name, "");
  try {
    (void)s.get_bool(name, false);
    return text;
  } catch (const ConfigError&) {
  }
  try {
    (void)s.get_double(name, 0);
    return text;
  } catch (const ConfigError&) {
  }
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

Coordinator::Coordinator(const Config& config, Modes modes, Shard& local, Outbox& out,
                         const Clock& clock, const NodeId& name, const std::string& url,
                         MetricsSink& metrics)
    : config_(config), modes_(modes), local_(local), out_(out), clock_(clock), metrics_(metrics),
      rng_(static_cast<std::uint64_t>(config.get_int("server.seed"))),
      report_(clock, metrics, modes.mode == transport::TrainingMode::kBuffered,
              rounds_of(config, modes), config.get_double("dp.noise_multiplier"),
              config.get_double("dp.delta")) {
  shards_.resize(static_cast<std::size_t>(config.get_int("server.shards")));
  shards_[0] = {.up = true, .url = url, .node_id = name, .closed = true};
  rounds_ = rounds_of(config, modes);
  per_round_ = static_cast<std::size_t>(config.get_int("server.clients_per_round"));
  min_clients_ = static_cast<std::size_t>(config.get_int("server.min_clients"));
  min_updates_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.min_updates")));
  max_failed_rounds_ =
      static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.get_int("server.max_failed_rounds")));
  deadline_ = std::chrono::milliseconds(config.get_int("server.round_deadline_ms"));
  eval_every_ = static_cast<std::uint64_t>(std::max<std::int64_t>(0, config.get_int("server.eval_every")));
  overselect_ = config.get_double("server.overselect");
  weighted_ = config.get_string("server.selection") == "weighted";
  model_spec_ = config.get_string("model.spec");
  model_size_ = kernels::make_network_spec(model_spec_).parameter_count();
  round_ = local.last_closed();
  committed_ = local.version();
  started_ = clock_.now();
  dp_noise_ = config.get_double("dp.noise_multiplier");
  dp_delta_ = config.get_double("dp.delta");
  buffer_k_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.buffer_size")));
  concurrency_ = static_cast<std::size_t>(std::max<std::int64_t>(1, config.get_int("server.concurrency")));
  rule_min_ = local.rule_min_updates();
  // A fresh epoch per coordinator process: shards tell a restart from a reconnect by it.
  std::random_device rd;
  epoch_ = ((std::uint64_t{rd()} << 32) ^ rd()) | 1;
}

bool Coordinator::handle(Message& m) {
  if (auto* r = std::get_if<transport::Register>(&m.envelope.body)) {
    on_register(m, *r);
    return true;
  }
  if (auto* r = std::get_if<transport::ClientReport>(&m.envelope.body)) {
    touch(m);
    on_report(m, *r);
    return true;
  }
  if (auto* a = std::get_if<transport::PushAck>(&m.envelope.body)) {
    on_shard_ack(m, *a);
    return true;
  }
  if (std::holds_alternative<transport::Heartbeat>(m.envelope.body)) {
    touch(m);
    return true;
  }
  if (std::holds_alternative<transport::Bye>(m.envelope.body)) {
    clients_.erase(m.sender);
    return true;
  }
  return false;
}

void Coordinator::tick() {
  const auto now = clock_.now();
  if (finished_) return;
  if (state_ == State::kPreparing && now >= close_retry_) resend_prepare();
  if (state_ == State::kClosing && now >= close_retry_) resend_close();
  report_.flush(now);
  switch (modes_.mode) {
    case transport::TrainingMode::kDataParallel: tick_dataparallel(now); return;
    case transport::TrainingMode::kBuffered: tick_fedbuff(now); return;
    case transport::TrainingMode::kFederated: break;
  }
  if (tick_federated(now)) sweep_clients(now);
}

bool Coordinator::tick_federated(TimePoint now) {
  // Two passes: a round that closes here (every shard acknowledged at once: a single shard)
  // leaves the coordinator idle, and the next round starts now, not at the next message or
  // poll timeout (50 ms of nothing between rounds otherwise).
  for (int pass = 0; pass < 2; ++pass) {
    if (state_ == State::kIdle && all_shards_up() && committed_ >= rounds_) {
      finish();
      return false;
    }
    if (state_ == State::kIdle && all_shards_up() && live_clients() >= min_clients_) start_round();
    if (state_ != State::kRunning) break;
    const std::size_t done = completed_.size();
    const bool enough = done >= per_round_;
    const bool all_reported = reported_ >= selected_.size();
    if (!(enough || all_reported || now >= round_deadline_)) break;
    if (done < min_updates_ || done < rule_min_) {
      const bool rule = done >= min_updates_;
      round_failed(std::to_string(done) + " complete update(s), fewer than " +
                   (rule ? "aggregator '" + local_.rule_name() + "' needs (" + std::to_string(rule_min_) + ")"
                         : "server.min_updates = " + std::to_string(min_updates_)));
      if (finished_) return false;
      close_round(false);
    } else {
      // Phase one: every shard's rule computes its aggregate; the round commits only if all could.
      prepare_close(round_, done);
    }
    if (state_ != State::kIdle) break;
  }
  return true;
}

// Clients silent for too long leave the pool (their reconnect re-registers them). The sweep
// walks every client, so it runs at most every 100 ms, not after every message.
void Coordinator::sweep_clients(TimePoint now) {
  const auto timeout = std::chrono::milliseconds(config_.get_int("server.client_timeout_ms"));
  if (now < next_sweep_) return;
  next_sweep_ = now + 100ms;
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (now - it->second.last_seen > timeout && !selected_.contains(it->first)) {
      COHORT_LOG(Info) << "client " << it->first << " timed out";
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::touch(const Message& m) {
  auto it = clients_.find(m.sender);
  if (it != clients_.end()) {
    it->second.last_seen = clock_.now();
    it->second.peer = m.peer;
    it->second.reachable = true;
  }
}

bool Coordinator::all_shards_up() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const ShardInfo& s) { return s.up; });
}

std::size_t Coordinator::live_clients() const {
  return static_cast<std::size_t>(std::count_if(clients_.begin(), clients_.end(),
                                                [](const auto& c) { return c.second.reachable; }));
}

transport::Welcome Coordinator::welcome(std::uint32_t index) const {
  transport::Welcome w;
  w.client_index = index;
  w.model_size = model_size_;
  w.model_spec = model_spec_;
  w.heartbeat_ms = static_cast<std::uint32_t>(config_.get_int("server.heartbeat_ms"));
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    auto [b, e] = shard_range(model_size_, static_cast<std::uint32_t>(shards_.size()), i);
    w.shards.push_back({i, shards_[i].url, shards_[i].node_id, b, e});
  }
  // Client-side training options travel as TOML, from the server's [train] section.
  std::ostringstream toml;
  for (const auto& name : config_.section("train").names()) {
    toml << name << " = " << to_string_value(config_.section("train"), name) << '\n';
  }
  w.training_toml = toml.str();
  w.coordinator_epoch = epoch_;
  w.current_round = committed_round();
  return w;
}

void Coordinator::on_register(const Message& m, const transport::Register& r) {
  if (r.role == transport::Role::kShard) {
    if (r.shard_index == 0 || r.shard_index >= shards_.size()) {
      reply_error(m, "no shard " + std::to_string(r.shard_index) + " in a federation of " +
                         std::to_string(shards_.size()));
      return;
    }
    auto& s = shards_[r.shard_index];
    const bool again = s.up;
    s = {.up = true, .peer = m.peer, .url = r.listen_url, .node_id = m.sender, .closed = false};
    COHORT_LOG(Info) << (again ? "shard re-registered: " : "shard registered: ") << m.sender
                     << " at " << r.listen_url;
    Envelope e;
    e.body = welcome(r.shard_index);
    out_.send(m.peer, std::move(e));
    // A shard that restarted mid-round learns the running round's selection again.
    if (state_ == State::kRunning && federated()) send_round_open(r.shard_index);
    if (state_ == State::kPreparing) resend_prepare();
    if (state_ == State::kClosing) resend_close();
    return;
  }
  if (r.role != transport::Role::kClient) {
    reply_error(m, "only clients and shards may register");
    return;
  }
  if (!all_shards_up()) {
    // Not yet: the client retries its registration until the shard map is complete.
    reply_error(m, "waiting for all shards to start");
    return;
  }
  auto [it, fresh] = clients_.try_emplace(m.sender);
  it->second.peer = m.peer;
  it->second.dataset_size = r.dataset_size;
  it->second.last_seen = clock_.now();
  it->second.reachable = true;
  if (fresh) it->second.index = next_client_index_++;
  COHORT_LOG(Info) << "client " << (fresh ? "registered: " : "re-registered: ") << m.sender
                   << " (" << r.dataset_size << " samples, " << r.device << ", " << clients_.size()
                   << " clients)";
  Envelope e;
  e.body = welcome(it->second.index);
  out_.send(m.peer, std::move(e));
}

// Tells shard i (0: our own) who was selected for the running round, in batches of
// kRoundOpenBatch ids.
void Coordinator::send_round_open(std::size_t i) {
  if (i == 0) {
    local_.open_round(round_, round_selection_);
    return;
  }
  auto& s = shards_[i];
  std::size_t at = 0;
  do {
    const std::size_t end = std::min(round_selection_.size(), at + transport::kRoundOpenBatch);
    Envelope e;
    e.round = round_;
    e.body = transport::RoundOpen{
        .round = round_,
        .clients = {round_selection_.begin() + static_cast<std::ptrdiff_t>(at),
                    round_selection_.begin() + static_cast<std::ptrdiff_t>(end)}};
    if (!s.up || !out_.send(s.peer, std::move(e))) {
      s.up = false;
      return;
    }
    at = end;
  } while (at < round_selection_.size());
}

void Coordinator::reply_error(const Message& m, std::string why) {
  Envelope e;
  e.body = transport::ErrorBody{.code = transport::ErrorCode::kUnknownNode, .message = std::move(why),
                                .ref_seq = m.envelope.seq};
  out_.send(m.peer, std::move(e));
}

std::vector<NodeId> Coordinator::select() {
  std::vector<NodeId> pool;
  std::vector<double> weights;
  for (const auto& [id, c] : clients_) {
    if (!c.reachable) continue;
    pool.push_back(id);
    weights.push_back(static_cast<double>(std::max<std::uint64_t>(c.dataset_size, 1)));
  }
  std::size_t want = static_cast<std::size_t>(std::ceil(static_cast<double>(per_round_) * overselect_));
  want = std::min(std::max<std::size_t>(want, 1), pool.size());
  std::vector<NodeId> out;
  // Sampling without replacement; weighted by data size when asked.
  for (std::size_t k = 0; k < want; ++k) {
    std::size_t pick = 0;
    if (weighted_) {
      std::discrete_distribution<std::size_t> d(weights.begin(), weights.end());
      pick = d(rng_);
    } else {
      pick = std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(rng_);
    }
    out.push_back(pool[pick]);
    pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(pick));
    weights.erase(weights.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Coordinator::start_round() {
  ++round_;
  selected_.clear();
  completed_.clear();
  reported_ = 0;
  reporters_.clear();
  round_loss_ = 0;
  round_samples_ = 0;
  round_bytes_ = 0;
  round_uplink_ = 0;
  round_train_s_ = 0;
  round_comm_s_ = 0;
  round_started_ = clock_.now();
  round_deadline_ = round_started_ + deadline_;
  const auto chosen = select();
  // The accountant's rate q: a fixed-size cohort of m of N clients, accounted as Poisson
  // sampling with q = m / N (exact when q = 1; see dp.noise_multiplier's help).
  const std::size_t live = live_clients();
  round_sampling_rate_ = live == 0 ? 1.0 : static_cast<double>(chosen.size()) / static_cast<double>(live);
  const transport::RoundStart rs{
      .round = round_,
      .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
      .local_epochs = static_cast<std::uint32_t>(config_.section("train").get_int("epochs", 1)),
      .local_steps = static_cast<std::uint32_t>(config_.section("train").get_int("steps", 0)),
      .model_version = local_.version()};
  // Every shard learns the selection before any client does: a shard takes this round's pushes
  // only from these clients.
  round_selection_ = chosen;
  for (std::size_t i = 0; i < shards_.size(); ++i) send_round_open(i);
  for (const auto& id : chosen) {
    Envelope e;
    e.round = round_;
    e.body = rs;
    auto& c = clients_.at(id);
    if (out_.send(c.peer, std::move(e))) {
      selected_.insert(id);
    } else {
      c.reachable = false;
      COHORT_LOG(Info) << "client " << id << " is unreachable (its connection is gone): out of the "
                       << "pool until it registers again";
    }
  }
  state_ = State::kRunning;
  COHORT_LOG(Debug) << "round " << round_ << " started with " << selected_.size() << " clients";
}

}  // namespace cohort::server

namespace cohort::server {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;

// ---- data-parallel: one long task per worker; the shards enforce the consistency model ----
void Coordinator::tick_dataparallel(TimePoint now) {
  if (state_ == State::kIdle && !dp_started_ && all_shards_up() && live_clients() >= min_clients_) {
    dp_started_ = true;
    round_ = 1;
    round_started_ = now;
    round_deadline_ = now + deadline_;
    const transport::RoundStart rs{
        .round = round_,
        .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
        .local_steps = static_cast<std::uint32_t>(config_.get_int("server.steps")),
        .mode = transport::TrainingMode::kDataParallel,
        .batch_size = static_cast<std::uint32_t>(config_.section("train").get_int("batch_size", 64))};
    std::size_t n = 0;
    for (const auto& [id, c] : clients_) {  // the first `clients_per_round` workers by name
      if (n++ >= per_round_) break;
      Envelope e;
      e.round = round_;
      e.body = rs;
      if (out_.send(c.peer, std::move(e))) selected_.insert(id);
    }
    state_ = State::kRunning;
    COHORT_LOG(Info) << "data-parallel training (" << consistency_name(modes_.consistency)
                     << ") started with " << selected_.size() << " workers";
  }
  if (state_ == State::kRunning && (reported_ >= selected_.size() || now >= round_deadline_)) {
    committed_ = rounds_;
    state_ = State::kIdle;
    last_round_s_ = std::chrono::duration<double>(now - round_started_).count();
    queue_line(round_, current_record());
  }
  if (state_ == State::kIdle && dp_started_) finish();
}

// ---- FedBuff: keep `concurrency` clients busy; every K updates all shards step together ----
//
// A shard buffers the updates it accepts; the coordinator counts them on its own shard and, at
// K, closes a step in two phases like a round: every shard sets its buffer aside (prepare),
// then all apply it (commit), or, if one shard holds nothing, all put it back (abort). Tasks
// are issued while no step is closing, so a task pulls a model every shard agrees on, and only
// as many as the remaining steps still need: K x steps left, less what is buffered and in
// flight. The count comes from the shard itself, never from reports, which may arrive after
// the step that took their update.
void Coordinator::tick_fedbuff(TimePoint now) {
  if (!all_shards_up()) return;
  if (!fb_started_) {
    if (live_clients() < min_clients_) return;
    fb_started_ = true;
    round_started_ = now;
  }
  for (auto it = busy_.begin(); it != busy_.end();) {  // a task past its deadline is given up
    it = now > it->second ? busy_.erase(it) : std::next(it);
  }
  if (state_ != State::kIdle) return;
  if (committed_ >= rounds_) {
    finish();
    return;
  }
  const std::size_t want = static_cast<std::size_t>(rounds_ - committed_) * buffer_k_;
  // Starved: a step was not ready (another shard holds fewer updates than this one, which
  // took fewer into the last step) and nothing is in flight to fill it: one more task.
  const bool starved = fb_short_ && busy_.empty();
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (busy_.size() >= concurrency_) break;
    if (starved ? !busy_.empty() : local_.buffered() + busy_.size() >= want) break;
    if (busy_.contains(it->first) || !it->second.reachable) continue;
    const transport::RoundStart rs{
        .round = ++round_,
        .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
        .local_epochs = static_cast<std::uint32_t>(config_.section("train").get_int("epochs", 1)),
        .local_steps = static_cast<std::uint32_t>(config_.section("train").get_int("steps", 0)),
        .model_version = local_.version(),
        .mode = transport::TrainingMode::kBuffered};
    Envelope e;
    e.round = rs.round;
    e.body = rs;
    if (out_.send(it->second.peer, std::move(e))) {
      busy_[it->first] = now + deadline_;
    } else {
      it->second.reachable = false;
    }
  }
  if (local_.buffered() >= buffer_k_ && now >= fb_retry_) prepare_close(committed_ + 1, 0);
}

void Coordinator::on_report(const Message& m, const transport::ClientReport& r) {
  if (r.fatal) {
    on_fatal_report(m, r);
    return;
  }
  if (buffered() && !r.evaluated) {
    on_task_report(m, r);
    return;
  }
  if (r.evaluated) {
    report_.add_evaluation(r);
    return;
  }
  if (state_ != State::kRunning || r.round != round_ || !selected_.contains(m.sender)) return;
  // A client resends its report after a reconnect, not knowing whether it arrived: count once.
  if (!reporters_.insert(m.sender).second) return;
  ++reported_;
  round_bytes_ += static_cast<double>(r.bytes_sent + r.bytes_received);
  round_uplink_ += static_cast<double>(r.bytes_sent);
  if (!r.trained) {
    COHORT_LOG(Info) << "client " << m.sender << " did not finish round " << r.round << ": "
                     << r.message;
    last_refusal_ = m.sender + ": " + r.message.substr(0, 200);
    return;
  }
  completed_.insert(m.sender);
  round_loss_ += static_cast<double>(r.train_loss) * static_cast<double>(r.num_samples);
  round_samples_ += r.num_samples;
  round_train_s_ = std::max(round_train_s_, static_cast<double>(r.train_seconds));
  round_comm_s_ = std::max(round_comm_s_, static_cast<double>(r.comm_seconds));
}

// The client stops for good: say who and why now, not after deadlines run out.
void Coordinator::on_fatal_report(const Message& m, const transport::ClientReport& r) {
  COHORT_LOG(Error) << "client " << m.sender << " stopped with an error: " << r.message;
  last_refusal_ = m.sender + " stopped: " + r.message.substr(0, 200);
  if (state_ == State::kRunning && federated() && r.round == round_ &&
      selected_.contains(m.sender) && reporters_.insert(m.sender).second) {
    ++reported_;
  }
  busy_.erase(m.sender);
  clients_.erase(m.sender);
}

// A FedBuff task's report. It may arrive after the step that averaged its update: it goes to
// the oldest committed step still short of reports, else it waits for the next step.
void Coordinator::on_task_report(const Message& m, const transport::ClientReport& r) {
  busy_.erase(m.sender);
  if (!r.trained) {
    COHORT_LOG(Info) << "client " << m.sender << ": " << r.message;
    last_refusal_ = m.sender + ": " + r.message.substr(0, 200);
    return;
  }
  report_.add_task_report(
      TaskReport{.loss_sum = static_cast<double>(r.train_loss) * static_cast<double>(r.num_samples),
                 .samples = r.num_samples,
                 .bytes = static_cast<double>(r.bytes_sent + r.bytes_received),
                 .uplink = static_cast<double>(r.bytes_sent),
                 .train_s = static_cast<double>(r.train_seconds),
                 .comm_s = static_cast<double>(r.comm_seconds)});
}

// ---- closing a round (FedBuff: a step) on every shard, in two phases ----------------------
//
// Phase one (kPreparing): each shard's rule computes its range's aggregate and answers whether
// it could. Phase two (kClosing): every shard commits, if all could, or discards. A robust rule
// that refuses on one shard thus fails the round everywhere, and the round is logged and
// recorded as failed, never counted as committed.
void Coordinator::prepare_close(std::uint64_t round, std::size_t updates) {
  state_ = State::kPreparing;
  closing_round_ = round;
  closing_updates_ = updates;
  prepare_failure_.clear();
  for (std::size_t i = 1; i < shards_.size(); ++i) shards_[i].prepared = false;
  const auto local = local_.prepare_round(round);
  if (!local.ok) prepare_failure_ = local.reason;
  if (buffered()) step_updates_ = local_.prepared_count();
  resend_prepare();
}

// Sends `close` to every shard but 0 that has not answered it yet (`answered`); the retry
// comes 2 s later. True when every shard has answered.
bool Coordinator::send_round_close(bool ShardInfo::*answered, const transport::RoundClose& close) {
  close_retry_ = clock_.now() + 2s;
  bool all = true;
  for (std::size_t i = 1; i < shards_.size(); ++i) {
    auto& s = shards_[i];
    if (s.*answered) continue;
    all = false;
    if (!s.up) continue;
    Envelope e;
    e.round = close.round;
    e.body = close;
    if (!out_.send(s.peer, std::move(e))) s.up = false;
  }
  return all;
}

void Coordinator::resend_prepare() {
  const transport::RoundClose prepare{.round = closing_round_, .commit = true,
                                      .clients = static_cast<std::uint32_t>(closing_updates_),
                                      .prepare = true};
  if (send_round_close(&ShardInfo::prepared, prepare)) prepared_everywhere();
}

void Coordinator::prepared_everywhere() {
  if (state_ != State::kPreparing) return;
  if (prepare_failure_.empty()) {
    close_round(true);
    return;
  }
  if (buffered()) {
    // Another shard's K-th update is still on its way: not a failure, ask again shortly.
    COHORT_LOG(Debug) << "step " << closing_round_ << " not ready: " << prepare_failure_;
    fb_retry_ = clock_.now() + 20ms;
    fb_short_ = true;
    close_round(false);
    return;
  }
  round_failed(prepare_failure_);
  if (finished_) return;
  close_round(false);
}

// A round (FedBuff: step) that does not commit: logged, recorded, and counted towards
// server.max_failed_rounds.
void Coordinator::round_failed(const std::string& why) {
  ++failed_in_a_row_;
  last_failure_ = why;
  const std::uint64_t id = buffered() ? committed_ + 1 : round_;
  COHORT_LOG(Warn) << (buffered() ? "step " : "round ") << id << " failed: " << why
                   << (buffered() ? "; its updates stay buffered" : "; discarded, retrying");
  metrics_.write("round_failed", {{"round_id", id},
                                  {"committed", committed_},
                                  {"clients", static_cast<std::uint64_t>(completed_.size())},
                                  {"selected", static_cast<std::uint64_t>(selected_.size())},
                                  {"reason", why}});
  if (max_failed_rounds_ > 0 && failed_in_a_row_ >= max_failed_rounds_) give_up();
}

void Coordinator::close_round(bool commit) {
  state_ = State::kClosing;
  closing_commit_ = commit;
  for (std::size_t i = 1; i < shards_.size(); ++i) shards_[i].closed = false;
  local_.close_round(closing_round_, commit);
  resend_close();
}

void Coordinator::resend_close() {
  const transport::RoundClose close{.round = closing_round_, .commit = closing_commit_,
                                    .clients = static_cast<std::uint32_t>(completed_.size()),
                                    .prepare = false};
  if (send_round_close(&ShardInfo::closed, close)) round_closed();
}

void Coordinator::on_shard_ack(const Message& m, const transport::PushAck& a) {
  if (m.envelope.round != closing_round_) return;
  const bool preparing = a.prepared;
  if (preparing ? state_ != State::kPreparing : state_ != State::kClosing) return;
  for (std::size_t i = 1; i < shards_.size(); ++i) {
    if (shards_[i].node_id != m.sender) continue;
    if (preparing) {
      if (shards_[i].prepared) return;
      shards_[i].prepared = true;
      if (!a.accepted && prepare_failure_.empty()) prepare_failure_ = a.reason;
    } else {
      shards_[i].closed = true;
    }
  }
  if (preparing) {
    if (std::all_of(shards_.begin() + 1, shards_.end(), [](const ShardInfo& s) { return s.prepared; })) {
      prepared_everywhere();
    }
  } else if (std::all_of(shards_.begin() + 1, shards_.end(), [](const ShardInfo& s) { return s.closed; })) {
    round_closed();
  }
}

void Coordinator::round_closed() {
  if (state_ != State::kClosing) return;
  state_ = State::kIdle;
  if (!closing_commit_) return;
  failed_in_a_row_ = 0;
  fb_short_ = false;
  ++committed_;
  const auto now = clock_.now();
  last_round_s_ = std::chrono::duration<double>(now - round_started_).count();
  RoundRecord record = buffered() ? RoundRecord{} : current_record();
  if (buffered()) {
    record.clients = step_updates_;  // the updates this step averaged (on shard 0)
    record.round_s = last_round_s_;
    round_started_ = now;
  }
  if (dp_noise_ > 0) {
    accountant_.add_steps(std::min(round_sampling_rate_, 1.0), dp_noise_, 1);
    record.epsilon = accountant_.epsilon(dp_delta_).epsilon;
  }
  queue_line(buffered() ? committed_ : round_, record);
}

RoundRecord Coordinator::current_record() const {
  return RoundRecord{
      .clients = completed_.size(),
      .selected = selected_.size(),
      .train_loss = round_samples_ ? round_loss_ / static_cast<double>(round_samples_) : 0,
      .bytes = round_bytes_,
      .train_s = round_train_s_,
      .comm_s = round_comm_s_,
      .round_s = last_round_s_,
      .uplink = round_uplink_};
}

// Queues the line of a committed round (step), asking one client to evaluate the new model every
// eval_every rounds and after the last.
void Coordinator::queue_line(std::uint64_t round_id, const RoundRecord& record) {
  Line line;
  line.round_id = round_id;
  line.committed = committed_;
  line.record = record;
  line.sampling_rate = round_sampling_rate_;
  if (buffered()) {
    line.reports_deadline = clock_.now() + deadline_;
  } else {
    line.reports = line.record.clients;  // a federated round's reports are all in
  }
  const bool eval = eval_every_ > 0 && (committed_ % eval_every_ == 0 || committed_ >= rounds_);
  // The first reachable client from the cursor on; one whose connection proves gone is skipped.
  for (std::size_t tries = 0; eval && tries < clients_.size(); ++tries) {
    auto it = clients_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(eval_cursor_++ % clients_.size()));
    if (!it->second.reachable) continue;
    const transport::RoundStart rs{
        // FedBuff's task ids and evaluations share one sequence, so a report names what it answers.
        .round = buffered() ? ++round_ : round_,
        .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
        // Data-parallel shards read Pull.min_version as the worker's clock: an evaluation is not one.
        .model_version = dataparallel() ? 0 : local_.version(),
        .evaluate_only = true};
    Envelope e;
    e.round = rs.round;
    e.body = rs;
    if (out_.send(it->second.peer, std::move(e))) {
      line.waiting = true;
      line.eval_id = rs.round;
      line.eval_deadline = clock_.now() + deadline_;
      break;
    }
    it->second.reachable = false;
  }
  report_.queue(std::move(line));
}

// After server.max_failed_rounds failed rounds (steps) in a row: the clients and shards are
// told goodbye, and run() throws TrainingError with the reason.
void Coordinator::give_up() {
  std::string why = std::to_string(failed_in_a_row_) + (buffered() ? " steps" : " rounds") +
                    " in a row failed (server.max_failed_rounds); the last: " + last_failure_ +
                    "; the last client refusal: " +
                    (last_refusal_.empty() ? std::string("none reported") : last_refusal_);
  if (last_refusal_.find("non-finite") != std::string::npos) {
    why += ". Non-finite updates usually mean a learning rate too high for the model.";
  }
  failure_ = why;
  COHORT_LOG(Error) << "training stopped: " << failure_;
  report_.stop_waiting(clock_.now());
  finish("training failed");
}

void Coordinator::finish(const char* why) {
  report_.flush(clock_.now());
  if (!report_.empty()) return;  // let the last evaluations arrive (or time out) first
  finished_ = true;
  COHORT_LOG(Info) << "training finished: " << committed_ << (buffered() ? " steps" : " rounds")
                   << " in " << std::chrono::duration<double>(clock_.now() - started_).count() << " s";
  for (auto& [id, c] : clients_) {
    Envelope e;
    e.body = transport::Bye{why};
    out_.send(c.peer, std::move(e));
  }
  for (std::size_t i = 1; i < shards_.size(); ++i) {
    if (!shards_[i].up) continue;
    Envelope e;
    e.body = transport::Bye{why};
    out_.send(shards_[i].peer, std::move(e));
  }
  metrics_.write("done", {{"rounds", committed_},
                          {"final_accuracy", static_cast<double>(report_.last_accuracy())},
                          {"total_uplink_bytes", report_.total_uplink()},
                          {"wall_seconds", std::chrono::duration<double>(clock_.now() - started_).count()}});
}

}  // namespace cohort::server
