// Bad input against real processes on loopback: a hostile or broken client speaking the protocol
// by hand next to honest cohort-client processes, and bad configuration and data files given to
// the binaries. Each case matches a row of README's troubleshooting table.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cohort/transport/endpoint.h"
#include "process.h"

using namespace std::chrono_literals;
using cohort::test::Process;
using cohort::test::TempDir;
namespace tp = cohort::transport;

namespace {

std::vector<nlohmann::json> records(const std::string& file, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
  }
  return out;
}

tp::EndpointOptions raw_options(const std::string& id) {
  tp::EndpointOptions o;
  o.node_id = id;
  o.security.insecure = true;
  return o;
}

// Receives until a message whose body is a T arrives (others are returned through `other`).
template <typename T>
std::optional<tp::Message> wait_for_body(tp::Endpoint& ep, std::chrono::seconds timeout,
                                         std::vector<tp::Message>* other = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = ep.receive(100ms);
    if (!m) continue;
    if (std::holds_alternative<T>(m->envelope.body)) return m;
    if (other != nullptr) other->push_back(std::move(*m));
  }
  return std::nullopt;
}

std::string first_line_with(const std::string& text, const std::string& needle) {
  const auto at = text.find(needle);
  if (at == std::string::npos) return {};
  const auto begin = text.rfind('\n', at);
  const auto end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end == std::string::npos ? std::string::npos : end - begin - 1);
}

}  // namespace

