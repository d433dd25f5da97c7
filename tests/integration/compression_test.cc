// Compressed pushes, client-level DP and malformed encoded pushes, end to end: real cohort-server
// and cohort-client processes on loopback over TLS.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "cohort/aggregation/privacy.h"
#include "cohort/kernels/model_zoo.h"
#include "cohort/server/checkpoint.h"
#include "cohort/transport/endpoint.h"
#include "federation.h"

using namespace std::chrono_literals;
using cohort::test::Federation;
namespace transport = cohort::transport;

namespace {

constexpr const char* kModel = "mlp:784-256-128-10";

double dense_push_bytes() {
  return 4.0 * static_cast<double>(cohort::kernels::make_network_spec(kModel).parameter_count());
}

// A federation whose clients all push with `compressor` (flags like --compressor.name=topk).
std::vector<nlohmann::json> run_compressed(const std::vector<std::string>& compressor, int rounds) {
  const int clients = 3;
  Federation f(2, clients,
               {"--server.rounds=" + std::to_string(rounds), "--server.clients_per_round=3",
                "--server.min_clients=3", "--model.spec=" + std::string(kModel), "--train.steps=40",
                "--train.batch_size=32", "--train.lr=0.05", "--train.momentum=0.9",
                "--server.work=fixed"});
  for (int i = 0; i < clients; ++i) f.client_extra[i] = compressor;
  f.start();
  REQUIRE(f.wait(120s) == 0);
  for (auto& c : f.clients) CHECK(c.wait_for(20s) == 0);
  return f.records("round");
}

// The model after one round of 3 clients on 2 shards with `extra` server and client flags.
std::vector<float> one_round(const std::vector<std::string>& server_extra,
                             const std::vector<std::string>& client_extra) {
  std::vector<std::string> args{
      "--server.rounds=1",     "--server.min_clients=3",
      "--server.eval_every=0", "--model.spec=" + std::string(kModel), "--train.steps=20"};
  // A cohort is a federated round's: FedBuff refuses it (its clients are server.concurrency).
  if (std::find(server_extra.begin(), server_extra.end(), "--server.mode=fedbuff") == server_extra.end()) {
    args.push_back("--server.clients_per_round=3");
    args.push_back("--server.work=fixed");  // every client runs train.steps, as FedBuff's do
  }
  args.insert(args.end(), server_extra.begin(), server_extra.end());
  Federation f(2, 3, args);
  for (int i = 0; i < 3; ++i) f.client_extra[i] = client_extra;
  f.start();
  REQUIRE(f.wait(120s) == 0);
  return f.checkpointed_model();
}

}  // namespace

TEST_CASE("decoded pushes land where they belong: fp16 and top-k steps, FedAvg and FedBuff") {
  std::vector<float> init(cohort::kernels::make_network_spec(kModel).parameter_count());
  cohort::kernels::make_network_spec(kModel).initialize(1, init);
  const auto dense = one_round({}, {});
  const auto fp16 = one_round({}, {"--compressor.name=fp16"});
  const auto fp16_buffered = one_round({"--server.mode=fedbuff", "--server.buffer_size=3",
                                        "--server.concurrency=3", "--server.max_staleness=0"},
                                       {"--compressor.name=fp16"});
  const auto topk = one_round({}, {"--compressor.name=topk", "--compressor.k_fraction=0.01"});
  double moved = 0, fp16_err = 0, buffered_err = 0;
  for (std::size_t i = 0; i < init.size(); ++i) {
    moved = std::max(moved, std::abs(static_cast<double>(dense[i] - init[i])));
    fp16_err = std::max(fp16_err, std::abs(static_cast<double>(fp16[i] - dense[i])));
    buffered_err =
        std::max(buffered_err, std::abs(static_cast<double>(fp16_buffered[i] - fp16[i])));
  }
  MESSAGE("largest step " << moved << ", fp16 vs fp32 " << fp16_err << ", FedBuff vs FedAvg (fp16) "
                          << buffered_err);
  CHECK(moved > 1e-3);
  CHECK(fp16_err > 0);  // the pushes really were fp16
  // Decoded at the right places: fp16 rounds each client's value to 2^-11 relative (a client's
  // largest value may be a few times the mean step); a misplaced piece would be off by ~moved.
  CHECK(fp16_err < 4e-3 * moved + 1e-7);
  CHECK(buffered_err <= 1e-6);  // FedBuff (K = 3, no staleness) = FedAvg, both decoding fp16
  // Top-k 1% per shard range: each client moves at most k coordinates of each range, so the round
  // moves at most 3 x (k0 + k1), and at least one client's k0 + k1.
  const std::size_t d = init.size(), n0 = (d + 1) / 2, n1 = d / 2;
  const std::size_t k = n0 / 100 + n1 / 100;
  std::size_t changed = 0;
  for (std::size_t i = 0; i < d; ++i) changed += topk[i] != init[i] ? 1 : 0;
  MESSAGE("top-k moved " << changed << " of " << d << " parameters (k per client " << k << ")");
  CHECK(changed >= k);
  CHECK(changed <= 3 * k);
}

