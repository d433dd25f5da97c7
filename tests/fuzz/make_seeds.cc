// Writes the seed corpus of the fuzz targets into <dir>/<target>/ from real encoder and handshake
// output: one envelope of every body type, real TLS flights of both roles, sample configurations
// and generator inputs for the reassembly target. Usage: fuzz_make_seeds tests/fuzz/corpus
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/log.h"
#include "cohort/transport/messages.h"
#include "cohort/transport/security/keygen.h"
#include "cohort/transport/security/tls.h"

namespace fs = std::filesystem;
using namespace cohort::transport;
namespace sec = cohort::transport::security;

namespace {

void write(const fs::path& dir, const std::string& name, std::span<const std::byte> bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const fs::path& dir, const std::string& name, const std::string& text) {
  write(dir, name, std::as_bytes(std::span(text.data(), text.size())));
}

void append_frame(std::vector<std::byte>& out, std::span<const std::byte> f) {
  out.push_back(static_cast<std::byte>(f.size() & 0xff));
  out.push_back(static_cast<std::byte>((f.size() >> 8) & 0xff));
  out.insert(out.end(), f.begin(), f.end());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  cohort::set_log_level(cohort::LogLevel::Warn);
  const fs::path root = argv[1];

  // Envelopes: one of each body type.
  const std::vector<Body> bodies = {
      Register{Role::kClient, 600, "cpu", "", 0, 0, "iid"},
      Welcome{3, 1000, "mlp:784-32-10", {ShardInfo{0, "tcp://10.0.0.1:7000", "shard-0", 0, 1000}}, 2,
              1000, "[train]\nbatch_size = 32\n"},
      Heartbeat{12, 0.5f},
      RoundStart{4, 30000, 1, 0, 0.05f, 3, false, TrainingMode::kFederated, 32},
      Pull{0, 0, 1000, 3},
      PullReply{0, 0, 1000, 3, Encoding::kDenseF32},
      Push{0, 0, 1000, 600, 3, Encoding::kDenseF32, PushKind::kDelta, 0.7f, 0, 1000},
      PushAck{true, "", 4},
      ChunkHeader{17, 1, 4, 1 << 20},
      ErrorBody{ErrorCode::kLateOrStale, "round 3 is closed", 9},
      GossipExchange{5, 1, 0.5, Encoding::kTopK, 100},
      AllreduceChunk{1, 2, 1, 3, 4096, 1024},
      Bye{"done"},
      RoundClose{4, true, 8},
      ClientReport{4, true, 600, 0.7f, 1.5f, 0.2f, 4000, 4000, true, 0.6f, 0.8f, 100, 4, ""},
      RoundOpen{5, {"client-0", "client-7"}},
  };
  int i = 0;
  for (const Body& b : bodies) {
    Envelope e;
    e.sender = "client-7";
    e.seq = 40 + i;
    e.round = 4;
    e.payload_bytes = i % 2 ? 4000 : 0;
    e.chunk_bytes = i % 2 ? 1 << 20 : 0;
    e.body = b;
    const auto bytes = encode(e);
    write(root / "fuzz_envelope", std::string(body_name(b)), bytes);
    ++i;
  }

  // Reassembly: the generator reads its choices from the input, so any bytes make records.
  std::mt19937 rng(2026);
  for (int n = 0; n < 12; ++n) {
    std::vector<std::byte> b(64 + 96 * n);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    write(root / "fuzz_reassembly", "random-" + std::to_string(n), b);
  }

  // Handshake: real flights of a run between two nodes of a throwaway PKI.
  std::string tmpl = (fs::temp_directory_path() / "cohort-seeds-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return 1;
  const fs::path dir = tmpl;
  sec::generate_ca(dir / "ca");
  sec::TlsContext server_ctx(sec::generate_node(dir / "ca", "shard-0", dir / "nodes"));
  sec::TlsContext client_ctx(sec::generate_node(dir / "ca", "client-1", dir / "nodes"));
  sec::Handshake client(client_ctx, sec::Role::kClient, std::string("shard-0"));
  sec::Handshake server(server_ctx, sec::Role::kServer, std::string("client-1"));
  const auto hello = client.step({});
  const auto server_flight = server.step(hello);
  const auto client_flight = client.step(server_flight);
  std::vector<std::byte> as_server{std::byte{0}};
  append_frame(as_server, hello);
  write(root / "fuzz_handshake", "server-hello", as_server);
  append_frame(as_server, client_flight);
  write(root / "fuzz_handshake", "server-hello-and-finish", as_server);
  std::vector<std::byte> as_client{std::byte{1}};
  append_frame(as_client, server_flight);
  write(root / "fuzz_handshake", "client-server-flight", as_client);
  std::vector<std::byte> garbage{std::byte{0}};
  const std::string http = "GET / HTTP/1.1\r\nHost: shard-0\r\n\r\n";
  append_frame(garbage, std::as_bytes(std::span(http.data(), http.size())));
  write(root / "fuzz_handshake", "not-tls", garbage);
  std::error_code ec;
  fs::remove_all(dir, ec);

  // Configurations.
  const fs::path cfg = root / "fuzz_config";
  write_text(cfg, "tables", "[server]\nrounds = 20\nlearning_rate = 0.5\ninsecure = true\n"
                            "listen = \"tcp://0.0.0.0:7100\"\n[train]\nbatch_size = 64\n");
  write_text(cfg, "dotted", "server.rounds = 3\na.b.c.d = 9\ntls.key_password = \"hunter2\"\n");
  write_text(cfg, "inline", "server = { rounds = 4, insecure = false }\n[aggregator]\nbeta = 0.9\n"
                            "name = \"trimmed\"\nk = 3\non = true\n");
  write_text(cfg, "overrides", "[server]\nrounds = 1\n\n--set\nserver.rounds=7\n"
                               "server.learning_rate=1e-3\naggregator.trim=0.1\nserver.insecure=yes\n");
  write_text(cfg, "wrong-type", "[server]\nrounds = \"ten\"\n");
  write_text(cfg, "unknown-key", "[server]\nroundz = 10\n");
  write_text(cfg, "arrays-dates", "[server]\nrounds = [1, 2]\nlisten = 1979-05-27T07:32:00Z\n"
                                  "[[aggregator.list]]\nx = 1\n");
  write_text(cfg, "big-int", "[server]\nrounds = 9223372036854775807\nlearning_rate = inf\n"
                             "\n--set\nserver.rounds=-9223372036854775809\nserver.learning_rate=nan\n");
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
