// The coordinator's secure aggregation (server.secure_aggregation; docs/ALGORITHMS.md 8.5): the
// round's SecAggRound, its cohort and weights, and its stages between the round's last report
// and phase one of the close.
#include "coordinator.h"

namespace cohort::server {

using transport::Envelope;

void Coordinator::make_secagg(const SecAggOptions& options) {
  SecAggRound::Shards shards;
  shards.count = shards_.size();
  shards.send = [this](std::size_t i, Envelope e, transport::Payload p) {
    auto& s = shards_.at(i);
    if (!s.up) return false;
    if (!out_.send(s.peer, std::move(e), std::move(p))) s.up = false;
    return s.up;
  };
  shards.node = [this](std::size_t i) { return shards_.at(i).node_id; };
  shards.local_held = [this](std::uint64_t round) { return local_.secagg_held(round); };
  shards.local_seeds = [this](std::uint64_t round, const transport::SecAggData& d) {
    local_.secagg_seeds(round, d);
  };
  secagg_.emplace(options, out_, clock_, std::move(shards));
}

// Secure aggregation's stages while the round runs and while it unmasks: a failed stage fails
// the round (nothing is committed); unmasked, the round's close goes on with phase one.
void Coordinator::tick_secagg() {
  if (!secagg_ || (state_ != State::kRunning && state_ != State::kUnmasking)) return;
  secagg_->tick();
  if (secagg_->stage() == SecAggRound::Stage::kFailed) {
    if (state_ == State::kRunning) write_client_records();
    round_failed(secagg_->failure());
    if (finished_) return;
    closing_round_ = round_;
    close_round(false);
  } else if (state_ == State::kUnmasking && secagg_->stage() == SecAggRound::Stage::kDone) {
    prepare_close(round_, secagg_->survivors());
  }
}

// The cohort's secure aggregation: each member scales its update by n_k over the cohort's
// samples (FedAvg's weights), or by 1/m under DP (every client weighs alike).
void Coordinator::begin_secagg() {
  std::vector<SecAggRound::Member> members;
  double samples = 0;
  for (const auto& id : selected_) samples += static_cast<double>(clients_.at(id).dataset_size);
  for (const auto& id : selected_) {
    const auto& c = clients_.at(id);
    const double w = dp_uniform_ || samples <= 0 ? 1.0 / static_cast<double>(selected_.size())
                                                 : static_cast<double>(c.dataset_size) / samples;
    members.push_back({.id = c.index, .node = id, .peer = c.peer, .weight = w});
  }
  secagg_->begin(round_, std::move(members), model_size_);
}

}  // namespace cohort::server