TEST_CASE("top-k 1% with error feedback: rounds complete, uplink over 30x smaller than fp32") {
  const auto rounds = run_compressed({"--compressor.name=topk", "--compressor.k_fraction=0.01",
                                      "--compressor.error_feedback=true"},
                                     3);
  REQUIRE(rounds.size() == 3);
  const double dense = 3 * dense_push_bytes();  // what 3 fp32 pushes per round would send
  for (const auto& r : rounds) {
    CHECK(r["clients"] == 3);
    const double up = r["uplink_bytes"];
    MESSAGE("round " << r["round"] << ": uplink " << up << " bytes (fp32: " << dense
                     << "), accuracy " << r["test_accuracy"]);
    CHECK(up > 0);
    CHECK(up * 30 < dense);
  }
  CHECK(rounds.back()["total_uplink_bytes"].get<double>() ==
        doctest::Approx(rounds[0]["uplink_bytes"].get<double>() * 3).epsilon(0.01));
  // 1% of the coordinates per client per round still trains: well above chance (0.1).
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.3);
}

TEST_CASE("fp16 pushes: half the uplink bytes of fp32, accuracy as usual") {
  const auto rounds = run_compressed({"--compressor.name=fp16"}, 2);
  REQUIRE(rounds.size() == 2);
  const double dense = 3 * dense_push_bytes();
  for (const auto& r : rounds) {
    CHECK(r["clients"] == 3);
    const double ratio = dense / r["uplink_bytes"].get<double>();
    MESSAGE("fp32 / fp16 uplink: " << ratio);
    CHECK(ratio > 1.95);  // 2 bytes per value plus 8-byte headers and 4-byte frames
    CHECK(ratio < 2.0);
  }
  CHECK(rounds.back()["test_accuracy"].get<double>() > 0.6);
}

