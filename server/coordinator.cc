#include "coordinator.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/network.h"
#include "cohort/transport/endpoint.h"
#include "speed_selection.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;

std::uint64_t rounds_of(const ServerOptions& options) {
  // Data-parallel training is one long task per worker.
  if (options.modes.mode == transport::TrainingMode::kDataParallel) return 1;
  return options.round.rounds;
}

}  // namespace

Coordinator::Coordinator(const ServerOptions& options, Shard& local, Outbox& out,
                         const Clock& clock, const NodeId& name, const std::string& url,
                         MetricsSink& metrics, std::shared_ptr<const VirtualPopulation> population)
    : modes_(options.modes),
      local_(local),
      out_(out),
      clock_(clock),
      metrics_(metrics),
      rng_(options.round.seed),
      population_(std::move(population)),
      report_(clock, metrics, options.modes.mode == transport::TrainingMode::kBuffered,
              rounds_of(options), options.dp.noise_multiplier, options.dp.delta,
              options.train.regression) {
  const RoundOptions& r = options.round;
  shards_.resize(options.node.shards);
  shards_[0] = {.up = true, .url = url, .node_id = name, .closed = true};
  rounds_ = rounds_of(options);
  per_round_ = r.clients_per_round;
  min_clients_ = r.min_clients;
  min_updates_ = r.min_updates;
  max_failed_rounds_ = r.max_failed_rounds;
  deadline_ = r.deadline;
  work_ = options.work;
  eval_every_ = r.eval_every;
  overselect_ = r.overselect;
  selection_ = r.selection;
  heartbeat_ms_ = r.heartbeat_ms;
  client_timeout_ = r.client_timeout;
  dp_steps_ = options.dataparallel.steps;
  train_ = options.train;
  model_spec_ = options.model.spec;
  model_size_ = kernels::make_network_spec(model_spec_).parameter_count();
  round_ = local.last_closed();
  committed_ = local.version();
  started_ = clock_.now();
  dp_noise_ = options.dp.noise_multiplier;
  dp_delta_ = options.dp.delta;
  buffer_k_ = options.fedbuff.buffer_size;
  concurrency_ = options.fedbuff.concurrency;
  rule_min_ = local.rule_min_updates();
  dp_uniform_ = options.dp.clip > 0;
  if (options.secagg.kind != SecAggKind::kNone && federated()) make_secagg(options.secagg);
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
    drop_client(m.sender);
    return true;
  }
  if (auto* sa = std::get_if<transport::SecAgg>(&m.envelope.body)) {
    touch(m);
    if (secagg_) {
      secagg_->on_message(m, *sa);
    } else {
      reply_error(m, "this server does not run secure aggregation");
    }
    return true;
  }
  return false;
}

void Coordinator::tick() {
  const auto now = clock_.now();
  if (finished_) return;
  if (state_ == State::kPreparing && now >= close_retry_) resend_prepare();
  if (state_ == State::kClosing && now >= close_retry_) resend_close();
  tick_secagg();
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
    if (state_ == State::kIdle && all_shards_up() && enough_clients()) start_round();
    if (state_ != State::kRunning) break;
    const std::size_t done = completed_.size();
    const bool enough = done >= per_round_;
    const bool all_reported = reported_ >= selected_.size();
    if (!(enough || all_reported || now >= round_deadline_)) break;
    if (now < round_deadline_) {
      // Closed early, with K updates: whoever has not reported was cut, not late; that round
      // says nothing of how reliably it finishes (server.selection = speed_aware).
      for (const auto& id : selected_) {
        if (reporters_.contains(id)) continue;
        if (auto s = selections_.find(id); s != selections_.end() && s->second > 0) --s->second;
      }
    }
    write_client_records();  // the round takes no more reports from here on
    if (done < min_updates_ || done < rule_min_) {
      const bool rule = done >= min_updates_;
      round_failed(std::to_string(done) + " complete update(s), fewer than " +
                   (rule ? "aggregator '" + local_.rule_name() + "' needs (" +
                               std::to_string(rule_min_) + ")"
                         : "server.min_updates = " + std::to_string(min_updates_)));
      if (finished_) return false;
      closing_round_ = round_;  // the shards close (and drop) this round, not the one before
      close_round(false);
    } else if (secagg_) {
      // Secure aggregation: the shards stop taking masked inputs, the survivors unmask; phase
      // one follows (tick_secagg()).
      state_ = State::kUnmasking;
      if (secagg_->stage() == SecAggRound::Stage::kMasking) secagg_->close();
      tick_secagg();
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
  const auto timeout = client_timeout_;
  if (now < next_sweep_) return;
  next_sweep_ = now + 100ms;
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (now - it->second.last_seen > timeout && !selected_.contains(it->first)) {
      COHORT_LOG(Info) << "client " << it->first << " timed out";
      const NodeId id = it->first;
      ++it;
      drop_client(id);
    } else {
      ++it;
    }
  }
}