TEST_CASE("NaN/Inf, wrong-length, late and unselected pushes and an unknown node are refused, a resend is applied once; the rounds go on") {
  TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl");
  // Three rounds of three clients: two honest processes and `client-raw`, driven from here.
  // Evaluation only after the last round, by client-0 (the first in the coordinator's order).
  Process server = Process::spawn(COHORT_SERVER_BIN,
      {"--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", dir.file("port"),
       "--log-level", "info", "--server.metrics_file=" + metrics, "--model.spec=mlp:784-32-10",
       "--server.rounds=3", "--server.clients_per_round=3", "--server.min_clients=3",
       "--server.round_deadline_ms=60000", "--server.eval_every=3", "--train.epochs=1",
       "--train.lr=0.05"});
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir.file("port"), 30s);
  std::vector<Process> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(Process::spawn(COHORT_CLIENT_BIN,
        {"--insecure", "--server", url, "--name", "client-" + std::to_string(i), "--data", "iid",
         "--part", std::to_string(i) + "/2", "--log-level", "info"}));
  }

  tp::Context ctx;
  auto raw = tp::Endpoint::connect(ctx, url, raw_options("client-raw"));
  raw.wait_ready(30s);
  // Registers as cohort-client does: again after each answer that is not a welcome (the
  // coordinator says "waiting for all shards to start" until its shard map is complete).
  std::optional<tp::Message> welcome_msg;
  std::vector<tp::Message> other;
  for (int attempt = 0; attempt < 60 && !welcome_msg; ++attempt) {
    tp::Envelope reg;
    reg.body = tp::Register{tp::Role::kClient, 1000, "cpu", "", 0, 0, "iid"};
    raw.send({}, reg);
    welcome_msg = wait_for_body<tp::Welcome>(raw, 2s, &other);
  }
  for (const auto& m : other) MESSAGE("before the welcome: " << tp::body_name(m.envelope.body));
  REQUIRE(welcome_msg);
  const auto welcome = std::get<tp::Welcome>(welcome_msg->envelope.body);
  REQUIRE(welcome.shards.size() == 1);
  const std::uint64_t n = welcome.model_size;

  // A stranger: never registered. Its shard registration names a shard that does not exist, its
  // other roles are refused, and its heartbeat and report for the running round are ignored.
  auto stranger = tp::Endpoint::connect(ctx, url, raw_options("stranger-9"));
  stranger.wait_ready(30s);
  {
    tp::Envelope e;
    e.body = tp::Register{tp::Role::kShard, 0, "", "tcp://127.0.0.1:1", 0, 5, ""};
    stranger.send({}, e);
    auto err = wait_for_body<tp::ErrorBody>(stranger, 30s);
    REQUIRE(err);
    const auto& body = std::get<tp::ErrorBody>(err->envelope.body);
    CHECK(body.code == tp::ErrorCode::kUnknownNode);
    CHECK(body.message == "no shard 5 in a federation of 1");
    e.body = tp::Register{tp::Role::kObserver, 0, "", "", 0, 0, ""};
    stranger.send({}, e);
    err = wait_for_body<tp::ErrorBody>(stranger, 30s);
    REQUIRE(err);
    CHECK(std::get<tp::ErrorBody>(err->envelope.body).message == "only clients and shards may register");
  }

  auto push_from = [&](tp::Endpoint& ep, std::uint64_t round, std::uint64_t version,
                       std::vector<float> values) {
    tp::Envelope e;
    e.round = round;
    e.body = tp::Push{0, 0, n, 1000, version, tp::Encoding::kDenseF32, tp::PushKind::kDelta, 0.5f, 0,
                      n};
    ep.send({}, e, tp::Payload{std::as_bytes(std::span(values)), nullptr});
    auto ack = wait_for_body<tp::PushAck>(ep, 60s);
    REQUIRE(ack);
    CHECK(ack->envelope.round == round);
    return std::get<tp::PushAck>(ack->envelope.body);
  };
  auto push = [&](std::uint64_t round, std::uint64_t version, std::vector<float> values) {
    return push_from(raw, round, version, std::move(values));
  };
  auto report = [&](tp::Endpoint& ep, std::uint64_t round, bool trained, std::string why) {
    tp::Envelope e;
    e.round = round;
    tp::ClientReport r;
    r.round = round;
    r.trained = trained;
    r.num_samples = 1000;
    r.message = std::move(why);
    e.body = r;
    ep.send({}, e);
  };

  std::vector<std::string> reasons;
  for (std::uint64_t k = 1; k <= 3; ++k) {
    auto start = wait_for_body<tp::RoundStart>(raw, 120s);
    REQUIRE(start);
    const auto rs = std::get<tp::RoundStart>(start->envelope.body);
    REQUIRE(!rs.evaluate_only);
    CAPTURE(rs.round);
    tp::PushAck ack;
    if (k == 1) {
      std::vector<float> v(n, 0.001f);
      v[5] = std::numeric_limits<float>::quiet_NaN();
      v[n - 1] = std::numeric_limits<float>::infinity();
      ack = push(rs.round, rs.model_version, v);
      CHECK(ack.reason == "non-finite values or bad shape");
      tp::Envelope hb;
      hb.body = tp::Heartbeat{1, 0};
      stranger.send({}, hb);
      report(stranger, rs.round, true, "");  // would count as a fourth update if it were believed
      // Nor does the shard take its update: it was not selected (the coordinator told the shard
      // who was before the round started).
      const auto foreign = push_from(stranger, rs.round, rs.model_version, std::vector<float>(n, 5.0f));
      CHECK(!foreign.accepted);
      CHECK(foreign.reason == "stranger-9 was not selected for round " + std::to_string(rs.round));
    } else if (k == 2) {
      ack = push(rs.round, rs.model_version, std::vector<float>(n / 2, 0.001f));
      CHECK(ack.reason == "wrong update length");
    } else {
      ack = push(rs.round - 1, rs.model_version, std::vector<float>(n, 0.001f));
      CHECK(ack.reason == "round " + std::to_string(rs.round - 1) + " is closed (late push)");
    }
    CHECK(!ack.accepted);
    reasons.push_back(ack.reason);
    if (k < 3) {
      report(raw, rs.round, false, "refused: " + ack.reason);
      continue;
    }
    // Round 3: a valid (zero) update, then the same again, as a client resends when its ack was
    // lost: the resend is acknowledged without being applied a second time.
    const auto good = push(rs.round, rs.model_version, std::vector<float>(n, 0.0f));
    CHECK(good.accepted);
    const auto again = push(rs.round, rs.model_version, std::vector<float>(n, 0.0f));
    CHECK(again.accepted);
    report(raw, rs.round, true, "");
  }

  REQUIRE(server.wait_for(180s) == 0);
  for (auto& c : clients) CHECK(c.wait_for(30s) == 0);
  const auto rounds = records(metrics, "round");
  REQUIRE(rounds.size() == 3);
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    // The two honest updates, never a refused one or the stranger's; in round 3 also client-raw's
    // valid update, once.
    CHECK(rounds[i]["clients"] == (i < 2 ? 2 : 3));
    CHECK(rounds[i]["selected"] == 3);
  }
  // A NaN that got through would leave the model at chance (0.1).
  const double accuracy = rounds.back()["test_accuracy"];
  MESSAGE("test accuracy after 3 rounds with refused pushes: " << accuracy);
  CHECK(accuracy > 0.6);
  const std::string log = server.stderr_text();
  CHECK(log.find("refused the update of client-raw: non-finite values or bad shape") != std::string::npos);
  CHECK(log.find("refused push from client-raw: wrong update length") != std::string::npos);
  CHECK(log.find("refused push from client-raw: round 2 is closed (late push)") != std::string::npos);
  CHECK(log.find("refused push from stranger-9: stranger-9 was not selected for round 1") !=
        std::string::npos);
  CHECK(log.find("client-raw resent its update for round 3, already applied: acknowledged again") !=
        std::string::npos);
}

