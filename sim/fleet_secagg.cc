// cohort-sim's fleet under secure aggregation (server.secure_aggregation): each selected virtual
// client runs the protocol's stages through client::SecAggSession, as cohort-client does. The
// heavy steps (taking the keys and sealing shares, opening the forwarded shares, masking the
// input: O(k) key agreements and O(k d) keystream each) run on the training threads, so a cohort
// of a thousand does not stall the fleet's thread; their results are sent from the fleet's
// thread. The round's virtual clock is charged the stages: the slowest client's measured protocol
// compute, the slowest stage transfer over its link, and four round trips (keys, shares, inputs,
// unmasking). Private to sim/.
#include <algorithm>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "fleet.h"

namespace cohort::sim {

using transport::Envelope;
using transport::Message;
using transport::SecAggStage;

void Fleet::send_secagg(std::uint32_t c, std::uint64_t round, SecAggStage stage,
                        const transport::SecAggData& data) {
  auto bytes = std::make_shared<std::vector<std::byte>>(transport::encode_secagg(data));
  secagg_[c].up += bytes->size();
  Envelope e;
  e.round = round;
  e.body = transport::SecAgg{.round = round, .stage = stage};
  send(0, c, std::move(e), transport::Payload{*bytes, bytes});
}

void Fleet::secagg_begin(std::uint32_t c, const transport::RoundStart& rs) {
  if (secagg_round_ != rs.round) {
    secagg_prev_ = std::move(secagg_);
    secagg_prev_round_ = secagg_round_;
    secagg_.clear();
    secagg_round_ = rs.round;
  }
  const double t0 = thread_cpu_seconds();
  auto& s = secagg_[c];
  s.session = std::make_shared<client::SecAggSession>(c, rs.round, model_size_);
  const auto advert = s.session->advertise();
  s.cpu_s += thread_cpu_seconds() - t0;
  send_secagg(c, rs.round, SecAggStage::kAdvertise, advert);
}

// Runs `step` (a session's heavy step) on a training thread; collect_secagg() sends its answer.
void Fleet::secagg_task(std::uint32_t c, std::uint64_t round,
                        std::function<SecAggOut(client::SecAggSession&)> step) {
  auto session = secagg_.at(c).session;  // kept alive by the task, whatever the next round does
  ++secagg_tasks_;
  pool_.submit([this, c, round, session, step = std::move(step)] {
    const double t0 = thread_cpu_seconds();
    SecAggOut out;
    try {
      out = step(*session);
    } catch (const ProtocolError& e) {
      out.error = e.what();
    }
    out.client = c;
    out.round = round;
    out.cpu_s = thread_cpu_seconds() - t0;
    std::lock_guard lock(secagg_mu_);
    secagg_done_.push_back(std::move(out));
  });
}

void Fleet::collect_secagg() {
  std::vector<SecAggOut> done;
  {
    std::lock_guard lock(secagg_mu_);
    done.swap(secagg_done_);
  }
  for (auto& out : done) {
    --secagg_tasks_;
    if (out.round != secagg_round_) continue;  // a finished round's
    auto& s = secagg_[out.client];
    s.cpu_s += out.cpu_s;
    if (!out.error.empty()) {
      COHORT_LOG(Warn) << name_of(out.client) << ": secure aggregation, round " << out.round << ": "
                       << out.error;
      continue;
    }
    if (out.masked) {
      s.masked = std::move(out.masked);
    } else if (out.send) {
      send_secagg(out.client, out.round, *out.send, out.data);
    } else {
      s.opened = true;
    }
  }
}

void Fleet::on_secagg(std::uint32_t c, const Message& m, const transport::SecAgg& sa) {
  const auto it = secagg_.find(c);
  if (sa.round != secagg_round_ || it == secagg_.end() || !m.complete) return;
  auto& s = it->second;
  s.down += m.payload.size();
  transport::SecAggData d;
  try {
    d = transport::decode_secagg(m.payload.span());
  } catch (const ProtocolError& e) {
    COHORT_LOG(Warn) << name_of(c) << ": secure aggregation, round " << sa.round << ": "
                     << e.what();
    return;
  }
  if (sa.stage == SecAggStage::kKeys) {
    secagg_task(c, sa.round, [d = std::move(d)](client::SecAggSession& session) {
      return SecAggOut{.send = SecAggStage::kShares, .data = session.on_keys(d)};
    });
  } else if (sa.stage == SecAggStage::kForwarded) {
    secagg_task(c, sa.round, [d = std::move(d)](client::SecAggSession& session) {
      session.on_forwarded(d);
      return SecAggOut{};
    });
  } else if (sa.stage == SecAggStage::kUnmask) {
    const double t0 = thread_cpu_seconds();
    try {
      const auto answer = s.session->on_unmask(d);
      s.cpu_s += thread_cpu_seconds() - t0;
      send_secagg(c, sa.round, SecAggStage::kUnmaskShares, answer);
    } catch (const ProtocolError& e) {
      COHORT_LOG(Warn) << name_of(c) << ": secure aggregation, round " << sa.round << ": "
                       << e.what();
    }
  }
}

void Fleet::secagg_prepare_inputs(Active& a) {
  for (std::size_t i = a.next_push; i < a.completers; ++i) {
    Job& job = *a.jobs[i];
    if (!job.rs.secure_aggregation || !job.trained || job.mask_requested) continue;
    const auto it = secagg_.find(job.client);
    if (it == secagg_.end() || !it->second.opened || secagg_round_ != job.rs.round) continue;
    job.mask_requested = true;
    const auto seed = sim_.data.seed * 7919ULL + job.rs.round * 104729ULL + job.client;
    secagg_task(job.client, job.rs.round,
                [delta = job.delta, seed](client::SecAggSession& session) {
                  return SecAggOut{.masked = std::make_shared<std::vector<std::uint32_t>>(
                                       session.masked_input(delta->span(), seed))};
                });
  }
}

bool Fleet::secagg_ready(const Job& job) const {
  if (!job.rs.secure_aggregation) return true;
  const auto it = secagg_.find(job.client);
  return it != secagg_.end() && secagg_round_ == job.rs.round && it->second.masked != nullptr;
}

std::shared_ptr<std::vector<std::uint32_t>> Fleet::secagg_mask(const Job& job) {
  return std::move(secagg_.at(job.client).masked);
}

double Fleet::secagg_charge(const Active& a, RoundRecord& rec) {
  // The round's own clients: the next round may have begun its stages already.
  const auto& round = a.rs.round == secagg_round_ ? secagg_ : secagg_prev_;
  if (a.rs.round != secagg_round_ && a.rs.round != secagg_prev_round_) return rec.secagg_s = 0;
  double cpu = 0, transfer = 0, latency = 0;
  for (const auto& j : a.jobs) {
    const auto it = round.find(j->client);
    if (it == round.end()) continue;
    const auto& s = it->second;
    cpu = std::max(cpu, s.cpu_s);
    transfer =
        std::max(transfer, static_cast<double>(s.up) * 8 / (j->profile.uplink_mbps * 1e6) +
                               static_cast<double>(s.down) * 8 / (j->profile.downlink_mbps * 1e6));
    latency = std::max(latency, j->profile.latency_ms * 1e-3);
    rec.bytes += s.up + s.down;
    rec.secagg_bytes += s.up + s.down;
  }
  rec.secagg_s = cpu + transfer + 8 * latency;
  return rec.secagg_s;
}

}  // namespace cohort::sim
