#include "cohort/transport/zmq_comm.h"

#include <doctest/doctest.h>

#include <numeric>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/transport/security/security.h"
#include "process.h"

using namespace cohort;
using namespace cohort::transport;
using namespace std::chrono_literals;
namespace sec = cohort::transport::security;

namespace {

struct Group {
  test::TempDir dir;
  std::vector<sec::TlsFiles> files;
  explicit Group(Rank n) {
    sec::generate_ca(dir.path() / "ca");
    for (Rank r = 0; r < n; ++r) {
      files.push_back(
          sec::generate_node(dir.path() / "ca", "peer-" + std::to_string(r), dir.path() / "certs"));
    }
  }
  EndpointOptions options(Rank r, bool insecure) const {
    EndpointOptions o;
    o.node_id = "peer-" + std::to_string(r);
    o.security.insecure = insecure;
    o.security.ca_file = files[r].ca_file;
    o.security.cert_file = files[r].cert_file;
    o.security.key_file = files[r].key_file;
    o.handshake_timeout = 20s;
    return o;
  }
};

// Every rank sends a distinct vector to every other rank under two tags (in reverse tag order)
// and checks what it receives; then one big message goes around the ring.
void exchange(bool insecure) {
  const Rank n = 3;
  Group g(n);
  Context ctx;
  std::vector<std::unique_ptr<ZmqComm>> comms;
  std::vector<PeerAddress> peers;
  for (Rank r = 0; r < n; ++r) {
    comms.push_back(
        std::make_unique<ZmqComm>(ctx, r, n, "tcp://127.0.0.1:*", g.options(r, insecure)));
    peers.push_back({comms[r]->url(), "peer-" + std::to_string(r)});
  }
  for (auto& c : comms) c->set_peers(peers);
  std::vector<std::string> errors(n);
  {
    std::vector<std::jthread> threads;
    for (Rank r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          ZmqComm& c = *comms[r];
          std::vector<Rank> others;
          for (Rank k = 0; k < n; ++k)
            if (k != r) others.push_back(k);
          c.connect(others, 30s);
          for (Rank k : others) {
            for (std::uint64_t tag : {2, 1}) {
              std::vector<float> v(10 + tag, static_cast<float>(100 * r + 10 * k + tag));
              send_floats(c, k, tag, v);
            }
          }
          for (Rank k : others) {
            for (std::uint64_t tag : {1, 2}) {
              std::vector<float> v(10 + tag);
              if (!recv_floats(c, k, tag, v, 30s)) throw std::runtime_error("no message");
              CHECK(v.back() == static_cast<float>(100 * k + 10 * r + tag));
            }
          }
          // 3 MiB + 12 bytes: several transport chunks and an odd tail.
          std::vector<float> big((std::size_t{3} << 18) + 3);
          std::iota(big.begin(), big.end(), static_cast<float>(r));
          send_floats(c, (r + 1) % n, 9, big);
          std::vector<float> got(big.size());
          if (!recv_floats(c, (r + n - 1) % n, 9, got, 60s))
            throw std::runtime_error("no big message");
          CHECK(got[0] == static_cast<float>((r + n - 1) % n));
          CHECK(got.back() == static_cast<float>((r + n - 1) % n + big.size() - 1));
          CHECK_FALSE(recv_floats(c, (r + n - 1) % n, 9, got, 10ms));
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
  }
  for (Rank r = 0; r < n; ++r) CHECK_MESSAGE(errors[r].empty(), errors[r]);
  CHECK(comms[0]->bytes_sent() >= (std::size_t{3} << 20));
}

TEST_CASE("zmq comm over TLS: tagged messages between three ranks, and a large one") {
  exchange(false);
}

TEST_CASE("zmq comm in plaintext (--insecure)") { exchange(true); }

TEST_CASE("zmq comm: a rank without an address is a TransportError, a silent one times out") {
  Group g(2);
  Context ctx;
  ZmqComm a(ctx, 0, 2, "tcp://127.0.0.1:*", g.options(0, true));
  std::vector<float> v(4);
  CHECK_THROWS_AS(send_floats(a, 1, 0, v), TransportError);
  CHECK_FALSE(a.recv(1, 0, 20ms).has_value());
  CHECK_THROWS_AS(ZmqComm(ctx, 2, 2, "tcp://127.0.0.1:*", g.options(0, true)), ConfigError);
}

}  // namespace
