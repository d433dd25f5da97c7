#include "cohort/aggregation/gossip.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::aggregation {

Gossip::Gossip(Comm& comm, const Topology& topology, GossipOptions options)
    : comm_(comm), topology_(topology), options_(options) {
  if (options_.staleness > 0 && topology_.time_varying()) {
    throw ConfigError("asynchronous gossip (staleness > 0) needs a static topology, not " +
                      std::string(topology_.name()));
  }
}

Neighbourhood Gossip::neighbourhood_at(std::uint64_t step) const {
  return neighbourhood(topology_.mixing(comm_.size(), step), comm_.rank(), gone_);
}

std::optional<PooledBuffer> Gossip::receive_from(Rank j, std::uint64_t step) {
  const bool suspect = suspects_.contains(j);
  auto m = comm_.recv(j, tag(step), suspect ? std::chrono::milliseconds(0) : options_.timeout);
  if (m && suspect) {
    suspects_.erase(j);
    COHORT_LOG(Info) << "gossip rank " << comm_.rank() << ": neighbour " << j << " is back";
  } else if (!m && !suspect) {
    suspects_.insert(j);
    COHORT_LOG(Warn) << "gossip rank " << comm_.rank() << ": neighbour " << j
                     << " sent nothing for " << options_.timeout.count()
                     << " ms; mixing without it";
  }
  return m;
}

void Gossip::mix(std::uint64_t step, std::span<const float> v, std::span<float> out) {
  COHORT_CHECK(out.size() == v.size()) << "mix: " << out.size() << " != " << v.size();
  COHORT_CHECK(out.data() != v.data() || v.empty()) << "mix: out must not alias v";
  if (options_.staleness > 0) {
    mix_stale(step, v, out);
    return;
  }
  const Neighbourhood nb = neighbourhood_at(step);
  for (const auto& [j, w] : nb.out) send_floats(comm_, j, tag(step), v);
  const std::size_t d = v.size();
  const float self = static_cast<float>(nb.self_weight);
  for (std::size_t k = 0; k < d; ++k) out[k] = self * v[k];
  double lost = 0;
  for (const auto& [j, w] : nb.in) {
    auto m = receive_from(j, step);
    if (!m) {
      lost += w;
      continue;
    }
    if (m->size() != d * sizeof(float)) {
      throw ProtocolError("gossip: rank " + std::to_string(j) + " sent " +
                          std::to_string(m->size()) + " bytes, expected " +
                          std::to_string(d * sizeof(float)));
    }
    const auto* in = reinterpret_cast<const float*>(m->data());
    const float wj = static_cast<float>(w);
    for (std::size_t k = 0; k < d; ++k) out[k] += wj * in[k];
  }
  if (lost > 0) {
    // A neighbour vanished during this step: its weight goes to our own model, as from now on.
    const float l = static_cast<float>(lost);
    for (std::size_t k = 0; k < d; ++k) out[k] += l * v[k];
  }
}

void Gossip::mix_stale(std::uint64_t step, std::span<const float> v, std::span<float> out) {
  const Neighbourhood nb = neighbourhood_at(step);
  for (const auto& [j, w] : nb.out) send_floats(comm_, j, tag(step), v);
  const std::size_t d = v.size();
  const float self = static_cast<float>(nb.self_weight);
  for (std::size_t k = 0; k < d; ++k) out[k] = self * v[k];
  double lost = 0;
  const std::uint64_t oldest = step >= options_.staleness ? step - options_.staleness : 0;
  const bool must_have = step >= options_.staleness;
  for (const auto& [j, w] : nb.in) {
    Latest& l = latest_[j];
    auto take = [&](PooledBuffer m) {
      if (m.size() != d * sizeof(float)) {
        throw ProtocolError("gossip: rank " + std::to_string(j) + " sent " +
                            std::to_string(m.size()) + " bytes, expected " +
                            std::to_string(d * sizeof(float)));
      }
      const auto* in = reinterpret_cast<const float*>(m.data());
      l.model.assign(in, in + d);
      l.has = true;
      ++l.next;
    };
    // Messages from one sender arrive in step order: wait (in order) for those up to the oldest
    // step we may use, then take whatever newer ones are already here.
    bool silent = false;
    while (must_have && l.next <= oldest && !silent) {
      auto m = receive_from(j, l.next);
      if (m) {
        take(std::move(*m));
      } else {
        silent = true;
      }
    }
    while (l.next <= step) {
      auto m = comm_.recv(j, tag(l.next), std::chrono::milliseconds(0));
      if (!m) break;
      take(std::move(*m));
    }
    if (!l.has || silent) {
      lost += w;
      continue;
    }
    const float wj = static_cast<float>(w);
    for (std::size_t k = 0; k < d; ++k) out[k] += wj * l.model[k];
  }
  if (lost > 0) {
    const float l = static_cast<float>(lost);
    for (std::size_t k = 0; k < d; ++k) out[k] += l * v[k];
  }
}

double Gossip::push(std::uint64_t step, std::span<float> x, double w) {
  const Neighbourhood nb = neighbourhood_at(step);
  // Column view: our mass splits over ourselves (P_ii) and our out-neighbours (P_ji); shares of
  // gone out-neighbours stay with us.
  const MixingMatrix p = topology_.mixing(comm_.size(), step);
  const Rank i = comm_.rank();
  double keep = p(i, i);
  for (Rank j = 0; j < p.size(); ++j) {
    if (j != i && p(j, i) > 0 && gone_.contains(j)) keep += p(j, i);
  }
  const std::size_t d = x.size();
  // Message: d floats of P_ji x, then P_ji w as a double in the last 8 bytes.
  scratch_.resize(d + 2);
  for (const auto& [j, share] : nb.out) {
    const float s = static_cast<float>(share);
    for (std::size_t k = 0; k < d; ++k) scratch_[k] = s * x[k];
    const double ws = share * w;
    std::memcpy(scratch_.data() + d, &ws, sizeof ws);
    send_floats(comm_, j, tag(step), scratch_);
  }
  const float kf = static_cast<float>(keep);
  for (std::size_t k = 0; k < d; ++k) x[k] *= kf;
  double new_w = keep * w;
  for (const auto& [j, weight] : nb.in) {
    (void)weight;  // the sender scaled its message
    auto m = receive_from(j, step);
    if (!m) continue;
    if (m->size() != (d + 2) * sizeof(float)) {
      throw ProtocolError("push-sum: rank " + std::to_string(j) + " sent " +
                          std::to_string(m->size()) + " bytes, expected " +
                          std::to_string((d + 2) * sizeof(float)));
    }
    const auto* in = reinterpret_cast<const float*>(m->data());
    for (std::size_t k = 0; k < d; ++k) x[k] += in[k];
    double ws = 0;
    std::memcpy(&ws, in + d, sizeof ws);
    if (!std::isfinite(ws) || ws < 0) {
      throw ProtocolError("push-sum: rank " + std::to_string(j) + " sent a bad weight");
    }
    new_w += ws;
  }
  return new_w;
}

std::vector<Gossip::Received> Gossip::exchange(std::uint64_t step, std::span<const std::byte> bytes,
                                               double* self_weight) {
  const Neighbourhood nb = neighbourhood_at(step);
  for (const auto& [j, w] : nb.out) comm_.send(j, tag(step), bytes);
  std::vector<Received> got;
  for (const auto& [j, w] : nb.in) {
    auto m = receive_from(j, step);
    if (!m) continue;
    got.push_back({j, w, std::move(*m)});
  }
  if (self_weight) *self_weight = nb.self_weight;
  return got;
}

}  // namespace cohort::aggregation
