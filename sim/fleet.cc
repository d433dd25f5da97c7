// cohort-sim's fleet of virtual clients (fleet.h): registration, message dispatch and pulls here;
// rounds, training and reports in fleet_rounds.cc.
//
// Design
// ------
// The server is the real one: every shard runs cohort::server::run() on its own thread with an
// inproc:// listen url, in the process's one ZeroMQ context, unchanged in behaviour (the round
// state machine, selection, deadlines, streaming FedAvg and its metrics are those of
// cohort-server).
//
// The clients are a "fleet": one multiplexed DEALER per shard, owned by the fleet's thread,
// speaks for all N virtual clients (EndpointOptions::multiplex, plaintext inproc only). Each
// message carries the virtual client's node id as its sender; the shard's ROUTER gives every
// (connection, sender) pair its own peer handle, and replies through it name the virtual client
// in Envelope.recipient, so the fleet routes them. 10,000 clients therefore cost 10,000 ids,
// partitions and profiles, not 10,000 sockets (ZeroMQ's default limit is 1,023 per context, and
// each costs file descriptors). A virtual client holds its partition's row indices and a profile
// (~50 bytes). The model is pulled once per version and shared read-only by the clients that
// start from it (a federated round's model changes only when the round closes); a delta buffer
// exists only for each client in flight (a window of up to 64, within 64 MiB), sent zero-copy;
// and each training thread owns one network and trainer, so memory grows with the threads and
// the selected cohort, not with the registered clients.
//
// The protocol is the participant's (client/participant.cc): Register -> Welcome, and per
// RoundStart: Pull from every shard (once per model version, for all the clients that start from
// it), local training, Push of the delta to every shard, PushAck, ClientReport; evaluate_only
// rounds pull (or share) the model and evaluate on the test set. A client trains the local steps
// its RoundStart asks for (train.* when it asks for none), pushes FedNova's a_i for them
// (Push.local_work, measurements.h) and reports its device as a real client does: the steps, its
// samples/s and its link to each shard, all on the virtual clock.
//
// Virtual clock (sim_clock.h): when a round's RoundStarts are in, the fleet knows the selected
// cohort; from each client's profile, the bytes of its pulls and pushes and its training work it
// computes the simulated finish times, and plan_round() applies the coordinator's closing rule in
// simulated time. Clients that make the cut (the first K by simulated finish) run the protocol
// and report in time; later ones ("cut") and those past the deadline ("stragglers") pull and
// report that they missed the round; offline and dropped-out clients stay silent, as real ones
// would, so the real coordinator closes the round at its (real-time) deadline,
// sim.wall_deadline_ms, with the rest. server.round_deadline_ms is the deadline on the simulated
// clock.
//
// Determinism: selection is the coordinator's seeded sampler over all N registered clients
// (server.min_clients = N). The profile, availability and dropout of a client in a round are
// functions of (sim.seed, client, round). Training seeds are the participant's. Who completes is
// decided on the simulated clock, never by thread timing. FedAvg sums in double, and double
// addition is not associative, so the fleet pushes the completed updates strictly in client-id
// order (a reorder window behind the training threads) and sends reports in that order too. The
// metrics files then differ between runs only in fields named wall_*.
#include "fleet.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>

#include "cohort/client/idx.h"
#include "cohort/client/shard_client.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"

