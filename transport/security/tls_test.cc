#include "cohort/transport/security/tls.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "cohort/core/error.h"
#include "cohort/transport/security/keygen.h"
#include "keygen_internal.h"
#include "test_support.h"

namespace sec = cohort::transport::security;
using cohort::ConfigError;
using cohort::InternalError;
using cohort::TransportError;
using sec::Handshake;
using sec::Role;
using sec::TlsContext;
using sec::test::run_handshake;
using sec::test::TempDir;

namespace {

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// Two CAs (a, b) and nodes signed by them, in one temp dir.
struct Pki {
  TempDir dir;
  Pki() {
    sec::generate_ca(dir / "ca-a", "ca-a");
    sec::generate_ca(dir / "ca-b", "ca-b");
  }
  sec::TlsFiles node(const std::string& name, const std::string& ca = "ca-a") {
    return sec::generate_node(dir / ca, name, dir / ("nodes-" + ca));
  }
};

// Runs the handshake expecting a TransportError whose message contains `needle`.
void expect_refused(Handshake& client, Handshake& server, const std::string& needle) {
  std::string message;
  try {
    run_handshake(client, server);
  } catch (const TransportError& e) {
    message = e.what();
  }
  INFO("error: " << message);
  CHECK(message.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("mutual handshake completes and both sides derive matching per-direction keys") {
  Pki pki;
  const TlsContext server_ctx(pki.node("shard-0"));
  const TlsContext client_ctx(pki.node("client-1"));
  CHECK(server_ctx.local_id() == "shard-0");
  CHECK(client_ctx.local_id() == "client-1");

  Handshake client(client_ctx, Role::kClient, "shard-0");
  Handshake server(server_ctx, Role::kServer, "client-1");
  CHECK_FALSE(client.done());
  CHECK(server.step({}).empty());  // a server called early has nothing to say

  const auto hello = client.step({});
  REQUIRE_FALSE(hello.empty());
  const auto server_flight = server.step(hello);
  REQUIRE_FALSE(server_flight.empty());
  CHECK_FALSE(server.done());
  const auto client_flight = client.step(server_flight);
  REQUIRE_FALSE(client_flight.empty());
  CHECK(client.done());
  CHECK_FALSE(server.done());
  CHECK(server.step(client_flight).empty());
  CHECK(server.done());
  CHECK(client.step({}).empty());  // done stays done
  CHECK(client.done());

  CHECK(client.peer_id() == "shard-0");
  CHECK(server.peer_id() == "client-1");
  const sec::SessionKeys ck = client.keys();
  const sec::SessionKeys sk = server.keys();
  CHECK(ck.tx == sk.rx);
  CHECK(ck.rx == sk.tx);
  CHECK(ck.tx != ck.rx);

  // A second session between the same nodes gets fresh keys.
  Handshake client2(client_ctx, Role::kClient, std::nullopt);  // accept any CA-signed peer
  Handshake server2(server_ctx, Role::kServer, "client-1");
  run_handshake(client2, server2);
  REQUIRE(client2.done());
  REQUIRE(server2.done());
  CHECK(client2.peer_id() == "shard-0");
  CHECK(client2.keys().tx != ck.tx);
}

TEST_CASE("peer_id and keys before done are a caller bug") {
  Pki pki;
  const TlsContext ctx(pki.node("n1"));
  Handshake client(ctx, Role::kClient, std::nullopt);
  CHECK_THROWS_AS((void)client.peer_id(), InternalError);
  CHECK_THROWS_AS((void)client.keys(), InternalError);
}

TEST_CASE("the client refuses a server certificate signed by another CA") {
  Pki pki;
  sec::TlsFiles server_files = pki.node("shard-0", "ca-b");
  server_files.ca_file = (pki.dir / "ca-a" / "ca.pem").string();  // server trusts the client
  const TlsContext server_ctx(server_files);
  const TlsContext client_ctx(pki.node("client-1"));
  Handshake client(client_ctx, Role::kClient, "shard-0");
  Handshake server(server_ctx, Role::kServer, "client-1");
  expect_refused(client, server, "unable to get local issuer certificate");
  CHECK_FALSE(client.done());
  CHECK_FALSE(server.done());
  CHECK_THROWS_AS(client.step({}), TransportError);  // a failed handshake stays failed
}

TEST_CASE("the server refuses a client certificate signed by another CA") {
  Pki pki;
  const TlsContext server_ctx(pki.node("shard-0"));
  sec::TlsFiles client_files = pki.node("client-1", "ca-b");
  client_files.ca_file = (pki.dir / "ca-a" / "ca.pem").string();  // client trusts the server
  const TlsContext client_ctx(client_files);
  Handshake client(client_ctx, Role::kClient, "shard-0");
  Handshake server(server_ctx, Role::kServer, "client-1");
  expect_refused(client, server, "unable to get local issuer certificate");
  CHECK_FALSE(server.done());
}

TEST_CASE("a certificate whose CN differs from the claimed id is refused, on both sides") {
  Pki pki;
  const TlsContext shard0(pki.node("shard-0"));
  const TlsContext client1(pki.node("client-1"));
  SUBCASE("client dialled shard-1 but reached shard-0") {
    Handshake client(client1, Role::kClient, "shard-1");
    Handshake server(shard0, Role::kServer, "client-1");
    expect_refused(client, server,
                   "peer certificate names 'shard-0' but the peer claims 'shard-1'");
    CHECK_FALSE(client.done());
  }
  SUBCASE("client-1 claims to be client-2") {
    Handshake client(client1, Role::kClient, "shard-0");
    Handshake server(shard0, Role::kServer, "client-2");
    expect_refused(client, server,
                   "peer certificate names 'client-1' but the peer claims 'client-2'");
    CHECK_FALSE(server.done());
  }
}

TEST_CASE("expired and not-yet-valid certificates are refused") {
  using namespace std::chrono_literals;
  Pki pki;
  const TlsContext server_ctx(pki.node("shard-0"));
  SUBCASE("expired") {
    const TlsContext client_ctx(sec::detail::generate_node_for_testing(
        pki.dir / "ca-a", "client-1", pki.dir / "old", -48h, -24h));
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    expect_refused(client, server, "certificate has expired");
  }
  SUBCASE("not yet valid") {
    const TlsContext client_ctx(sec::detail::generate_node_for_testing(pki.dir / "ca-a", "client-1",
                                                                       pki.dir / "new", 24h, 48h));
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    expect_refused(client, server, "certificate is not yet valid");
  }
}

TEST_CASE("garbage, plaintext and truncated messages throw TransportError and never crash") {
  Pki pki;
  const TlsContext server_ctx(pki.node("shard-0"));
  const TlsContext client_ctx(pki.node("client-1"));

  SUBCASE("plaintext to a server") {
    Handshake server(server_ctx, Role::kServer, "client-1");
    CHECK_THROWS_AS(server.step(bytes_of("GET / HTTP/1.1\r\nHost: x\r\n\r\n")), TransportError);
    CHECK_THROWS_AS(server.step(bytes_of("again")), TransportError);
  }
  SUBCASE("plaintext to a client awaiting the server's flight") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    (void)client.step({});
    CHECK_THROWS_AS(client.step(bytes_of("hello, I am a server")), TransportError);
  }
  SUBCASE("random bytes, many seeds, both roles") {
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::byte> junk(1 + rng() % 3000);
      for (auto& b : junk) b = static_cast<std::byte>(rng());
      if (trial % 4 == 0) junk[0] = std::byte{0x16};  // looks like a handshake record
      if (trial % 8 == 0 && junk.size() > 3) junk[1] = std::byte{0x03}, junk[2] = std::byte{0x01};
      Handshake server(server_ctx, Role::kServer, "client-1");
      CHECK_THROWS_AS(server.step(junk), TransportError);
      Handshake client(client_ctx, Role::kClient, "shard-0");
      (void)client.step({});
      CHECK_THROWS_AS(client.step(junk), TransportError);
    }
  }
  SUBCASE("flipped bytes inside a real server flight") {
    Handshake probe_client(client_ctx, Role::kClient, "shard-0");
    Handshake probe_server(server_ctx, Role::kServer, "client-1");
    const auto flight = probe_server.step(probe_client.step({}));
    for (std::size_t at = 0; at < flight.size(); at += 37) {
      Handshake client(client_ctx, Role::kClient, "shard-0");
      Handshake server(server_ctx, Role::kServer, "client-1");
      auto tampered = server.step(client.step({}));
      tampered[at % tampered.size()] ^= std::byte{0x5a};
      CHECK_THROWS_AS(client.step(tampered), TransportError);
    }
  }
  SUBCASE("truncated ClientHello") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    auto hello = client.step({});
    hello.resize(hello.size() / 2);
    CHECK_THROWS_WITH_AS(server.step(hello), doctest::Contains("truncated"), TransportError);
  }
  SUBCASE("truncated server flight") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    auto flight = server.step(client.step({}));
    flight.resize(flight.size() - 10);
    CHECK_THROWS_WITH_AS(client.step(flight), doctest::Contains("truncated"), TransportError);
    CHECK_FALSE(client.done());
  }
  SUBCASE("truncated client flight") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    auto final_flight = client.step(server.step(client.step({})));
    final_flight.resize(final_flight.size() - 1);
    CHECK_THROWS_AS(server.step(final_flight), TransportError);
    CHECK_FALSE(server.done());
  }
  SUBCASE("trailing bytes after the last handshake message") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    auto final_flight = client.step(server.step(client.step({})));
    final_flight.push_back(std::byte{0x17});
    CHECK_THROWS_AS(server.step(final_flight), TransportError);
  }
  SUBCASE("oversized input") {
    Handshake server(server_ctx, Role::kServer, "client-1");
    const std::vector<std::byte> huge(Handshake::kMaxMessageBytes + 1, std::byte{0x16});
    CHECK_THROWS_WITH_AS(server.step(huge), doctest::Contains("exceeds"), TransportError);
  }
  SUBCASE("bytes after completion") {
    Handshake client(client_ctx, Role::kClient, "shard-0");
    Handshake server(server_ctx, Role::kServer, "client-1");
    run_handshake(client, server);
    REQUIRE(server.done());
    CHECK_THROWS_AS(server.step(bytes_of("more")), TransportError);
  }
}

