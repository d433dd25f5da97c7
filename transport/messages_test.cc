#include "cohort/transport/messages.h"

#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "cohort/core/error.h"
#include "cohort/transport/secagg_messages.h"

using namespace cohort::transport;

namespace {

Envelope wrap(Body body) {
  Envelope e;
  e.sender = "client-7";
  e.seq = 42;
  e.round = 9;
  e.payload_bytes = 3 << 20;
  e.chunk_bytes = 1 << 20;
  e.body = std::move(body);
  return e;
}

std::vector<Body> every_body() {
  return {
      Register{Role::kClient, 6000, "cuda:0", "tcp://10.0.0.1:5000", 77, 2, "iid 3/10", true},
      Welcome{3,
              235146,
              "mlp:784-256-128-10",
              {{0, "tcp://a:1", "shard-0", 0, 117573}, {1, "tcp://b:2", "shard-1", 117573, 235146}},
              5,
              1000,
              "epochs = 1\n",
              0x1234567890abcdefULL},
      Heartbeat{12, 0.5f},
      RoundStart{4, 30000, 1, 0, 0.05f, 4, true, TrainingMode::kDataParallel, 32, 12, true},
      Pull{1, 10, 20, 3},
      PullReply{1, 10, 20, 4, Encoding::kDenseBf16, 48},
      Push{1, 10, 20, 600, 4, Encoding::kTopK, PushKind::kGradient, 0.25f, 17, 10, 8.5f},
      PushAck{false, "late", 5, true},
      ChunkHeader{41, 2, 3, 2 << 20},
      ErrorBody{ErrorCode::kBadRange, "range out of shard", 40},
      GossipExchange{8, 3, 0.25, Encoding::kSign, 1000},
      AllreduceChunk{5, 2, 1, 3, 4096, 1024},
      Bye{"done"},
      RoundClose{7, true, 9, true},
      ClientReport{7,
                   true,
                   600,
                   0.5f,
                   1.5f,
                   0.25f,
                   100,
                   200,
                   true,
                   0.4f,
                   0.85f,
                   10000,
                   6,
                   "ok",
                   true,
                   40,
                   512.5f,
                   {{0, 1000, 0.5f, 2000, 0.25f}, {1, 3000, 0.75f, 4000, 1.5f}},
                   std::uint64_t{1} << 24,
                   1,
                   64,
                   true},
      RoundOpen{8, {"client-1", "client-7", "c00042"}},
      SecAgg{8, SecAggStage::kUnmaskShares},
      Telemetry{3},
  };
}

}  // namespace

TEST_CASE("every message body round-trips through encode and decode") {
  const auto bodies = every_body();
  CHECK(bodies.size() == std::variant_size_v<Body>);
  for (const auto& body : bodies) {
    CAPTURE(body_name(body));
    const Envelope e = wrap(body);
    const auto bytes = encode(e);
    CHECK(bytes.size() % 8 == 0);
    CHECK(decode(bytes) == e);
  }
}

TEST_CASE("decode works on unaligned input") {
  const auto bytes = encode(wrap(Heartbeat{1, 2}));
  std::vector<std::byte> shifted(bytes.size() + 1);
  std::copy(bytes.begin(), bytes.end(), shifted.begin() + 1);
  CHECK(decode(std::span(shifted).subspan(1)) == wrap(Heartbeat{1, 2}));
}

TEST_CASE("malformed envelopes are ProtocolErrors, never crashes") {
  std::mt19937_64 rng(7);
  SUBCASE("random bytes") {
    for (int i = 0; i < 2000; ++i) {
      std::vector<std::byte> junk(8 * (1 + rng() % 64));
      for (auto& b : junk) b = static_cast<std::byte>(rng());
      try {
        (void)decode(junk);
      } catch (const cohort::ProtocolError&) {
      }
    }
  }
  SUBCASE("every truncation of a valid message") {
    const auto bytes = encode(wrap(every_body()[1]));
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      CAPTURE(n);
      CHECK_THROWS_AS((void)decode(std::span(bytes).first(n)), cohort::ProtocolError);
    }
  }
  SUBCASE("bit flips of a valid message") {
    const auto bytes = encode(wrap(every_body()[1]));
    for (std::size_t bit = 0; bit < bytes.size() * 8; ++bit) {
      auto copy = bytes;
      copy[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      try {
        (void)decode(copy);
      } catch (const cohort::ProtocolError&) {
      }
    }
  }
  SUBCASE("oversize") {
    std::vector<std::byte> big(kMaxEnvelopeBytes + 8);
    CHECK_THROWS_WITH_AS((void)decode(big), doctest::Contains("exceeds"), cohort::ProtocolError);
  }
  SUBCASE("absurd list length and deep pointers") {
    // A segment table claiming one segment of 2^31 words, then a root pointer far out of bounds.
    std::vector<std::byte> msg(64);
    const std::uint32_t header[2] = {0, 0x7fffffff};
    std::memcpy(msg.data(), header, sizeof header);
    CHECK_THROWS_AS((void)decode(msg), cohort::ProtocolError);
    // Root struct pointer whose list field claims 2^29 elements.
    auto valid = encode(wrap(every_body()[1]));
    for (std::size_t off = 8; off + 8 <= valid.size(); off += 8) {
      auto copy = valid;
      const std::uint64_t list_ptr =
          0x1 | (std::uint64_t{5} << 32) | (std::uint64_t{0x1fffffff} << 35);
      std::memcpy(copy.data() + off, &list_ptr, 8);
      try {
        (void)decode(copy);
      } catch (const cohort::ProtocolError&) {
      }
    }
  }
  SUBCASE("wrong protocol version and bad sender") {
    auto e = wrap(Heartbeat{});
    e.protocol_version = 99;
    CHECK_THROWS_WITH_AS((void)decode(encode(e)), doctest::Contains("protocol version"),
                         cohort::ProtocolError);
    e = wrap(Heartbeat{});
    e.sender = "bad id with spaces";
    CHECK_THROWS_AS((void)decode(encode(e)), cohort::ProtocolError);
  }
}