namespace cohort::sim {

using namespace std::chrono_literals;
using client::load_fashion_mnist;
using client::trainer_options_from;
using transport::Endpoint;
using transport::Envelope;
using transport::Message;

Fleet::Fleet(const SimOptions& options, transport::Context& ctx,
             const std::vector<std::string>& urls, const std::atomic<bool>& stop,
             const std::function<bool()>& shards_failed, const client::LocalTrainingRegistry& rules,
             FleetMemory memory)
    : sim_(options),
      rules_(rules),
      ctx_(ctx),
      urls_(urls),
      stop_(stop),
      shards_failed_(shards_failed),
      pool_(options.threads),
      reporter_(options.report),
      memory_(std::move(memory)) {
  n_ = options.clients;
  registrants_ = n_ - memory_.unfit();
  COHORT_CHECK(!memory_.has_budgets() || memory_.clients() == n_);
  while (first_registrant_ < n_ && !memory_.fits(first_registrant_)) ++first_registrant_;
  const std::size_t want = static_cast<std::size_t>(
      std::ceil(static_cast<double>(options.server.clients_per_round) * options.server.overselect));
  expected_selected_ = std::min(std::max<std::size_t>(want, 1), registrants_);
  started_ = Clock::now();
}

std::shared_ptr<const server::VirtualPopulation> Fleet::prepare() {
  COHORT_CHECK(!population_) << "Fleet::prepare() twice";
  if (n_ == 0) throw ConfigError("sim.clients must be at least 1");
  if (n_ > std::numeric_limits<std::uint32_t>::max() / 2) {
    throw ConfigError("sim.clients must be at most " +
                      std::to_string(std::numeric_limits<std::uint32_t>::max() / 2));
  }
  auto data = client::load_data(sim_.data.source);
  train_ = std::move(data.train);
  test_ = std::move(data.test);
  rows_ = client::ClientRows(sim_.data.partition, train_, n_, sim_.data.seed);
  partition_text_ = sim_.data.partition.to_string();
  if (!sim_.profile.trace.empty()) trace_ = read_profile_trace(sim_.profile.trace);
  COHORT_LOG(Info) << "cohort-sim: " << n_ << " virtual clients (" << partition_text_ << "), "
                   << pool_.size() << " training threads";
  // One linear pass, a few bytes per client: who registers and how much data each one holds.
  auto p = std::make_shared<server::VirtualPopulation>();
  p->count = static_cast<std::uint32_t>(n_);
  p->width = server::VirtualPopulation::width_for(n_);
  if (memory_.unfit() > 0) {
    p->absent.resize(n_);
    for (std::uint32_t c = 0; c < n_; ++c) p->absent[c] = !memory_.fits(c);
  }
  bool same_size = true;
  for (std::uint32_t c = 1; c < n_ && same_size; ++c) same_size = rows_.size(c) == rows_.size(0);
  p->size_all = rows_.size(0);
  if (!same_size) {
    p->sizes.resize(n_);
    for (std::uint32_t c = 0; c < n_; ++c) p->sizes[c] = static_cast<std::uint32_t>(rows_.size(c));
  }
  population_ = std::move(p);
  prepared_ = Clock::now();
  return population_;
}

Summary Fleet::run() {
  COHORT_CHECK(population_) << "Fleet::run() before prepare()";
  transport::EndpointOptions o;
  o.node_id = "sim-fleet";
  o.security.insecure = true;
  o.multiplex = true;
  o.chunk_bytes = sim_.server.chunk_bytes;
  for (const auto& url : urls_)
    eps_.push_back(std::make_unique<Endpoint>(Endpoint::connect(ctx_, url, o)));
  for (auto& e : eps_) ep_ptrs_.push_back(e.get());
  summary_.participation.assign(n_, 0);
  summary_.selections.assign(n_, 0);
  summary_.clients_unfit = memory_.unfit();
  while (!finished_) {
    if (stop_.load()) break;
    if (shards_failed_())
      throw InternalError("a server shard of the simulation failed (see its log)");
    drive_registration();
    // While the training threads have more queued work than threads, a result can wait a few
    // milliseconds (its push goes out in order anyway): waking every millisecond then costs the
    // training threads more than it saves. Near the end of a round every millisecond counts.
    const bool busy = in_flight_ > 0 || secagg_tasks_ > 0;
    const bool queued = training_ > pool_.size();
    const int ready = Endpoint::poll(ep_ptrs_, !busy ? 20ms : queued ? 5ms : 1ms);
    if (ready >= 0) {
      for (std::size_t i = 0; i < eps_.size(); ++i) {
        while (auto m = eps_[i]->receive(0ms)) dispatch(*m);
      }
    }
    collect_results();
    collect_secagg();
    // Plan, then start: a round planned now starts its jobs before the next wait; and when
    // advance() closes the active round, the next one (its RoundStarts are usually in by then)
    // is planned and started at once, not after a poll timeout.
    for (int pass = 0; pass < 2; ++pass) {
      check_stalled_collection();
      const bool was_active = active_.has_value();
      advance();
      if (!was_active || active_) break;
    }
    progress_line(false);
  }
  if (active_) {
    // Training finished at the last round's K-th update: its cut and late clients need not
    // report any more (their bytes are counted from the plan either way).
    for (auto& j : active_->jobs) {
      if (!j->done && j->pulls_pending + j->acks_pending > 0) --in_flight_;
      j->done = true;
    }
    close_active();
  }
  // Secure aggregation's steps still on the training threads write into this fleet: wait for
  // them (a step takes milliseconds to seconds).
  const auto until = Clock::now() + 120s;
  while (secagg_tasks_ > 0 && Clock::now() < until) {
    std::this_thread::sleep_for(1ms);
    collect_secagg();
  }
  flush_records(true);
  reporter_.finish_progress();
  summary_.wall_seconds = seconds_since(started_);
  summary_.threads = pool_.size();
  reporter_.write_summary(summary_);
  return summary_;
}

void Fleet::drain_until(const std::function<bool()>& done) {
  const auto until = Clock::now() + 30s;
  while (!done() && Clock::now() < until) {
    if (Endpoint::poll(ep_ptrs_, 20ms) >= 0) {
      for (auto& e : eps_)
        while (e->receive(0ms)) {
        }
    }
  }
}

DeviceProfile Fleet::profile(std::uint32_t c) const {
  if (!trace_.empty()) return trace_[c % trace_.size()];
  return draw_profile(sim_.profile.spec, sim_.seed, c);
}

void Fleet::send(std::size_t shard, std::uint32_t client, Envelope e, transport::Payload payload) {
  e.sender = name_of(client);
  eps_[shard]->send({}, std::move(e), payload);
}

// The coordinator admits the whole population at its first member's Register (population.h):
// one client knocks every 100 ms until the Welcome (all shards up). A client whose memory cannot
// train the model is absent from the population: it never registers, as a real one would not.
void Fleet::drive_registration() {
  if (all_registered()) return;
  const auto now = Clock::now();
  if (now >= next_knock_) {
    send_register(first_registrant_);
    next_knock_ = now + 100ms;
  }
}

void Fleet::send_register(std::uint32_t c) {
  transport::Register r;
  r.role = transport::Role::kClient;
  r.dataset_size = rows_.size(c);
  r.device = "sim";
  r.partition = partition_text_ + " " + std::to_string(c) + "/" + std::to_string(n_);
  Envelope e;
  e.body = r;
  send(0, c, std::move(e));
}

void Fleet::on_welcome(std::uint32_t c, const transport::Welcome& w) {
  if (welcomed_any_ || c != first_registrant_) return;
  welcomed_any_ = true;
  setup_model(w);
  COHORT_LOG(Info) << "cohort-sim: " << registrants_ << " clients registered "
                   << seconds_since(started_) << " s after the start (data and rows were ready at "
                   << std::chrono::duration<double>(prepared_ - started_).count() << " s)";
}

void Fleet::setup_model(const transport::Welcome& w) {
  spec_ = kernels::make_network_spec(w.model_spec);
  model_size_ = spec_.parameter_count();
  client::check_model_input(spec_, w.model_spec, train_, sim_.data.source.describe());
  client::check_model_output(spec_, w.model_spec, train_, sim_.data.source.describe());
  // Clients in flight (pulled or pulling, training, waiting to push in order): enough to hide
  // the hops between fleet, shards and training threads when local work is small, within a
  // 64 MiB budget of model copies, and at least two per training thread.
  const std::size_t fit =
      (std::size_t{64} << 20) / std::max<std::size_t>(1, model_size_ * sizeof(float));
  window_ = std::clamp<std::size_t>(fit, 2 * pool_.size() + 2, 64);
  if (model_size_ != w.model_size)
    throw ProtocolError("the coordinator's model size does not match its spec");
  if (w.shards.size() != urls_.size())
    throw ProtocolError("the coordinator announced another shard map");
  shards_ = w.shards;
  ConfigSchema schema;
  schema.add_section("train", "");
  Config train_cfg(schema);
  train_cfg.merge_toml("[train]\n" + w.training_toml, "the coordinator's [train] section");
  options_ = trainer_options_from(train_cfg.section("train"));
  if (memory_.has_budgets() &&
      (memory_.parameters() != model_size_ || memory_.batch() != options_.batch_size)) {
    throw InternalError("cohort-sim: the memory budgets were planned for another model or batch");
  }
  if (!options_.reset_optimizer_state) {
    // Training threads are shared by all clients; per-client optimizer state is not kept.
    throw ConfigError(
        "the simulation keeps no optimizer state between a client's rounds: "
        "train.reset_optimizer_state = false is not simulated");
  }
  device_ = kernels::make_device("cpu", {.threads = 1});
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    auto slot = std::make_unique<Slot>();
    slot->net = device_->make_network(spec_);
    slot->net->init(sim_.data.seed);
    slot->trainer.emplace(*slot->net, options_);
    slot->rule = rules_.make(options_.rule, *slot->net, options_);
    free_slots_.push_back(slot.get());
    slots_.push_back(std::move(slot));
  }
}