TEST_CASE("a config file with an unknown key or a wrong type stops the binaries with a one-line error") {
  TempDir dir;
  struct Case {
    std::string toml, binary, expected;
  };
  const std::vector<Case> cases = {
      {"[server]\nroundz = 10\n", COHORT_SERVER_BIN, "unknown config key 'server.roundz'"},
      {"[server]\nrounds = \"ten\"\n", COHORT_SERVER_BIN, "config key 'server.rounds' must be a int"},
      {"[client]\nnmae = \"client-1\"\n", COHORT_CLIENT_BIN, "unknown config key 'client.nmae'"},
      {"[client]\nthreads = true\n", COHORT_CLIENT_BIN, "config key 'client.threads' must be a int"},
  };
  int i = 0;
  for (const auto& c : cases) {
    CAPTURE(c.toml);
    const std::string file = dir.file("bad-" + std::to_string(i++) + ".toml");
    std::ofstream(file) << c.toml;
    Process p = Process::spawn(c.binary, {"--config", file, "--insecure"});
    REQUIRE(p.wait_for(60s) == 1);
    const std::string line = first_line_with(p.stderr_text(), c.expected);
    MESSAGE(line);
    CHECK(!line.empty());
    CHECK(line.find(file) != std::string::npos);  // names the file
  }
  // The closest valid key is suggested for a typo.
  std::ofstream(dir.file("typo.toml")) << "[server]\nroundz = 10\n";
  Process p = Process::spawn(COHORT_SERVER_BIN, {"--config", dir.file("typo.toml")});
  REQUIRE(p.wait_for(60s) == 1);
  CHECK(first_line_with(p.stderr_text(), "unknown config key").find("server.rounds") != std::string::npos);
}

TEST_CASE("a truncated dataset file stops cohort-client with an error naming the file") {
  TempDir dir;
  const std::string src = "/usr/share/datasets/fashion-mnist";
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz"}) {
    std::filesystem::copy_file(src + "/" + f, dir.file(f));
  }
  // The header and the first 1000 pixels of the training images, gzipped again.
  const std::string images = dir.file("train-images-idx3-ubyte.gz");
  const std::string cmd = "gzip -dc " + src + "/train-images-idx3-ubyte.gz | head -c 1016 | gzip > " + images;
  REQUIRE(std::system(cmd.c_str()) == 0);
  Process p = Process::spawn(COHORT_CLIENT_BIN,
      {"--insecure", "--server", "tcp://127.0.0.1:1", "--name", "client-0", "--data.dir=" + dir.path().string()});
  REQUIRE(p.wait_for(60s) == 1);
  const std::string line = first_line_with(p.stderr_text(), "truncated");
  MESSAGE(line);
  CHECK(line.find(images + ": truncated: expected 47040000 bytes of pixels, got 1000") != std::string::npos);
}

// Under ThreadSanitizer the test process runs so slowly (seconds between two sends) that ZeroMQ's
// 5 s ZMTP heartbeat timeout sometimes drops the worker's connection mid-test; the shard's reply
// then goes to the dead connection and is lost (seen on CI and reproduced here, about 1 run in 5).
// The case runs in the Release and ASan passes; the TSan pass keeps the other bad-input cases.
#if defined(__SANITIZE_THREAD__)
constexpr bool kSkipUnderTsan = true;
#else
constexpr bool kSkipUnderTsan = false;
#endif