void Coordinator::touch(const Message& m) {
  if (ClientInfo* c = client(m.sender)) {
    c->last_seen = clock_.now();
    c->peer = m.peer;
    set_reachable(m.sender, *c, true);
  }
}

Coordinator::ClientInfo* Coordinator::client(const NodeId& id) {
  if (auto it = clients_.find(id); it != clients_.end()) return &it->second;
  if (!population_joined_) return nullptr;
  const auto i = population_->index_of(id);
  if (!i || !population_pool_.is_present(*i)) return nullptr;
  ClientInfo& c = clients_[id];
  c.peer = transport::multiplexed_peer(population_peer_, id);
  c.dataset_size = population_->dataset_size(*i);
  c.last_seen = clock_.now();
  c.index = *i;
  c.reachable = population_pool_.is_live(*i);
  return &c;
}

void Coordinator::set_reachable(const NodeId& id, ClientInfo& c, bool reachable) {
  c.reachable = reachable;
  if (!population_joined_) return;
  if (const auto i = population_->index_of(id)) population_pool_.set_live(*i, reachable);
}

void Coordinator::drop_client(const NodeId& id) {
  clients_.erase(id);
  if (!population_joined_) return;
  if (const auto i = population_->index_of(id)) population_pool_.set_present(*i, false);
}

std::size_t Coordinator::registered_clients() const {
  return population_joined_ ? population_pool_.present() : clients_.size();
}

bool Coordinator::all_shards_up() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const ShardInfo& s) { return s.up; });
}

std::size_t Coordinator::live_clients() const {
  // Population mode: every client is a member (others are refused), counted by the pool.
  if (population_) return population_joined_ ? population_pool_.live() : 0;
  return static_cast<std::size_t>(std::count_if(clients_.begin(), clients_.end(),
                                                [](const auto& c) { return c.second.reachable; }));
}

// Checked after every message while idle: the pool's size bounds the live count, so the walk
// over every client runs only once enough have registered (cohort-sim registers its whole fleet
// one message at a time, and a walk per Register made its set-up quadratic in the fleet).
bool Coordinator::enough_clients() const {
  return registered_clients() >= min_clients_ && live_clients() >= min_clients_;
}

transport::Welcome Coordinator::welcome(std::uint32_t index) const {
  transport::Welcome w;
  w.client_index = index;
  w.model_size = model_size_;
  w.model_spec = model_spec_;
  w.heartbeat_ms = heartbeat_ms_;
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    auto [b, e] = shard_range(model_size_, static_cast<std::uint32_t>(shards_.size()), i);
    w.shards.push_back({i, shards_[i].url, shards_[i].node_id, b, e});
  }
  // Client-side training options travel as TOML, from the server's [train] section.
  w.training_toml = train_.toml;
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
  if (population_) {
    const auto i = population_->index_of(m.sender);
    if (!i || !population_->present(*i)) {
      reply_error(m, "this coordinator serves a simulated population; '" + m.sender +
                         "' is not one of its members");
      return;
    }
    if (!population_joined_) {
      join_population(m);
    } else {
      population_pool_.set_present(*i, true);  // registering again after it left
    }
  }
  auto [it, fresh] = clients_.try_emplace(m.sender);
  it->second.peer = m.peer;
  it->second.dataset_size = r.dataset_size;
  it->second.last_seen = clock_.now();
  it->second.reachable = true;
  it->second.evaluates = !r.no_evaluation;
  // A new session may be new hardware too: measure it afresh.
  it->second.profile = ClientProfile{};
  if (fresh) it->second.index = next_client_index_++;
  COHORT_LOG(Info) << "client " << (fresh ? "registered: " : "re-registered: ") << m.sender << " ("
                   << r.dataset_size << " samples, " << r.device << ", " << registered_clients()
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
  e.body = transport::ErrorBody{.code = transport::ErrorCode::kUnknownNode,
                                .message = std::move(why),
                                .ref_seq = m.envelope.seq};
  out_.send(m.peer, std::move(e));
}