void Fleet::dispatch(Message& m) {
  const auto& body = m.envelope.body;
  COHORT_LOG(Trace) << "fleet: " << transport::body_name(body) << " for '" << m.envelope.recipient
                    << "'";
  if (std::holds_alternative<transport::Bye>(body)) {
    finished_ = true;
    return;
  }
  const auto c = client_of(m.envelope.recipient);
  if (!c) {
    if (auto* e = std::get_if<transport::ErrorBody>(&body)) {
      COHORT_LOG(Warn) << "cohort-sim: " << e->message;
    }
    return;
  }
  if (auto* w = std::get_if<transport::Welcome>(&body)) {
    on_welcome(*c, *w);
  } else if (auto* e = std::get_if<transport::ErrorBody>(&body)) {
    if (!welcomed_any_) {  // the knock is repeated (shards still starting)
      COHORT_LOG(Debug) << name_of(*c) << ": " << e->message;
    } else {
      COHORT_LOG(Warn) << name_of(*c) << ": " << e->message;
    }
  } else if (auto* rs = std::get_if<transport::RoundStart>(&body)) {
    on_round_start(*c, *rs);
  } else if (auto* r = std::get_if<transport::PullReply>(&body)) {
    on_pull_reply(*c, *r, m);
  } else if (auto* a = std::get_if<transport::PushAck>(&body)) {
    on_push_ack(*c, *a, m);
  } else if (auto* sa = std::get_if<transport::SecAgg>(&body)) {
    on_secagg(*c, m, *sa);
  }
}