TEST_CASE("TlsContext names the bad file") {
  Pki pki;
  const sec::TlsFiles good = pki.node("n1");
  const sec::TlsFiles other = pki.node("n2");
  auto message_of = [](const sec::TlsFiles& files) {
    try {
      TlsContext ctx(files);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  sec::TlsFiles f = good;
  f.ca_file = (pki.dir / "missing.pem").string();
  CHECK(message_of(f).find("missing.pem' does not exist") != std::string::npos);

  const auto not_pem = pki.dir / "not.pem";
  std::ofstream(not_pem) << "this is not PEM\n";
  f = good;
  f.cert_file = not_pem.string();
  CHECK(message_of(f).find("not.pem' holds no PEM certificate") != std::string::npos);
  f = good;
  f.key_file = not_pem.string();
  CHECK(message_of(f).find("not.pem' holds no unencrypted PEM private key") != std::string::npos);
  f = good;
  f.ca_file = not_pem.string();
  CHECK(message_of(f).find("not.pem' holds no PEM certificate") != std::string::npos);

  f = good;
  f.key_file = other.key_file;
  CHECK(message_of(f).find("do not match") != std::string::npos);

  f = good;
  f.cert_file = pki.dir.path().string();
  CHECK(message_of(f).find("is a directory") != std::string::npos);
}
