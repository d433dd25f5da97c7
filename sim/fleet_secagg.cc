// cohort-sim's fleet under secure aggregation (server.secure_aggregation): each selected virtual
// client runs the protocol's stages through client::SecAggSession, as cohort-client does, and the
// round's virtual clock is charged the stages: the slowest client's measured protocol compute,
// the slowest stage transfer over its link, and four round trips (keys, shares, inputs,
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
    secagg_.clear();
    secagg_round_ = rs.round;
  }
  const double t0 = thread_cpu_seconds();
  auto& s = secagg_[c];
  s.session = std::make_unique<client::SecAggSession>(c, rs.round, model_size_);
  const auto advert = s.session->advertise();
  s.cpu_s += thread_cpu_seconds() - t0;
  send_secagg(c, rs.round, SecAggStage::kAdvertise, advert);
}

void Fleet::on_secagg(std::uint32_t c, const Message& m, const transport::SecAgg& sa) {
  const auto it = secagg_.find(c);
  if (sa.round != secagg_round_ || it == secagg_.end() || !m.complete) return;
  auto& s = it->second;
  s.down += m.payload.size();
  const double t0 = thread_cpu_seconds();
  try {
    const auto d = transport::decode_secagg(m.payload.span());
    if (sa.stage == SecAggStage::kKeys) {
      const auto shares = s.session->on_keys(d);
      s.cpu_s += thread_cpu_seconds() - t0;
      send_secagg(c, sa.round, SecAggStage::kShares, shares);
      return;
    }
    if (sa.stage == SecAggStage::kForwarded) s.session->on_forwarded(d);
    if (sa.stage == SecAggStage::kUnmask) {
      const auto answer = s.session->on_unmask(d);
      s.cpu_s += thread_cpu_seconds() - t0;
      send_secagg(c, sa.round, SecAggStage::kUnmaskShares, answer);
      return;
    }
  } catch (const ProtocolError& e) {
    COHORT_LOG(Warn) << name_of(c) << ": secure aggregation, round " << sa.round << ": "
                     << e.what();
  }
  s.cpu_s += thread_cpu_seconds() - t0;
}

bool Fleet::secagg_ready(const Job& job) const {
  if (!job.rs.secure_aggregation) return true;
  const auto it = secagg_.find(job.client);
  return it != secagg_.end() && secagg_round_ == job.rs.round && it->second.session->masking();
}

std::shared_ptr<std::vector<std::uint32_t>> Fleet::secagg_mask(const Job& job) {
  auto& s = secagg_.at(job.client);
  const double t0 = thread_cpu_seconds();
  const auto seed = sim_.data.seed * 7919ULL + job.rs.round * 104729ULL + job.client;
  auto y = std::make_shared<std::vector<std::uint32_t>>(
      s.session->masked_input(job.delta->span(), seed));
  s.cpu_s += thread_cpu_seconds() - t0;
  return y;
}

double Fleet::secagg_charge(const Active& a, RoundRecord& rec) {
  double cpu = 0, transfer = 0, latency = 0;
  for (const auto& j : a.jobs) {
    const auto it = secagg_.find(j->client);
    if (it == secagg_.end()) continue;
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