void Fleet::on_round_start(std::uint32_t c, const transport::RoundStart& rs) {
  if (rs.mode != transport::TrainingMode::kFederated) {
    throw ConfigError("cohort-sim runs federated rounds (server.mode = \"federated\")");
  }
  if (rs.evaluate_only) {
    auto job = std::make_unique<Job>();
    job->kind = Job::Kind::kEvaluate;
    job->client = c;
    job->rs = rs;
    evals_.push_back(std::move(job));
    start_job(*evals_.back());
    return;
  }
  if (collecting_.empty() || collecting_.back().round != rs.round) {
    collecting_.push_back(Collecting{rs.round, rs, {}, Clock::now()});
  }
  // Secure aggregation: every selected client advertises its keys at once (R0).
  if (rs.secure_aggregation) secagg_begin(c, rs);
  // Each client's RoundStart may ask for its own local steps (server.work = "deadline").
  collecting_.back().clients.push_back({c, rs.local_steps});
  collecting_.back().last_arrival = Clock::now();
}

void Fleet::check_stalled_collection() {
  if (active_ || collecting_.empty()) return;
  auto& front = collecting_.front();
  // The RoundStarts say how many were selected (server.selection = speed_aware varies it); an
  // older server's do not: then ceil(K x overselect), or at most the registered clients.
  const std::size_t expected =
      front.rs.cohort_size > 0 ? std::size_t{front.rs.cohort_size} : expected_selected_;
  if (front.clients.size() >= expected || collecting_.size() > 1 ||
      seconds_since(front.last_arrival) > 1.0) {
    if (front.clients.size() < expected && collecting_.size() == 1) {
      COHORT_LOG(Warn) << "cohort-sim: round " << front.round << " selected "
                       << front.clients.size() << " clients, expected " << expected;
    }
    Collecting next = std::move(front);
    collecting_.pop_front();
    plan(std::move(next));
  }
}