TEST_CASE("ASP data-parallel: a gradient with NaN in a later chunk is refused, the model stays finite, the next one applies"
          * doctest::skip(kSkipUnderTsan)) {
  TempDir dir;
  // mlp:784-512-10 has 407,050 parameters: 1.6 MB, two 1 MiB chunks. lr 0.5, plain SGD.
  Process server = Process::spawn(COHORT_SERVER_BIN,
      {"--insecure", "--listen", "tcp://127.0.0.1:*", "--port-file", dir.file("port"),
       "--log-level", "info", "--server.mode=dataparallel", "--server.consistency=asp",
       "--server.steps=1000000", "--server.clients_per_round=1", "--server.metrics_file=",
       "--model.spec=mlp:784-512-10", "--server_optimizer.lr=0.5"});
  const std::string url = "tcp://127.0.0.1:" + cohort::test::read_when_ready(dir.file("port"), 30s);
  tp::Context ctx;
  auto raw = tp::Endpoint::connect(ctx, url, raw_options("worker-raw"));
  raw.wait_ready(30s);
  std::optional<tp::Message> welcome_msg;
  for (int attempt = 0; attempt < 60 && !welcome_msg; ++attempt) {
    tp::Envelope reg;
    reg.body = tp::Register{tp::Role::kClient, 1, "cpu", "", 0, 0, ""};
    raw.send({}, reg);
    welcome_msg = wait_for_body<tp::Welcome>(raw, 2s);
  }
  REQUIRE(welcome_msg);
  const std::uint64_t n = std::get<tp::Welcome>(welcome_msg->envelope.body).model_size;
  REQUIRE(n == 407050);
  const std::size_t chunk_floats = (std::size_t{1} << 20) / sizeof(float);
  REQUIRE(n > chunk_floats);

  auto explain = [&](const std::string& what) {  // for a reply that never came
    const auto st = raw.stats();
    return what + " (worker sent " + std::to_string(st.records_sent) + " records, received " +
           std::to_string(st.records_received) + ", dropped " + std::to_string(st.dropped_malformed) +
           "); the server logged:\n" + server.stderr_text();
  };
  auto pull = [&](std::uint64_t clock) {
    tp::Envelope e;
    e.body = tp::Pull{0, 0, n, clock};
    raw.send({}, e);
    auto reply = wait_for_body<tp::PullReply>(raw, 60s);
    if (!reply) {
      MESSAGE(explain("no pull reply"));
    }
    REQUIRE(reply);
    REQUIRE(reply->payload.size() == n * sizeof(float));
    std::vector<float> x(n);
    std::memcpy(x.data(), reply->payload.data(), reply->payload.size());
    return std::pair{std::get<tp::PullReply>(reply->envelope.body).version, x};
  };
  auto push = [&](std::uint64_t clock, const std::vector<float>& g) {
    tp::Envelope e;
    e.body = tp::Push{0, 0, n, 1, clock, tp::Encoding::kDenseF32, tp::PushKind::kGradient, 0, clock, n};
    raw.send({}, e, tp::Payload{std::as_bytes(std::span(g)), nullptr});
    auto ack = wait_for_body<tp::PushAck>(raw, 60s);
    if (!ack) {
      MESSAGE(explain("no ack"));
    }
    REQUIRE(ack);
    return std::get<tp::PushAck>(ack->envelope.body);
  };

  const auto [v0, x0] = pull(0);
  std::vector<float> g(n, 0.25f);
  g[chunk_floats + 100] = std::numeric_limits<float>::quiet_NaN();
  const auto refused = push(0, g);
  CHECK_FALSE(refused.accepted);
  CHECK(refused.reason == "gradient has non-finite values");

  // The chunk is the unit of atomicity: the finite chunk before the bad one was applied, nothing of
  // the bad chunk or after it; the version and the worker's clock did not move.
  const auto [v1, x1] = pull(0);
  CHECK(v1 == v0);
  std::size_t applied = 0, untouched = 0, non_finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x1[i])) ++non_finite;
    if (x1[i] == x0[i] - 0.5f * 0.25f) ++applied;
    if (x1[i] == x0[i]) ++untouched;
  }
  CHECK(non_finite == 0);
  CHECK(applied == chunk_floats);
  CHECK(untouched == n - chunk_floats);

  // The same clock again, finite this time: applied whole.
  std::fill(g.begin(), g.end(), 0.25f);
  const auto ok = push(0, g);
  CHECK(ok.accepted);
  const auto [v2, x2] = pull(1);
  CHECK(v2 == v0 + 1);
  std::size_t moved = 0;
  for (std::size_t i = 0; i < n; ++i) moved += x2[i] == x1[i] - 0.5f * 0.25f ? 1 : 0;
  CHECK(moved == n);
  // A resend of the clock just applied (its ack lost) is acknowledged again and changes nothing.
  const auto again = push(0, g);
  CHECK(again.accepted);
  const auto [v3, x3] = pull(1);
  CHECK(v3 == v2);
  CHECK(x3 == x2);

}
