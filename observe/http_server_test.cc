#include "cohort/observe/http_server.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cohort/core/error.h"

using namespace cohort::observe;

namespace {

struct Fixture {
  Telemetry telemetry;
  std::optional<HttpServer> server;
  Fixture() {
    telemetry.describe("cohort_rounds_committed_total", Kind::kCounter, "rounds committed");
    telemetry.add("cohort_rounds_committed_total", "", 4);
    telemetry.set_status("state", "running");
    for (std::uint64_t r = 1; r <= 3; ++r) telemetry.add_round({{"round", r}});
    HttpOptions o;
    o.port = 0;
    o.threads = 2;
    o.read_timeout = std::chrono::seconds(1);
    server.emplace(o, telemetry, [](std::string_view name) -> std::optional<std::string_view> {
      if (name == "index.html") return "<html>dashboard</html>";
      return std::nullopt;
    });
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(std::chrono::seconds(5));
    c.set_connection_timeout(std::chrono::seconds(5));
    return c;
  }
};

}  // namespace

TEST_CASE("the endpoint serves metrics, status, rounds and the page") {
  Fixture f;
  auto c = f.client();
  auto r = c.Get("/metrics");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  CHECK(r->body.find("cohort_rounds_committed_total 4\n") != std::string::npos);
  r = c.Get("/api/v1/status");
  REQUIRE(r);
  CHECK(nlohmann::json::parse(r->body)["state"] == "running");
  r = c.Get("/api/v1/rounds?since=1");
  REQUIRE(r);
  const auto j = nlohmann::json::parse(r->body);
  CHECK(j["rounds"].size() == 2);
  CHECK(j["next"] == 3);
  r = c.Get("/");
  REQUIRE(r);
  CHECK(r->body == "<html>dashboard</html>");
  CHECK(f.server->url() == "http://127.0.0.1:" + std::to_string(f.server->port()));
}

TEST_CASE("bad requests get errors: unknown paths, bad queries, writes, bodies, huge headers") {
  Fixture f;
  auto c = f.client();
  auto r = c.Get("/nope");
  REQUIRE(r);
  CHECK(r->status == 404);
  CHECK(nlohmann::json::parse(r->body)["error"].get<std::string>().find("/nope") !=
        std::string::npos);
  r = c.Get("/static/chart.js");  // this lookup has no chart.js
  REQUIRE(r);
  CHECK(r->status == 404);
  r = c.Get("/api/v1/rounds?since=-1");
  REQUIRE(r);
  CHECK(r->status == 400);
  r = c.Post("/api/v1/status", "{}", "application/json");
  REQUIRE(r);
  CHECK(r->status == 405);
  r = c.Delete("/metrics");
  REQUIRE(r);
  CHECK(r->status == 405);
  httplib::Headers huge{{"X-Huge", std::string(64 * 1024, 'a')}};
  r = c.Get("/metrics", huge);
  // The server refuses the header (400) and closes; either way no handler ran.
  CHECK((!r || r->status == 400 || r->status == 431));
  // The server still answers afterwards.
  auto c2 = f.client();
  r = c2.Get("/metrics");
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("a slow client is cut off and does not stop others from being served") {
  Fixture f;
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(f.server->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const char partial[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // never finished
  REQUIRE(::send(s, partial, sizeof partial - 1, 0) > 0);
  auto c = f.client();
  auto r = c.Get("/api/v1/status");  // the other thread serves it meanwhile
  REQUIRE(r);
  CHECK(r->status == 200);
  // After the read timeout (1 s) the server closes the slow connection: recv sees EOF or an
  // error reply, bounded by a 10 s receive timeout of our own.
  timeval tv{10, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[512];
  const auto n = ::recv(s, buf, sizeof buf, 0);
  CHECK(n >= 0);  // 0: closed; > 0: an error status line; -1 would be our own timeout
  if (n > 0) CHECK(std::string(buf, static_cast<std::size_t>(n)).rfind("HTTP/1.1 4", 0) == 0);
  ::close(s);
}

TEST_CASE("addresses are parsed and checked") {
  auto o = parse_http_address("127.0.0.1:9100", "server.http");
  CHECK(o.host == "127.0.0.1");
  CHECK(o.port == 9100);
  o = parse_http_address("[::1]:0", "server.http");
  CHECK(o.host == "::1");
  CHECK(is_loopback(o.host));
  CHECK_FALSE(is_loopback("0.0.0.0"));
  CHECK_THROWS_AS(parse_http_address("9100", "server.http"), cohort::ConfigError);
  CHECK_THROWS_AS(parse_http_address("host:99999", "server.http"), cohort::ConfigError);
  CHECK_THROWS_AS(parse_http_address("host:x", "server.http"), cohort::ConfigError);
  Telemetry t;
  HttpOptions taken;
  taken.port = 0;
  HttpServer first(taken, t, nullptr);
  taken.port = first.port();
  CHECK_THROWS_AS(HttpServer(taken, t, nullptr), cohort::ConfigError);
}