TEST_CASE("a roundOpen with more ids than a batch, or an invalid id, is a ProtocolError") {
  RoundOpen big{3, {}};
  for (std::size_t i = 0; i <= kRoundOpenBatch; ++i) big.clients.push_back("c" + std::to_string(i));
  CHECK_THROWS_AS(decode(encode(wrap(big))), cohort::ProtocolError);
  CHECK_THROWS_AS(decode(encode(wrap(RoundOpen{3, {"bad id with spaces"}}))),
                  cohort::ProtocolError);
  RoundOpen full{3, {}};  // a full batch of the longest ids (64 characters) fits an envelope
  for (std::size_t i = 0; i < kRoundOpenBatch; ++i) {
    const std::string num = std::to_string(1000 + i);
    full.clients.push_back(std::string(64 - num.size(), 'x') + num);
  }
  CHECK(encode(wrap(full)).size() < kMaxEnvelopeBytes);
  CHECK(decode(encode(wrap(full))) == wrap(full));
}

namespace {

SecAggData full_secagg_data() {
  SecAggData d;
  SecAggKey k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint8_t>(i * 7 + 1);
  d.members = {{.id = 3, .node = "client-3", .channel_key = k, .mask_key = k, .weight = 0.25},
               {.id = 9, .node = "client-9", .channel_key = {}, .mask_key = k, .weight = 0.75}};
  d.threshold = 7;
  d.degree = 13;
  d.graph_seed = k;
  d.sealed = {{.from = 3, .to = 9, .ciphertext = {1, 2, 3, 4, 5}}};
  d.survivors = {3, 9, 11};
  d.self_mask = {{.owner = 3, .x = 10, .y = {1, 2, 3, 4, 5, 6, 7, 8}}};
  d.mask_key = {{.owner = 12, .x = 4, .y = {8, 7}}};
  d.seeds = {{.survivor = 3, .dropped = 3, .sign = 1, .seed = k},
             {.survivor = 3, .dropped = 12, .sign = -1, .seed = k}};
  d.vector_size = 235146;
  d.clip = 8;
  d.levels = 1u << 22;
  d.total_weight = 1.0;
  return d;
}

}  // namespace

TEST_CASE("secure aggregation's stage data round-trips; malformed data is a ProtocolError") {
  const SecAggData d = full_secagg_data();
  auto bytes = encode_secagg(d);
  CHECK(decode_secagg(bytes) == d);
  CHECK(decode_secagg(encode_secagg(SecAggData{})) == SecAggData{});
  // Truncated, not whole words, or garbage: refused, never a crash.
  CHECK_THROWS_AS(decode_secagg(std::span(bytes).first(bytes.size() - 8)), cohort::ProtocolError);
  CHECK_THROWS_AS(decode_secagg(std::span(bytes).first(bytes.size() - 3)), cohort::ProtocolError);
  CHECK_THROWS_AS(decode_secagg({}), cohort::ProtocolError);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    auto noisy = bytes;
    noisy[rng() % noisy.size()] = static_cast<std::byte>(rng());
    try {
      (void)decode_secagg(noisy);
    } catch (const cohort::ProtocolError&) {
    }
  }
  // A seed whose sign is not +-1 is refused.
  SecAggData bad_sign = d;
  bad_sign.seeds[0].sign = 0;
  CHECK_THROWS_WITH_AS(decode_secagg(encode_secagg(bad_sign)), doctest::Contains("sign"),
                       cohort::ProtocolError);
  // A member whose node id is not a node id is refused.
  SecAggData bad_node = d;
  bad_node.members[0].node = "not a node id";
  CHECK_THROWS_AS(decode_secagg(encode_secagg(bad_node)), cohort::ProtocolError);
}