Fleet::Job* Fleet::find_job(std::uint32_t c, std::uint64_t round, bool eval) {
  if (eval) {
    for (auto& j : evals_)
      if (j->client == c && j->rs.round == round) return j.get();
    return nullptr;
  }
  if (!active_ || active_->round != round) return nullptr;
  for (auto& j : active_->jobs)
    if (j->client == c && !j->done) return j.get();
  return nullptr;
}

void Fleet::on_pull_reply(std::uint32_t c, const transport::PullReply& r, const Message& m) {
  // A client may have requested two models (a cut client's old version and an evaluation):
  // a shard answers in order, so the reply belongs to its oldest request still waiting for
  // this shard.
  PulledModel* model = nullptr;
  for (auto& pm : models_) {
    if (pm->requester != c || pm->round != m.envelope.round || pm->pending == 0 ||
        r.shard >= pm->got.size() || pm->got[r.shard]) {
      continue;
    }
    if (!model || pm->seq < model->seq) model = pm.get();
  }
  if (!model) return;
  model->got[r.shard] = true;
  (void)client::pull_reply_for(shards_[r.shard], m);  // throws on a reply of the wrong shape
  std::memcpy(model->params->data() + r.begin, m.payload.data(), m.payload.size());
  if (--model->pending > 0) return;
  std::shared_ptr<const FloatBuffer> params = model->params;
  const std::vector<Job*> waiting = std::move(model->waiting);
  model->waiting.clear();
  for (Job* j : waiting) give_model(*j, params);
}

void Fleet::give_model(Job& job, std::shared_ptr<const FloatBuffer> params) {
  job.model = std::move(params);
  job.pulls_pending = 0;
  job.bytes_down += model_bytes();
  on_pulled(job);
}

std::uint64_t Fleet::model_bytes() const {
  std::uint64_t b = 0;
  for (const auto& s : shards_) b += (s.end - s.begin) * sizeof(float);
  return b;
}

void Fleet::request_model(Job& job) {
  const std::uint64_t version = job.rs.model_version;
  for (auto& pm : models_) {
    if (pm->version != version) continue;
    if (pm->pending == 0) {
      give_model(job, pm->params);
    } else {
      pm->waiting.push_back(&job);
    }
    return;
  }
  // Versions no job waits for any more are dropped (jobs keep their own reference).
  std::erase_if(models_, [](const auto& pm) { return pm->pending == 0; });
  auto pm = std::make_unique<PulledModel>();
  pm->version = version;
  pm->requester = job.client;
  pm->round = job.rs.round;
  pm->seq = ++starts_;
  pm->params = std::make_shared<FloatBuffer>(model_size_);
  pm->got.assign(shards_.size(), false);
  pm->pending = shards_.size();
  pm->waiting.push_back(&job);
  models_.push_back(std::move(pm));
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    send(i, job.client, client::pull_request(shards_[i], job.rs.round, version));
  }
}

void Fleet::on_push_ack(std::uint32_t c, const transport::PushAck& a, const Message& m) {
  Job* job = find_job(c, m.envelope.round, false);
  if (!job || job->acks_pending == 0) return;
  if (!a.accepted) job->refusals.push_back(a.reason);
  if (--job->acks_pending == 0) finish_training_job(*job);
}

}  // namespace cohort::sim
