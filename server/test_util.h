// Test helpers for the shard and coordinator unit tests: a recording Outbox, options from
// "key=value" overrides (as run() builds them), and messages built as node.cc would receive
// them. Tests only.
#pragma once

#include <cstring>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cohort/aggregation/registries.h"
#include "cohort/core/config.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"

#include "options.h"
#include "outbox.h"
#include "server_options.h"

namespace cohort::server::testing {

// One message the code under test sent: who to, the envelope, and a copy of the payload.
struct Sent {
  transport::PeerHandle peer;
  transport::Envelope envelope;
  std::vector<std::byte> payload;
  transport::Payload lent;  // the payload as handed over: its bytes stay valid while its owner does
};

class RecordingOutbox final : public Outbox {
 public:
  using Outbox::send;
  bool send(const transport::PeerHandle& peer, transport::Envelope envelope,
            transport::Payload payload) override {
    sent.push_back({.peer = peer,
                    .envelope = std::move(envelope),
                    .payload = {payload.bytes.begin(), payload.bytes.end()},
                    .lent = payload.owner ? payload : transport::Payload{}});
    return !gone.contains(peer);
  }
  // The messages of body type T, in order.
  template <typename T>
  std::vector<std::pair<Sent, T>> of() const {
    std::vector<std::pair<Sent, T>> out;
    for (const auto& s : sent) {
      if (const auto* b = std::get_if<T>(&s.envelope.body)) out.emplace_back(s, *b);
    }
    return out;
  }
  template <typename T>
  [[nodiscard]] std::size_t count() const {
    return of<T>().size();
  }

  std::vector<Sent> sent;
  std::set<transport::PeerHandle> gone;  // sends to these fail (the peer's connection is gone)
};

// The defaults of cohort-server with `overrides` ("key=value") on top; a 6-parameter model.
inline Config make_config(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"model.spec=mlp:2-2", "server.eval_every=0"});
  return Config::load(config_schema(), std::nullopt, overrides);
}

// The ConfigError that start-up's validate() throws for `overrides` (plus tls.insecure = true,
// so no key files are needed), or "" if it throws none.
inline std::string validate_error(std::vector<std::string> overrides) {
  overrides.emplace_back("tls.insecure=true");
  try {
    validate(make_config(std::move(overrides)), builtin_registries());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The server's options from make_config(overrides), filled as run() fills them.
inline ServerOptions make_options(std::vector<std::string> overrides) {
  return server_options_from(make_config(std::move(overrides)));
}

// A message as node.cc hands it over: from `sender` (peer handle "peer:<sender>").
inline transport::Message message(const NodeId& sender, transport::Body body,
                                  std::uint64_t round = 0, std::uint64_t seq = 1) {
  transport::Message m;
  m.peer = "peer:" + sender;
  m.sender = sender;
  m.envelope.sender = sender;
  m.envelope.seq = seq;
  m.envelope.round = round;
  m.envelope.body = std::move(body);
  return m;
}

// Lends `bytes` as a received payload (the test keeps them alive while the message lives).
inline PooledBuffer lend(std::span<float> values) {
  return PooledBuffer::wrap(
      reinterpret_cast<std::byte*>(values.data()), values.size_bytes(), [](void*) noexcept {},
      nullptr);
}

// Chunk [first, first + n) of a dense fp32 push of `values` (all of it when n is the size),
// with envelope.payload_bytes of the whole transfer.
inline transport::Message push_chunk(const NodeId& sender, const transport::Push& push,
                                     std::uint64_t round, std::uint64_t seq,
                                     std::span<float> values, std::size_t first, std::size_t n,
                                     bool complete) {
  auto m = message(sender, push, round, seq);
  m.envelope.payload_bytes = values.size_bytes();
  m.offset = first * sizeof(float);
  m.payload = lend(values.subspan(first, n));
  m.complete = complete;
  return m;
}

// A whole dense push in one message.
inline transport::Message push_all(const NodeId& sender, const transport::Push& push,
                                   std::uint64_t round, std::uint64_t seq,
                                   std::span<float> values) {
  return push_chunk(sender, push, round, seq, values, 0, values.size(), true);
}

// What client `id` sends for a trained round: a whole dense push of `update` (kept alive by the
// caller) for [begin, end) of shard 0, then its report of `round` as trained with 10 samples and
// the measurements of `measured`.
inline std::pair<transport::Message, transport::Message> trained_round(
    const NodeId& id, std::uint64_t round, std::uint64_t& seq, std::uint64_t begin,
    std::uint64_t end, std::span<float> update, transport::ClientReport measured = {}) {
  auto push = push_all(
      id,
      transport::Push{
          .shard = 0, .begin = begin, .end = end, .num_samples = 10, .elements = update.size()},
      round, ++seq, update);
  measured.round = round;
  measured.trained = true;
  measured.num_samples = 10;
  auto report = message(id, std::move(measured), round, ++seq);
  return {std::move(push), std::move(report)};
}

}  // namespace cohort::server::testing
