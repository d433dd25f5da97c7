// What the coordinator shows on the HTTP endpoint: its state, the membership counts and the client
// table (telemetry.h).

#include "coordinator.h"

namespace cohort::server {

CoordinatorSnapshot Coordinator::snapshot() const {
  CoordinatorSnapshot s;
  if (finished_) {
    s.state = failure_.empty() ? "finished" : "failed";
  } else if (state_ == State::kIdle && committed_ == 0 && round_ == 0) {
    s.state = "waiting";
  } else {
    s.state = "running";
  }
  s.rounds_planned = rounds_;
  s.registered = registered_clients();
  s.selected = federated() ? selected_.size() : busy_.size();
  s.reporting = federated() ? reporters_.size() : 0;
  const std::size_t live = live_clients();
  s.unreachable = s.registered > live ? s.registered - live : 0;
  for (const auto& [id, c] : clients_) {
    if (s.clients.size() >= kMaxClientRows) break;
    std::string state = "idle";
    if (!c.reachable) {
      state = "unreachable";
    } else if (reporters_.contains(id)) {
      state = "reported";
    } else if (selected_.contains(id) || busy_.contains(id)) {
      state = "training";
    }
    s.clients.push_back({id, std::move(state)});
  }
  return s;
}

std::optional<std::uint32_t> Coordinator::shard_of(const NodeId& id) const {
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i].up && shards_[i].node_id == id) return static_cast<std::uint32_t>(i);
  }
  return std::nullopt;
}

}  // namespace cohort::server