void Coordinator::join_population(const Message& m) {
  population_peer_ = m.peer;
  population_pool_ = PopulationPool(*population_, selection_ == Selection::kWeighted);
  population_joined_ = true;
  COHORT_LOG(Info) << population_pool_.present() << " clients of a simulated population of "
                   << population_->count << " registered at once, through " << m.sender;
}

std::vector<NodeId> Coordinator::select_members(std::size_t want) {
  std::vector<std::uint32_t> picked;
  if (selection_ == Selection::kSpeedAware) {
    // O(live members): speed-aware selection draws a key for every candidate.
    const std::vector<std::uint32_t> live = population_pool_.live_members();
    std::vector<SelectionCandidate> candidates(live.size(), {.since_selected = round_});
    auto candidate = [&](const NodeId& id) -> SelectionCandidate* {
      const auto i = population_->index_of(id);
      if (!i) return nullptr;
      const auto at = std::lower_bound(live.begin(), live.end(), *i);
      return at != live.end() && *at == *i
                 ? &candidates[static_cast<std::size_t>(at - live.begin())]
                 : nullptr;
    };
    for (const auto& [id, n] : selections_)
      if (auto* c = candidate(id)) c->selected = n;
    for (const auto& [id, n] : participations_)
      if (auto* c = candidate(id)) c->completed = n;
    for (const auto& [id, last] : last_selected_)
      if (auto* c = candidate(id)) c->since_selected = round_ - last;
    for (std::size_t k : speed_aware_selection(candidates, per_round_, want, rng_)) {
      picked.push_back(live[k]);
    }
  } else {
    picked = population_pool_.sample(want, selection_ == Selection::kWeighted, rng_);
  }
  std::sort(picked.begin(), picked.end());  // index order is name order
  std::vector<NodeId> out;
  out.reserve(picked.size());
  for (const std::uint32_t i : picked) {
    out.push_back(population_->name(i));
    (void)client(out.back());  // the cohort gets entries: peers, profiles, records
  }
  return out;
}

