#include "shard.h"

#include <algorithm>
#include <random>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/kernels/network.h"

#include "modes/modes.h"

namespace cohort::server {

using transport::Envelope;
using transport::Message;

std::pair<std::uint64_t, std::uint64_t> shard_range(std::uint64_t size, std::uint32_t shards,
                                                    std::uint32_t index) {
  const std::uint64_t base = size / shards, extra = size % shards;
  const std::uint64_t begin = index * base + std::min<std::uint64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

// ---- ShardCore ----------------------------------------------------------------------------

ShardCore::ShardCore(const CheckpointOptions& checkpoint, Outbox& o, std::uint32_t i,
                     std::uint32_t n, MetricsSink* m)
    : checkpoint_every(checkpoint.every), out(o), metrics(m), index(i), shards(n) {
  if (!checkpoint.dir.empty()) store.emplace(checkpoint.dir, "shard-" + std::to_string(i));
}

void ShardCore::reply_ack(const Message& m, bool ok, std::string reason) {
  if (ok) {
    ++stats.accepted;
  } else {
    ++stats.refused[reason_class(reason)];
  }
  Envelope e;
  e.round = m.envelope.round;
  e.body = transport::PushAck{.accepted = ok, .reason = std::move(reason), .version = version};
  out.send(m.peer, std::move(e));
}

void ShardCore::serve_pull(const Message& m, const transport::Pull& p, std::uint32_t batch_size) {
  if (p.begin < begin || p.end > end || p.begin > p.end) {
    Envelope e;
    e.body =
        transport::ErrorBody{.code = transport::ErrorCode::kBadRange,
                             .message = "shard " + std::to_string(index) + " owns [" +
                                        std::to_string(begin) + ", " + std::to_string(end) + ")",
                             .ref_seq = m.envelope.seq};
    out.send(m.peer, std::move(e));
    return;
  }
  Envelope e;
  e.round = m.envelope.round;
  e.body = transport::PullReply{.shard = index,
                                .begin = p.begin,
                                .end = p.end,
                                .version = version,
                                .encoding = transport::Encoding::kDenseF32,
                                .batch_size = batch_size};
  if (!snapshot_current_) {
    // Only this shard hands out copies of the pointer: a count of one means no send reads it.
    if (pull_snapshot_ && pull_snapshot_.use_count() == 1 &&
        pull_snapshot_->size() == params_.size()) {
      std::copy(params_.begin(), params_.end(), pull_snapshot_->begin());
    } else {
      pull_snapshot_ = std::make_shared<FloatBuffer>(params_.span());
    }
    snapshot_current_ = true;
  }
  const auto slice = std::span<const float>(pull_snapshot_->data(), size())
                         .subspan(p.begin - begin, p.end - p.begin);
  stats.pull_bytes += slice.size_bytes();
  out.send(m.peer, std::move(e), transport::Payload{as_bytes(slice), pull_snapshot_});
}

void ShardCore::checkpoint() {
  if (!store || params_.empty()) return;
  ShardState s;
  s.shard = index;
  s.shards = shards;
  s.begin = begin;
  s.end = end;
  s.round = last_closed;
  s.version = version;
  s.model_spec = model_spec;
  s.params = params_.clone();
  for (auto& [name, span] : optimizer->state())
    s.optimizer_state.emplace_back(name, FloatBuffer(span));
  try {
    store->save(s);
    stats.last_checkpoint = std::chrono::steady_clock::now();
  } catch (const DataError& e) {
    ++stats.checkpoint_failures;
    COHORT_LOG(Error) << "checkpoint failed, the previous one stays: " << e.what();
  }
}

void ShardCore::checkpoint_if_due(std::uint64_t count) {
  if (!store) return;
  if (count % checkpoint_every == 0) checkpoint();
}

std::string ShardCore::rule_refusal(std::size_t n) const {
  return "shard " + std::to_string(index) + ": aggregator '" + aggregator_name +
         "' could not aggregate " + std::to_string(n) + " complete update(s) (it needs at least " +
         std::to_string(aggregator->min_updates()) + ")";
}

void ShardCore::finish_close(std::uint64_t round, bool commit) {
  prepared_round = 0;
  prepared = {};
  committed += commit ? 1 : 0;
  last_closed = round;
  if (commit) checkpoint_if_due(committed);
}

std::unique_ptr<aggregation::PushDecoder> ShardCore::take_decoder(aggregation::WireFormat format) {
  if (spare_decoders.empty())
    spare_decoders.push_back(std::make_unique<aggregation::PushDecoder>());
  auto d = std::move(spare_decoders.back());
  spare_decoders.pop_back();
  d->reset(size(), format);
  return d;
}

void ShardCore::give_back(std::unique_ptr<aggregation::PushDecoder> decoder) {
  if (decoder) spare_decoders.push_back(std::move(decoder));
}

// ---- Shard ------------------------------------------------------------------------------

namespace {

std::unique_ptr<ShardMode> make_mode(ShardCore& core, const ServerOptions& options,
                                     const Clock& clock) {
  switch (options.modes.mode) {
    case transport::TrainingMode::kFederated:
      return make_federated_mode(core, options.dp, options.normalization,
                                 options.secagg.kind != SecAggKind::kNone);
    case transport::TrainingMode::kBuffered: return make_fedbuff_mode(core, options.fedbuff);
    case transport::TrainingMode::kDataParallel:
      return make_dataparallel_mode(core, options.modes.consistency, options.dataparallel, clock);
  }
  throw ConfigError("unknown training mode");
}

}  // namespace

Shard::Shard(const ServerOptions& options, const Registries& registries, Outbox& out,
             MetricsSink* metrics, const Clock& clock)
    : registries_(registries),
      modes_(options.modes),
      aggregator_name_(options.aggregator_name),
      aggregator_options_(options.aggregator),
      optimizer_name_(options.optimizer_name),
      optimizer_options_(options.optimizer),
      checkpoint_dir_(options.checkpoint.dir),
      model_seed_(options.model.seed),
      core_(options.checkpoint, out, options.node.index, options.node.shards, metrics),
      mode_(make_mode(core_, options, clock)) {}

Shard::~Shard() = default;

void Shard::setup(const std::string& model_spec, std::uint64_t model_size) {
  ShardCore& c = core_;
  auto [b, e] = shard_range(model_size, c.shards, c.index);
  c.begin = b;
  c.end = e;
  c.model_spec = model_spec;
  c.aggregator_name = aggregator_name_;
  c.aggregator = registries_.aggregators.create(c.aggregator_name, aggregator_options_);
  c.optimizer = registries_.server_optimizers.create(optimizer_name_, optimizer_options_);
  c.optimizer->reset(size());
  if (c.store) {
    std::vector<std::string> skipped;
    auto state = c.store->load_latest(&skipped);
    for (const auto& s : skipped) COHORT_LOG(Warn) << "shard " << c.index << ": skipped " << s;
    if (state) {
      if (state->begin != c.begin || state->end != c.end || state->model_spec != model_spec) {
        throw ConfigError("checkpoint in " + checkpoint_dir_ +
                          " is for another model or shard layout (" + state->model_spec + ")");
      }
      c.set_params(std::move(state->params));
      c.version = state->version;
      c.last_closed = state->round;
      for (auto& [name, buf] : state->optimizer_state) {
        for (auto& [slot, span] : c.optimizer->state()) {
          if (slot == name && span.size() == buf.size())
            std::copy(buf.begin(), buf.end(), span.begin());
        }
      }
      COHORT_LOG(Info) << "shard " << c.index << ": resumed from checkpoint at round "
                       << c.last_closed << " (version " << c.version << ")";
      return;
    }
  }
  FloatBuffer full(model_size);
  kernels::make_network_spec(model_spec).initialize(model_seed_, full.span());
  c.set_params(FloatBuffer(full.span().subspan(c.begin, size())));
  COHORT_LOG(Info) << "shard " << c.index << ": owns [" << c.begin << ", " << c.end << ") of "
                   << model_size << " parameters";
}

std::size_t Shard::rule_min_updates() const {
  return core_.aggregator ? core_.aggregator->min_updates() : 1;
}

void Shard::open_round(std::uint64_t round, const std::vector<NodeId>& clients) {
  mode_->open_round(round, clients);
}

bool Shard::handle(Message& m) {
  if (auto* p = std::get_if<transport::Pull>(&m.envelope.body)) {
    mode_->on_pull(m, *p);
    return true;
  }
  if (auto* p = std::get_if<transport::Push>(&m.envelope.body)) {
    core_.stats.push_bytes += m.payload.size();
    mode_->on_push(m, *p);
    return true;
  }
  return false;
}

Prepared Shard::prepare_round(std::uint64_t round) {
  if (round <= core_.last_closed) return {true, ""};  // committed already: a late retry
  if (core_.prepared_round == round) return core_.prepared;
  core_.prepared_round = round;
  core_.prepared = {};
  mode_->prepare(round);
  return core_.prepared;
}

std::uint64_t Shard::close_round(std::uint64_t round, bool commit) {
  if (round <= core_.last_closed) return core_.version;  // repeated close (coordinator retry)
  // A commit without phase one (a coordinator that skipped it) prepares now.
  if (commit && core_.prepared_round != round) (void)prepare_round(round);
  mode_->close(round, commit);
  return core_.version;
}

void Shard::on_welcome(std::uint64_t epoch, std::uint64_t committed) {
  const bool restarted = coordinator_epoch_ != 0 && epoch != coordinator_epoch_;
  coordinator_epoch_ = epoch;
  if (!restarted) return;
  const bool rounds = modes_.mode != transport::TrainingMode::kDataParallel;
  if (rounds && committed == core_.last_closed + 1 && core_.prepared_round == committed &&
      core_.prepared.ok) {
    COHORT_LOG(Info) << "shard " << core_.index
                     << ": the coordinator restarted having committed round " << committed
                     << ", which this shard had prepared: committing it";
    (void)close_round(committed, true);
  } else if (rounds && committed != core_.last_closed) {
    COHORT_LOG(Warn) << "shard " << core_.index << ": the coordinator restarted at round "
                     << committed << ", this shard's model is at round " << core_.last_closed
                     << " (checkpoints taken at different rounds?)";
  }
  mode_->on_coordinator_restart();
}

}  // namespace cohort::server
