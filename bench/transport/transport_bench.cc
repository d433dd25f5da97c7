// cohort-bench-transport: throughput of one large message between two processes over
// tcp://127.0.0.1, for raw ZeroMQ (the ceiling), Cohort plaintext and Cohort TLS.
//
// Prints one JSON object per line to stdout:
//   {"bench":"transport","mode":"raw_zmq|plain|tls","bytes":N,"gbps":X,"p10_gbps":..,"p90_gbps":..,"repeats":R}
// gbps is the median over repeats of bytes / (time from the first byte sent to the receiver's
// acknowledgement of the last). Payloads are handed over with an owner, so plaintext sends are
// zero-copy on both raw_zmq and Cohort; Cohort's receiver still reassembles into one buffer. raw_zmq sends the payload as 1 MiB zero-copy ZeroMQ messages
// with no framing, sealing or reassembly: what ZeroMQ alone can move.
// Mode "cipher" runs in this process on one thread: the record layer's AES-256-GCM seal and open
// (FrameCipher) of N bytes in 1 MiB frames, between buffers larger than the L2 cache as on the
// wire, and memcpy of the same bytes for scale:
//   {"bench":"transport","mode":"cipher","op":"seal|open|memcpy","bytes":N,"gbps":X,"repeats":R}
// They bound TLS: a transfer that keeps both cores busy in plaintext has seal + open to add.
#include <openssl/evp.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <zmq.hpp>

#include "cohort/core/cli.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/scheduling.h"
#include "cohort/transport/allocator.h"
#include "cohort/transport/endpoint.h"
#include "cohort/transport/security/frame_cipher.h"
#include "cohort/transport/security/keygen.h"

extern char** environ;