TEST_CASE("a malformed compressed push is refused with an ack; the round goes on") {
  // client-0 is a real client; client-1 is this test speaking the protocol with garbage.
  Federation f(1, 2,
               {"--server.rounds=1", "--server.clients_per_round=2", "--server.min_clients=2",
                "--server.min_updates=1", "--server.round_deadline_ms=30000",
                "--model.spec=" + std::string(kModel), "--train.epochs=1", "--server.work=fixed"});
  f.start_servers();
  f.start_client(0);
  transport::Context ctx;
  transport::EndpointOptions o;
  o.node_id = "client-1";
  o.security.ca_file = f.file("ca/ca.pem");
  o.security.cert_file = f.file("certs/client-1.pem");
  o.security.key_file = f.file("certs/client-1.key");
  auto ep = transport::Endpoint::connect(ctx, f.coordinator(), o);
  ep.wait_ready(20s);
  // Register (again, until the coordinator welcomes us), then wait for the round to start.
  std::optional<transport::Welcome> welcome;
  std::optional<transport::RoundStart> start;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  auto next_register = std::chrono::steady_clock::now();
  while (!start && std::chrono::steady_clock::now() < deadline) {
    if (!welcome && std::chrono::steady_clock::now() >= next_register) {
      transport::Envelope e;
      e.body = transport::Register{transport::Role::kClient, 100, "cpu", "", 0, 0, "iid 1/2"};
      ep.send({}, std::move(e));
      next_register = std::chrono::steady_clock::now() + 1s;
    }
    auto m = ep.receive(100ms);
    if (!m) continue;
    if (auto* w = std::get_if<transport::Welcome>(&m->envelope.body)) welcome = *w;
    if (auto* rs = std::get_if<transport::RoundStart>(&m->envelope.body)) start = *rs;
  }
  REQUIRE(welcome);
  REQUIRE(start);
  REQUIRE(welcome->shards.size() == 1);
  const auto& shard = welcome->shards[0];
  const std::uint64_t n = shard.end - shard.begin;
  // A framed top-k piece whose header claims the right count but whose body is cut short.
  std::vector<std::byte> bad(4 + 8 + 4 + 100, std::byte{0x11});
  const std::uint32_t len = 8 + 4 + 100;
  std::memcpy(bad.data(), &len, 4);
  bad[4] = std::byte{6};  // WireFormat::kTopK
  bad[5] = std::byte{1};  // version 1
  bad[6] = bad[7] = std::byte{0};
  const auto count = static_cast<std::uint32_t>(n);
  std::memcpy(bad.data() + 8, &count, 4);
  transport::Envelope e;
  e.round = start->round;
  e.body = transport::Push{shard.index,
                           shard.begin,
                           shard.end,
                           100,
                           start->model_version,
                           transport::Encoding::kTopK,
                           transport::PushKind::kDelta,
                           0.0f,
                           0,
                           n};
  ep.send({}, std::move(e), transport::Payload{bad, nullptr});
  std::optional<transport::PushAck> ack;
  while (!ack && std::chrono::steady_clock::now() < deadline) {
    auto m = ep.receive(100ms);
    if (m) {
      if (auto* a = std::get_if<transport::PushAck>(&m->envelope.body)) ack = *a;
    }
  }
  REQUIRE(ack);
  CHECK_FALSE(ack->accepted);
  MESSAGE("refusal: " << ack->reason);
  CHECK(ack->reason.find("malformed compressed update") != std::string::npos);
  // Report like a client whose push was refused, so the round closes on client-0's update.
  transport::ClientReport report;
  report.round = start->round;
  report.model_version = start->model_version;
  report.message = "push refused: " + ack->reason;
  transport::Envelope re;
  re.round = start->round;
  re.body = report;
  ep.send({}, std::move(re));
  REQUIRE(f.wait(90s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 1);
  CHECK(rounds[0]["clients"] == 1);  // client-0's update committed; the shard is still alive
  CHECK(rounds[0]["test_accuracy"].get<double>() > 0.5);  // one epoch of client-0's half
  CHECK(f.server(0).stderr_text().find("malformed compressed update") != std::string::npos);
}

TEST_CASE("client-level DP: clipped pushes, server noise, epsilon reported per round") {
  const double z = 1.1, delta = 1e-5;
  Federation f(1, 2,
               {"--server.rounds=3", "--server.clients_per_round=2", "--server.min_clients=2",
                "--model.spec=" + std::string(kModel), "--train.steps=20", "--dp.clip=0.5",
                "--dp.noise_multiplier=1.1", "--dp.delta=1e-5", "--dp.seed=7"});
  for (int i = 0; i < 2; ++i)
    f.client_extra[i] = {"--client.dp_clip=0.5", "--compressor.name=fp16"};
  f.start();
  REQUIRE(f.wait(120s) == 0);
  const auto rounds = f.records("round");
  REQUIRE(rounds.size() == 3);
  // Every client joins every round (q = 1): epsilon after T rounds is the accountant's for T steps.
  for (std::size_t t = 0; t < rounds.size(); ++t) {
    cohort::aggregation::RdpAccountant acc;
    acc.add_steps(1.0, z, t + 1);
    const double want = acc.epsilon(delta).epsilon;
    INFO("round " << t + 1);
    CHECK(rounds[t]["dp_sampling_rate"].get<double>() == 1.0);
    CHECK(rounds[t]["dp_epsilon"].get<double>() == doctest::Approx(want).epsilon(1e-9));
  }
  CHECK(rounds[2]["dp_epsilon"].get<double>() > rounds[0]["dp_epsilon"].get<double>());
  CHECK(f.server(0).stderr_text().find("refused") == std::string::npos);
}