std::vector<NodeId> Coordinator::select() {
  if (population_joined_) {
    const std::size_t want =
        static_cast<std::size_t>(std::ceil(static_cast<double>(per_round_) * overselect_));
    return select_members(std::min(std::max<std::size_t>(want, 1), population_pool_.live()));
  }
  std::vector<NodeId> pool;
  std::vector<double> weights;
  for (const auto& [id, c] : clients_) {
    if (!c.reachable) continue;
    pool.push_back(id);
    weights.push_back(static_cast<double>(std::max<std::uint64_t>(c.dataset_size, 1)));
  }
  std::size_t want =
      static_cast<std::size_t>(std::ceil(static_cast<double>(per_round_) * overselect_));
  want = std::min(std::max<std::size_t>(want, 1), pool.size());
  std::vector<NodeId> out;
  if (selection_ == Selection::kSpeedAware) {
    std::vector<SelectionCandidate> candidates;
    candidates.reserve(pool.size());
    for (const auto& id : pool) {
      const auto s = selections_.find(id);
      const auto p = participations_.find(id);
      const auto l = last_selected_.find(id);
      candidates.push_back(
          {.selected = s == selections_.end() ? 0 : s->second,
           .completed = p == participations_.end() ? 0 : p->second,
           .since_selected = l == last_selected_.end() ? round_ : round_ - l->second});
    }
    for (std::size_t i : speed_aware_selection(candidates, per_round_, want, rng_)) {
      out.push_back(pool[i]);
    }
    return out;  // pool is in id order, and so is `out`
  }
  // Sampling without replacement; weighted by data size when asked.
  for (std::size_t k = 0; k < want; ++k) {
    std::size_t pick = 0;
    if (selection_ == Selection::kWeighted) {
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
  assigned_.clear();
  round_clients_.clear();
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
  round_sampling_rate_ =
      live == 0 ? 1.0 : static_cast<double>(chosen.size()) / static_cast<double>(live);
  const transport::RoundStart rs{.round = round_,
                                 .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
                                 .local_epochs = train_.epochs,
                                 .local_steps = train_.steps,
                                 .model_version = local_.version(),
                                 .cohort_size = static_cast<std::uint32_t>(chosen.size()),
                                 .secure_aggregation = secagg_.has_value()};
  // Every shard learns the selection before any client does: a shard takes this round's pushes
  // only from these clients.
  round_selection_ = chosen;
  for (std::size_t i = 0; i < shards_.size(); ++i) send_round_open(i);
  const std::vector<std::uint32_t> work = plan_work(chosen);
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    const NodeId& id = chosen[i];
    auto& c = clients_.at(id);
    transport::RoundStart mine = rs;
    mine.local_steps = work[i];
    Envelope e;
    e.round = round_;
    e.body = mine;
    if (out_.send(c.peer, std::move(e))) {
      selected_.insert(id);
      assigned_[id] = mine.local_steps;
      ++selections_[id];
      last_selected_[id] = round_;
    } else {
      set_reachable(id, c, false);
      COHORT_LOG(Info) << "client " << id << " is unreachable (its connection is gone): out of the "
                       << "pool until it registers again";
    }
  }
  state_ = State::kRunning;
  if (secagg_) begin_secagg();
  COHORT_LOG(Debug) << "round " << round_ << " started with " << selected_.size() << " clients";
}

// ---- data-parallel: one long task per worker; the shards enforce the consistency model ----
void Coordinator::tick_dataparallel(TimePoint now) {
  if (state_ == State::kIdle && !dp_started_ && all_shards_up() && enough_clients()) {
    dp_started_ = true;
    round_ = 1;
    round_started_ = now;
    round_deadline_ = now + deadline_;
    const transport::RoundStart rs{.round = round_,
                                   .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
                                   .local_steps = dp_steps_,
                                   .mode = transport::TrainingMode::kDataParallel,
                                   .batch_size = train_.batch_size};
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
    if (!enough_clients()) return;
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
  // Starved: a step prepared with no task in flight was not ready (another shard holds fewer
  // updates than this one: it refused one, or took fewer into the last step), so nothing in
  // flight can fill it: one more task.
  const bool starved = fb_short_ && busy_.empty();
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (busy_.size() >= concurrency_) break;
    if (starved ? !busy_.empty() : local_.buffered() + busy_.size() >= want) break;
    if (busy_.contains(it->first) || !it->second.reachable) continue;
    const transport::RoundStart rs{.round = ++round_,
                                   .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
                                   .local_epochs = train_.epochs,
                                   .local_steps = train_.steps,
                                   .model_version = local_.version(),
                                   .mode = transport::TrainingMode::kBuffered};
    Envelope e;
    e.round = rs.round;
    e.body = rs;
    if (out_.send(it->second.peer, std::move(e))) {
      busy_[it->first] = now + deadline_;
    } else {
      set_reachable(it->first, it->second, false);
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
  if (state_ != State::kRunning || r.round != round_ || !selected_.contains(m.sender)) {
    note_late_report(m.sender, r);
    return;
  }
  // A client resends its report after a reconnect, not knowing whether it arrived: count once.
  if (!reporters_.insert(m.sender).second) return;
  ++reported_;
  note_client_report(m.sender, r);
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

void Coordinator::note_client_report(const NodeId& id, const transport::ClientReport& r) {
  if (!federated()) return;
  ClientRoundRecord rec{.round_id = r.round,
                        .client = id,
                        .trained = r.trained,
                        .local_steps = r.local_steps,
                        .measured_samples_per_s = r.samples_per_second,
                        .peak_training_bytes = r.peak_training_bytes,
                        .micro_batch = r.micro_batch,
                        .accumulation = r.accumulation,
                        .recompute = r.recompute,
                        .train_seconds = r.train_seconds,
                        .comm_seconds = r.comm_seconds,
                        .round_seconds = r.round_seconds};
  if (const auto a = assigned_.find(id); a != assigned_.end()) rec.assigned_steps = a->second;
  if (r.trained) ++participations_[id];
  rec.participations = participations_[id];
  if (auto c = clients_.find(id); c != clients_.end()) {
    update_profile(c->second.profile, r, shards_.size(), r.trained ? kProfileAlpha : kMissAlpha);
    rec.profile = c->second.profile;  // kept should the client leave before the record is written
  }
  round_clients_[id] = std::move(rec);
}

void Coordinator::note_late_report(const NodeId& id, const transport::ClientReport& r) {
  if (!federated() || r.round > round_ || !clients_.contains(id)) return;
  late_[id] = r;
}

double Coordinator::plan_deadline_seconds() const {
  return work_.plan_deadline_s > 0 ? work_.plan_deadline_s
                                   : std::chrono::duration<double>(deadline_).count();
}

std::vector<std::uint32_t> Coordinator::plan_work(const std::vector<NodeId>& chosen) const {
  std::vector<std::uint32_t> steps(chosen.size(), train_.steps);
  if (work_.policy == WorkPolicy::kFixed) return steps;
  const std::size_t shards = shards_.size();
  // What a client has not measured yet (all of it, or the push of one that never finished one)
  // is taken from the slow end of the fleet's measurements.
  std::optional<ClientProfile> prior;
  std::vector<ClientProfile> guessed(chosen.size());
  std::vector<const ClientProfile*> planned_with(chosen.size());
  std::vector<std::uint32_t> fixed(chosen.size());
  std::vector<double> finish(chosen.size(), -1);
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    const auto& c = clients_.at(chosen[i]);
    fixed[i] = fixed_work_steps(train_.steps, train_.epochs, train_.batch_size, c.dataset_size,
                                work_.min_steps);
    if (usable_profile(c.profile, shards)) {
      planned_with[i] = &c.profile;
    } else {
      if (!prior) {
        std::vector<const ClientProfile*> fleet;
        fleet.reserve(clients_.size());
        for (const auto& [id, other] : clients_) fleet.push_back(&other.profile);
        prior = fleet_prior(fleet, shards);
      }
      guessed[i] = filled_from(c.profile, *prior);
      if (usable_profile(guessed[i], shards)) planned_with[i] = &guessed[i];
    }
    if (planned_with[i] != nullptr) {
      finish[i] = expected_work_seconds(*planned_with[i], fixed[i], train_.batch_size);
    }
  }
  const double deadline_s = plan_deadline_seconds();
  const double round_s = planned_round_seconds(finish, deadline_s, work_.margin);
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    const auto& c = clients_.at(chosen[i]);
    if (planned_with[i] == nullptr) {
      steps[i] = work_.min_steps;  // nobody measured yet: a short first round that measures all
      continue;
    }
    std::uint32_t hi = work_.max_steps > 0
                           ? work_.max_steps
                           : derived_max_steps(train_.steps, train_.epochs, train_.batch_size,
                                               c.dataset_size, work_.min_steps);
    if (planned_with[i] != &c.profile) hi = std::min(hi, fixed[i]);  // a guess: no more than fixed
    steps[i] = plan_local_steps(planned_with[i], WorkBounds{.deadline_s = deadline_s,
                                                            .margin = work_.margin,
                                                            .round_s = round_s,
                                                            .batch_size = train_.batch_size,
                                                            .min_steps = work_.min_steps,
                                                            .max_steps = hi});
  }
  return steps;
}

void Coordinator::write_client_records() {
  for (const auto& [id, r] : late_) {
    auto c = clients_.find(id);
    if (c == clients_.end() || round_clients_.contains(id)) continue;
    update_profile(c->second.profile, r, shards_.size(), kMissAlpha);
  }
  late_.clear();
  for (auto& [id, rec] : round_clients_) {
    if (auto c = clients_.find(id); c != clients_.end()) rec.profile = c->second.profile;
    metrics_.write("client", client_record_fields(rec));
  }
  round_clients_.clear();
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
  drop_client(m.sender);
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

}  // namespace cohort::server
