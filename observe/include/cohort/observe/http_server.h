// The read-only HTTP endpoint of a server process or the simulator (Debian's cpp-httplib): the
// dashboard at /, Prometheus text at /metrics, and the JSON API at /api/v1/ (docs/HTTP_API.md).
// It serves on its own small thread pool from a Telemetry store and never touches the process's
// message loop. Nothing it serves can change the federation: every method but GET and HEAD is
// refused (405), request bodies over 4 KiB are refused (413), and a client that sends nothing for
// `read_timeout` is disconnected.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "cohort/observe/telemetry.h"

namespace httplib {
class Server;
}

namespace cohort::observe {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 9100;  // 0: any free port (see HttpServer::port())
  // HTTPS with this certificate and key when both are set (TLS 1.3 only), plain HTTP otherwise.
  std::string cert_file, key_file;
  int threads = 8;  // connections served at once (each held at most read_timeout per read)
  std::chrono::seconds read_timeout{5};
};

// The files the dashboard is made of, by name ("index.html", "dashboard.js", "chart.js"); nullopt
// for a name it does not know.
using AssetLookup = std::function<std::optional<std::string_view>(std::string_view name)>;

class HttpServer {
 public:
  // Binds at once and serves on its own threads until destroyed. Throws ConfigError when the
  // address cannot be bound or the certificate cannot be loaded. `telemetry` must outlive it.
  HttpServer(const HttpOptions& options, const Telemetry& telemetry, AssetLookup assets);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  [[nodiscard]] int port() const { return port_; }
  // http(s)://host:port
  [[nodiscard]] std::string url() const;

 private:
  void routes(const Telemetry& telemetry, AssetLookup assets);

  std::unique_ptr<httplib::Server> server_;
  bool secure_ = false;
  std::string host_;
  int port_ = 0;
  std::thread thread_;
};

// "host:port" (IPv4 dotted, a name, or [IPv6]); throws ConfigError naming `key` when malformed.
HttpOptions parse_http_address(const std::string& address, const std::string& key);
// True for 127.0.0.0/8, ::1 and localhost.
bool is_loopback(const std::string& host);

}  // namespace cohort::observe
