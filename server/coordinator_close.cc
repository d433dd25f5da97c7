// The coordinator's closing of a round (FedBuff: a step) on every shard in two phases, the
// progress line it queues for a committed one, and the end of training (finish, give up).
#include <algorithm>

#include "cohort/core/log.h"

#include "coordinator.h"

namespace cohort::server {
namespace {

using namespace std::chrono_literals;
using transport::Envelope;
using transport::Message;

}  // namespace

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
  if (buffered()) {
    step_updates_ = local_.prepared_count();
    fb_prepared_idle_ = busy_.empty();
  }
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
  const transport::RoundClose prepare{.round = closing_round_,
                                      .commit = true,
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
    // Another shard's K-th update is still on its way: not a failure, ask again shortly. Only
    // a step short with no task in flight (another shard refused an update this one took) is
    // starved and gets one more task; one short of a push still on its way gets that push,
    // and a task issued meanwhile would add its update to one shard's step and not another's.
    COHORT_LOG(Debug) << "step " << closing_round_ << " not ready: " << prepare_failure_;
    fb_retry_ = clock_.now() + 20ms;
    fb_short_ = fb_prepared_idle_;
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
  const transport::RoundClose close{.round = closing_round_,
                                    .commit = closing_commit_,
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
    if (std::all_of(shards_.begin() + 1, shards_.end(),
                    [](const ShardInfo& s) { return s.prepared; })) {
      prepared_everywhere();
    }
  } else if (std::all_of(shards_.begin() + 1, shards_.end(),
                         [](const ShardInfo& s) { return s.closed; })) {
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
  for (std::size_t tries = 0; eval && tries < registered_clients(); ++tries) {
    const auto [id, c] = next_to_evaluate();
    if (c == nullptr || !c->reachable || !c->evaluates) continue;
    const transport::RoundStart rs{
        // FedBuff's task ids and evaluations share one sequence, so a report names what it answers.
        .round = buffered() ? ++round_ : round_,
        .deadline_ms = static_cast<std::uint64_t>(deadline_.count()),
        // Data-parallel shards read Pull.min_version as the worker's clock: an evaluation is not
        // one.
        .model_version = dataparallel() ? 0 : local_.version(),
        .evaluate_only = true};
    Envelope e;
    e.round = rs.round;
    e.body = rs;
    if (out_.send(c->peer, std::move(e))) {
      line.waiting = true;
      line.eval_id = rs.round;
      line.eval_deadline = clock_.now() + deadline_;
      break;
    }
    set_reachable(id, *c, false);
  }
  report_.queue(std::move(line));
}

std::pair<NodeId, Coordinator::ClientInfo*> Coordinator::next_to_evaluate() {
  const std::size_t at = eval_cursor_++ % registered_clients();
  if (population_joined_) {
    // The same walk as over the map of every registered client: the at-th present member.
    const std::uint32_t i = population_pool_.kth_present(at);
    if (!population_pool_.is_live(i)) return {NodeId{}, nullptr};
    NodeId id = population_->name(i);
    ClientInfo* c = client(id);
    return {std::move(id), c};
  }
  auto it = clients_.begin();
  std::advance(it, static_cast<std::ptrdiff_t>(at));
  return {it->first, &it->second};
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
                   << " in " << std::chrono::duration<double>(clock_.now() - started_).count()
                   << " s";
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
  // train.loss = mse: the final test MSE instead of an accuracy it does not have.
  metrics_.write(
      "done", {{"rounds", committed_},
               report_.regression()
                   ? MetricField{"final_test_loss", static_cast<double>(report_.last_loss())}
                   : MetricField{"final_accuracy", static_cast<double>(report_.last_accuracy())},
               {"total_uplink_bytes", report_.total_uplink()},
               {"wall_seconds", std::chrono::duration<double>(clock_.now() - started_).count()}});
}

}  // namespace cohort::server
