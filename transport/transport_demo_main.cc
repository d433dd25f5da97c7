// cohort-transport-demo: moves a large tensor between two processes over the Cohort transport
// (mutual TLS + AES-256-GCM by default) and prints the throughput and SHA-256 of what arrived.
//
//   cohort-transport-demo                  self-contained: makes a throwaway PKI, starts a receiver
//                                          process, sends to it, prints results
//   cohort-transport-demo serve ...        the receiver (answers each payload with its SHA-256)
//   cohort-transport-demo send ...         the sender
#include <openssl/evp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/transport/allocator.h"
#include "cohort/transport/config.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/keygen.h"

extern char** environ;

namespace {

using namespace cohort;
using namespace cohort::transport;
using namespace std::chrono_literals;

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

struct Common {
  std::string name;
  std::string ca, cert, key;
  bool insecure = false;
  std::size_t chunk_kib = 1024;
  std::string aead = "auto";  // transport.aead
};

EndpointOptions options_from(const Common& c, ThreadPool* pool) {
  EndpointOptions o;
  o.node_id = c.name;
  o.security.insecure = c.insecure;
  o.security.ca_file = c.ca;
  o.security.cert_file = c.cert;
  o.security.key_file = c.key;
  o.security.aead = parse_aead(c.aead);
  o.chunk_bytes = c.chunk_kib * 1024;
  o.pool = pool;
  return o;
}

int serve(const Common& c, const std::string& listen, const std::string& port_file, int count) {
  Context ctx;
  ThreadPool pool(2);
  auto ep = Endpoint::bind(ctx, listen, options_from(c, &pool));
  if (!port_file.empty()) {
    const auto colon = ep.url().rfind(':');
    std::ofstream tmp(port_file + ".tmp");
    tmp << ep.url().substr(colon + 1) << '\n';
    tmp.close();
    std::filesystem::rename(port_file + ".tmp", port_file);
  }
  COHORT_LOG(Info) << "serving on " << ep.url() << (ep.is_secure() ? " (TLS)" : " (plaintext)");
  int served = 0;
  const auto idle_limit = std::chrono::steady_clock::now() + 600s;
  while (count <= 0 || served < count) {
    if (std::chrono::steady_clock::now() > idle_limit) return 3;
    auto m = ep.receive(1000ms);
    if (!m) continue;
    if (std::holds_alternative<Bye>(m->envelope.body)) break;
    Envelope reply;
    reply.round = m->envelope.round;
    reply.body = PushAck{true, sha256_hex(m->payload.span()), m->payload.size()};
    ep.send(m->peer, std::move(reply));
    ++served;
  }
  // Let the last reply leave before the socket closes.
  std::this_thread::sleep_for(200ms);
  return 0;
}

struct SendResult {
  double seconds = 0;
  std::string remote_sha;
  std::string local_sha;
};

std::vector<SendResult> send(const Common& c, const std::string& server, std::size_t bytes,
                             int repeat, bool quiet) {
  Context ctx;
  ThreadPool pool(2);
  auto ep = Endpoint::connect(ctx, server, options_from(c, &pool));
  ep.wait_ready(15s);
  std::vector<std::byte> tensor(bytes);
  std::mt19937_64 rng(42);
  for (std::size_t i = 0; i + 8 <= bytes; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(tensor.data() + i, &v, 8);
  }
  std::vector<SendResult> results;
  for (int r = 0; r < repeat; ++r) {
    Envelope e;
    e.round = static_cast<std::uint64_t>(r);
    e.body = Push{0, 0, bytes / 4, 1, 0, Encoding::kDenseF32, PushKind::kDelta, 0, 0, bytes / 4};
    const auto t0 = std::chrono::steady_clock::now();
    ep.send({}, std::move(e), Payload{tensor, nullptr});
    std::optional<Message> ack;
    while (!ack) {
      ack = ep.receive(30s);
      if (!ack) throw TimeoutError("no acknowledgement from " + server + " within 30 s");
      if (!std::holds_alternative<PushAck>(ack->envelope.body)) ack.reset();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    results.push_back({s, std::get<PushAck>(ack->envelope.body).reason, ""});
  }
  const std::string local = sha256_hex(tensor);
  for (auto& r : results) r.local_sha = local;
  Envelope bye;
  bye.body = Bye{"done"};
  ep.send({}, std::move(bye));
  std::this_thread::sleep_for(100ms);
  (void)quiet;
  return results;
}

int self_contained(const std::string& self, std::size_t mib, int repeat, bool insecure) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("cohort-demo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  security::generate_ca(dir / "ca");
  auto server_files = security::generate_node(dir / "ca", "shard-0", dir / "certs");
  auto client_files = security::generate_node(dir / "ca", "client-0", dir / "certs");
  const std::string port_file = (dir / "port").string();
  std::vector<std::string> args{self,          "serve",
                                "--name",      "shard-0",
                                "--listen",    "tcp://127.0.0.1:*",
                                "--port-file", port_file,
                                "--ca",        server_files.ca_file,
                                "--cert",      server_files.cert_file,
                                "--key",       server_files.key_file,
                                "--count",     std::to_string(repeat)};
  if (insecure) args.push_back("--insecure");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  if (posix_spawn(&child, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    throw TransportError("cannot start the receiver process");
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
      }
    }
  } reap{child};
  std::string port;
  for (int i = 0; i < 500 && port.empty(); ++i) {
    std::ifstream in(port_file);
    std::getline(in, port);
    if (port.empty()) std::this_thread::sleep_for(20ms);
  }
  if (port.empty()) throw TransportError("the receiver process did not start listening");
  Common c{
      "client-0", client_files.ca_file, client_files.cert_file, client_files.key_file, insecure,
      1024};
  const std::size_t bytes = mib << 20;
  std::printf(
      "cohort-transport-demo: sending a %zu MiB tensor %d times from client-0 to shard-0 "
      "(separate processes, tcp://127.0.0.1:%s, %s)\n",
      mib, repeat, port.c_str(), insecure ? "plaintext" : "mutual TLS 1.3 + AES-256-GCM");
  auto results = send(c, "tcp://127.0.0.1:" + port, bytes, repeat, false);
  bool ok = true;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const bool same = r.remote_sha == r.local_sha;
    ok = ok && same;
    std::printf("  transfer %zu: %.1f ms, %.2f GB/s, SHA-256 %s %s\n", i + 1, r.seconds * 1e3,
                static_cast<double>(bytes) / r.seconds / 1e9, r.remote_sha.substr(0, 16).c_str(),
                same ? "(matches)" : "(MISMATCH)");
  }
  int st = 0;
  waitpid(child, &st, 0);
  reap.pid = -1;
  std::printf("%s\n",
              ok ? "ok: every tensor arrived intact" : "FAILED: a tensor arrived corrupted");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  CLI::App app{"Moves a large tensor between two processes over Cohort's encrypted transport."};
  app.require_subcommand(0, 1);
  std::size_t mib = 64;
  int repeat = 3;
  bool insecure = false;
  app.add_option("--mib", mib, "tensor size in MiB (self-contained mode)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--repeat", repeat, "transfers to make")->check(CLI::Range(1, 1000));
  app.add_flag("--insecure", insecure, "plaintext instead of TLS (logged as a warning)");