namespace {

using namespace cohort;
using namespace cohort::transport;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kRawChunk = 1 << 20;

struct Args {
  std::string role = "send";
  std::string sched = "batch";  // --sched: cohort/core/scheduling.h
  std::string mode = "tls";
  std::string dir;
  std::string url;
  std::vector<std::size_t> sizes_mib{1, 16, 64};
  int repeats = 0;
  bool quick = false;
};

void write_port(const std::string& file, const std::string& url) {
  std::ofstream out(file + ".tmp");
  out << url.substr(url.rfind(':') + 1) << '\n';
  out.close();
  std::filesystem::rename(file + ".tmp", file);
}

EndpointOptions options(const Args& a, const std::string& name, ThreadPool* pool) {
  EndpointOptions o;
  o.node_id = name;
  o.pool = pool;
  if (a.mode == "plain") {
    o.security.insecure = true;
  } else {
    o.security.ca_file = a.dir + "/ca/ca.pem";
    o.security.cert_file = a.dir + "/certs/" + name + ".pem";
    o.security.key_file = a.dir + "/certs/" + name + ".key";
  }
  return o;
}

// Receiver: acknowledges every complete message, until told to stop.
int receive(const Args& a) {
  zmq::context_t zctx;
  if (a.mode == "raw_zmq") {
    zmq::socket_t s(zctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    s.bind("tcp://127.0.0.1:*");
    write_port(a.dir + "/port", s.get(zmq::sockopt::last_endpoint));
    for (;;) {
      // [id][8-byte total][chunk]... the sender sends each chunk as its own message.
      zmq::message_t id, total_msg, chunk;
      (void)s.recv(id);
      (void)s.recv(total_msg);
      std::uint64_t total = 0;
      std::memcpy(&total, total_msg.data(), 8);
      if (total == 0) return 0;
      (void)s.recv(chunk);
      std::uint64_t got = chunk.size();
      while (got < total) {
        (void)s.recv(id);
        (void)s.recv(total_msg);
        (void)s.recv(chunk);
        got += chunk.size();
      }
      s.send(id, zmq::send_flags::sndmore);
      s.send(zmq::str_buffer("k"));
    }
  }
  Context ctx;
  ThreadPool pool(2);
  auto ep = Endpoint::bind(ctx, "tcp://127.0.0.1:*", options(a, "shard-0", &pool));
  write_port(a.dir + "/port", ep.url());
  const auto limit = Clock::now() + 600s;
  while (Clock::now() < limit) {
    auto m = ep.receive(1000ms);
    if (!m) continue;
    if (std::holds_alternative<Bye>(m->envelope.body)) return 0;
    Envelope ack;
    ack.body = PushAck{true, {}, m->payload.size()};
    ep.send(m->peer, std::move(ack));
  }
  return 2;
}

struct Sender {
  virtual ~Sender() = default;
  // `owner` keeps `data` alive until the transport is done with it (zero-copy sends).
  virtual void transfer(std::span<const std::byte> data, std::shared_ptr<const void> owner) = 0;
  virtual void stop() = 0;
};

struct RawSender final : Sender {
  zmq::context_t ctx;
  zmq::socket_t s{ctx, zmq::socket_type::dealer};
  explicit RawSender(const std::string& url) {
    s.set(zmq::sockopt::linger, 0);
    s.connect(url);
  }
  void transfer(std::span<const std::byte> data, std::shared_ptr<const void>) override {
    const std::uint64_t total = data.size();
    for (std::size_t off = 0; off < data.size(); off += kRawChunk) {
      const std::size_t n = std::min(kRawChunk, data.size() - off);
      s.send(zmq::message_t(&total, 8), zmq::send_flags::sndmore);
      // Zero-copy: ZeroMQ reads the caller's memory, which outlives the transfer.
      s.send(zmq::message_t(const_cast<std::byte*>(data.data() + off), n, nullptr, nullptr));
    }
    zmq::message_t ack;
    (void)s.recv(ack);
  }
  void stop() override {
    const std::uint64_t zero = 0;
    s.send(zmq::message_t(&zero, 8), zmq::send_flags::none);
  }
};

struct CohortSender final : Sender {
  Context ctx;
  ThreadPool pool{2};
  Endpoint ep;
  CohortSender(const Args& a, const std::string& url)
      : ep(Endpoint::connect(ctx, url, options(a, "client-0", &pool))) {
    ep.wait_ready(15s);
  }
  void transfer(std::span<const std::byte> data, std::shared_ptr<const void> owner) override {
    Envelope e;
    e.body = Push{0, 0, data.size() / 4, 1, 0, Encoding::kDenseF32, PushKind::kDelta, 0, 0,
                  data.size() / 4};
    ep.send({}, std::move(e), Payload{data, std::move(owner)});
    for (;;) {
      auto m = ep.receive(30s);
      if (!m) throw TimeoutError("no acknowledgement within 30 s");
      if (std::holds_alternative<PushAck>(m->envelope.body)) return;
    }
  }
  void stop() override {
    Envelope bye;
    bye.body = Bye{"done"};
    ep.send({}, std::move(bye));
    std::this_thread::sleep_for(50ms);
  }
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  return v[static_cast<std::size_t>(idx + 0.5)];
}

int run_mode(const Args& a, const std::string& self) {
  std::filesystem::remove(a.dir + "/port");
  std::vector<std::string> args{self, "--role", "recv", "--mode", a.mode, "--dir", a.dir, "--sched", a.sched};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  if (posix_spawn(&child, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return 1;
  std::string port;
  for (int i = 0; i < 1000 && port.empty(); ++i) {
    std::ifstream in(a.dir + "/port");
    std::getline(in, port);
    if (port.empty()) std::this_thread::sleep_for(10ms);
  }
  int rc = 0;
  try {
    if (port.empty()) throw Error("receiver did not start");
    const std::string url = "tcp://127.0.0.1:" + port;
    std::unique_ptr<Sender> sender;
    if (a.mode == "raw_zmq") {
      sender = std::make_unique<RawSender>(url);
    } else {
      sender = std::make_unique<CohortSender>(a, url);
    }
    for (std::size_t mib : a.sizes_mib) {
      const std::size_t bytes = mib << 20;
      auto owned = std::make_shared<std::vector<std::byte>>(bytes);
      std::vector<std::byte>& data = *owned;
      for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::byte>(i * 131 + 7);
      const int repeats = a.repeats > 0 ? a.repeats : (a.quick ? 2 : (mib >= 64 ? 7 : 11));
      for (int w = 0; w < 2; ++w) sender->transfer(data, owned);  // warm up pools and connections
      std::vector<double> gbps;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = Clock::now();
        sender->transfer(data, owned);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        gbps.push_back(static_cast<double>(bytes) / s / 1e9);
      }
      std::printf("{\"bench\":\"transport\",\"mode\":\"%s\",\"bytes\":%zu,\"gbps\":%.3f,"
                  "\"p10_gbps\":%.3f,\"p90_gbps\":%.3f,\"repeats\":%d}\n",
                  a.mode.c_str(), bytes, percentile(gbps, 0.5), percentile(gbps, 0.1),
                  percentile(gbps, 0.9), repeats);
      std::fflush(stdout);
    }
    sender->stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-bench-transport: %s: %s\n", a.mode.c_str(), e.what());
    rc = 1;
  }
  int st = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(child, &st, WNOHANG) == child) return rc;
    std::this_thread::sleep_for(10ms);
  }
  kill(child, SIGKILL);
  waitpid(child, &st, 0);
  return rc;
}

// One thread's seal, open and memcpy speed over `bytes`, in 1 MiB frames (median of repeats).
int run_cipher(const Args& a) {
  std::array<std::byte, security::FrameCipher::kKeyBytes> key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::byte>(i * 7 + 1);
  const security::FrameCipher cipher(key);
  constexpr std::size_t kFrame = 1 << 20;
  constexpr std::size_t kTag = security::FrameCipher::kTagBytes;
  const std::array<std::byte, 8> aad{};
  for (const std::size_t mib : a.sizes_mib) {
    const std::size_t bytes = std::max<std::size_t>(1, mib) << 20;
    const std::size_t frames = (bytes + kFrame - 1) / kFrame;
    std::vector<std::byte> plain(bytes, std::byte{1}), sealed(bytes + frames * kTag), back(bytes);
    const int repeats = a.repeats > 0 ? a.repeats : (a.quick ? 2 : 9);
    auto frame = [&](std::size_t f) { return std::min(kFrame, bytes - f * kFrame); };
    auto time = [&](auto&& body) {
      std::vector<double> gbps;
      for (int r = 0; r <= repeats; ++r) {  // the first pass touches the pages, untimed
        const auto t0 = Clock::now();
        body();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r > 0) gbps.push_back(static_cast<double>(bytes) / s / 1e9);
      }
      std::sort(gbps.begin(), gbps.end());
      return gbps[gbps.size() / 2];
    };
    const double seal = time([&] {
      for (std::size_t f = 0; f < frames; ++f) {
        const auto in = std::span<const std::byte>(plain).subspan(f * kFrame, frame(f));
        cipher.seal(f, 1, aad, in, std::span<std::byte>(sealed).subspan(f * (kFrame + kTag), frame(f) + kTag));
      }
    });
    bool ok = true;
    const double open = time([&] {
      for (std::size_t f = 0; f < frames; ++f) {
        const auto in = std::span<const std::byte>(sealed).subspan(f * (kFrame + kTag), frame(f) + kTag);
        ok &= cipher.open(f, 1, aad, in, std::span<std::byte>(back).subspan(f * kFrame, frame(f)));
      }
    });
    if (!ok || back != plain) {
      std::fprintf(stderr, "cipher: open did not give back the plaintext\n");
      return 1;
    }
    const double copy = time([&] { std::memcpy(back.data(), plain.data(), bytes); });
    for (const auto& [op, g] : {std::pair{"seal", seal}, std::pair{"open", open}, std::pair{"memcpy", copy}}) {
      std::printf("{\"bench\":\"transport\",\"mode\":\"cipher\",\"op\":\"%s\",\"bytes\":%zu,"
                  "\"gbps\":%.3f,\"repeats\":%d}\n",
                  op, bytes, g, repeats);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::transport::tune_allocator_for_large_messages();  // large frames: see its header
  CLI::App app{"Transport throughput between two processes over tcp://127.0.0.1 (JSON lines)."};
  Args a;
  std::vector<std::string> modes{"raw_zmq", "plain", "tls"};
  app.add_option("--modes", modes,
                 "modes to run: raw_zmq, plain, tls (between processes), cipher (seal and open "
                 "speed on one thread)");
  app.add_option("--sizes-mib", a.sizes_mib, "message sizes in MiB");
  app.add_option("--repeats", a.repeats, "timed transfers per size (default 11, 7 at 64 MiB)");
  app.add_flag("--quick", a.quick, "tiny run for smoke tests");
  cohort::add_sched_flag(app, a.sched, "both processes in the plain and tls modes");
  app.add_option("--role", a.role, "internal: send or recv");
  app.add_option("--mode", a.mode, "internal: the receiver's mode");
  app.add_option("--dir", a.dir, "internal: working directory");
  CLI11_PARSE(app, argc, argv);
  try {
    set_log_level(LogLevel::Warn);
    set_io_scheduling(parse_scheduling(a.sched));
    if (a.role == "recv") return receive(a);
    if (a.quick && !app.count("--sizes-mib")) a.sizes_mib = {1};
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("cohort-bench-transport-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    a.dir = dir.string();
    security::generate_ca(dir / "ca");
    security::generate_node(dir / "ca", "shard-0", dir / "certs");
    security::generate_node(dir / "ca", "client-0", dir / "certs");
    int rc = 0;
    for (const auto& m : modes) {
      if (m != "raw_zmq" && m != "plain" && m != "tls" && m != "cipher") {
        std::fprintf(stderr, "unknown mode '%s' (raw_zmq, plain, tls, cipher)\n", m.c_str());
        return 2;
      }
      if (m == "cipher") {
        rc |= run_cipher(a);
        continue;
      }
      a.mode = m;
      rc |= run_mode(a, self);
    }
    std::filesystem::remove_all(dir);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-bench-transport: %s\n", e.what());
    return 1;
  }
}