  Common c;
  std::string listen = "tcp://127.0.0.1:*", port_file, server;
  int count = 0;
  std::size_t bytes = 1 << 20;
  auto* srv = app.add_subcommand("serve", "receive payloads and answer each with its SHA-256");
  auto* snd = app.add_subcommand("send", "send payloads and print their SHA-256 and timing");
  for (auto* sub : {srv, snd}) {
    sub->add_option("--name", c.name, "this node's id (its certificate CN)")->required();
    sub->add_option("--ca", c.ca, "CA certificate (PEM)");
    sub->add_option("--cert", c.cert, "node certificate (PEM)");
    sub->add_option("--key", c.key, "node private key (PEM)");
    sub->add_flag("--insecure", c.insecure, "plaintext (logged as a warning)");
    sub->add_option("--chunk-kib", c.chunk_kib, "chunk size in KiB");
    sub->add_option("--aead", c.aead, "AES-256-GCM implementation: auto | ipsec-mb | openssl")
        ->check(CLI::IsMember({"auto", "ipsec-mb", "openssl"}));
  }
  srv->add_option("--listen", listen, "url to bind (tcp://127.0.0.1:* picks a port)");
  srv->add_option("--port-file", port_file, "write the bound port here");
  srv->add_option("--count", count, "exit after this many payloads (0: until Bye)");
  snd->add_option("--server", server, "url of the receiver")->required();
  snd->add_option("--bytes", bytes, "payload size in bytes");
  snd->add_option("--repeat", repeat, "transfers to make");
  CLI11_PARSE(app, argc, argv);

  try {
    if (srv->parsed()) return serve(c, listen, port_file, count);
    if (snd->parsed()) {
      auto results = send(c, server, bytes, repeat, true);
      for (const auto& r : results) {
        std::printf("{\"bytes\":%zu,\"seconds\":%.6f,\"sha256\":\"%s\",\"match\":%s}\n", bytes,
                    r.seconds, r.remote_sha.c_str(),
                    r.remote_sha == r.local_sha ? "true" : "false");
      }
      return 0;
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) throw Error("cannot find my own executable");
    self[n] = 0;
    return self_contained(self, mib, repeat, insecure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-transport-demo: %s\n", e.what());
    return 1;
  }
}
