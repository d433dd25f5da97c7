#include "cohort/observe/http_server.h"

#include <httplib.h>
#include <openssl/ssl.h>

#include <sys/socket.h>

#include <pthread.h>

#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "cohort/core/error.h"
#include "cohort/core/log.h"

namespace cohort::observe {
namespace {

constexpr std::size_t kMaxBody = 4096;
constexpr std::size_t kMaxRoundsPerReply = 1000;

void json_reply(httplib::Response& res, int status, const nlohmann::json& j) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(j.dump(), "application/json");
}

void error_reply(httplib::Response& res, int status, const std::string& why) {
  json_reply(res, status, nlohmann::json{{"error", why}});
}

const char* content_type(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  return "application/octet-stream";
}

std::optional<std::uint64_t> parse_u64(const std::string& s) {
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// httplib's task queue with its threads named "cohort-http", so that top, gdb and
// bench/http_overhead.sh (which sums their CPU time from /proc) can tell them apart.
class NamedPool final : public httplib::TaskQueue {
 public:
  explicit NamedPool(std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "cohort-http");
        work();
      });
    }
  }
  ~NamedPool() override { shutdown(); }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every accepted connection served
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;  // guards jobs_ and stopping_
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

HttpOptions parse_http_address(const std::string& address, const std::string& key) {
  HttpOptions o;
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw ConfigError(key + " must be host:port (e.g. 127.0.0.1:9100), got '" + address + "'");
  }
  o.host = address.substr(0, colon);
  if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']') {
    o.host = o.host.substr(1, o.host.size() - 2);
  }
  const auto port = parse_u64(address.substr(colon + 1));
  if (!port || *port > 65535) {
    throw ConfigError(key + ": '" + address.substr(colon + 1) + "' is not a port (0-65535)");
  }
  o.port = static_cast<int>(*port);
  return o;
}

HttpServer::HttpServer(const HttpOptions& options, const Telemetry& telemetry, AssetLookup assets)
    : host_(options.host) {
  if (!options.cert_file.empty() && !options.key_file.empty()) {
    auto ssl =
        std::make_unique<httplib::SSLServer>(options.cert_file.c_str(), options.key_file.c_str());
    if (!ssl->is_valid()) {
      throw ConfigError("cannot serve HTTPS with certificate " + options.cert_file + " and key " +
                        options.key_file);
    }
    SSL_CTX_set_min_proto_version(ssl->ssl_context(), TLS1_3_VERSION);
    server_ = std::move(ssl);
    secure_ = true;
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  const auto threads = static_cast<std::size_t>(std::max(1, options.threads));
  server_->new_task_queue = [threads] { return new NamedPool(threads); };
  server_->set_read_timeout(options.read_timeout);
  server_->set_write_timeout(options.read_timeout);
  server_->set_keep_alive_timeout(options.read_timeout.count());
  server_->set_payload_max_length(kMaxBody);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second process bind
  // the same port and take half of the first one's scrapes.
  server_->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  routes(telemetry, std::move(assets));
  if (options.port == 0) {
    port_ = server_->bind_to_any_port(options.host);
  } else {
    port_ = server_->bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (port_ <= 0) {
    throw ConfigError("cannot bind the HTTP endpoint to " + options.host + ":" +
                      std::to_string(options.port) + " (in use, or not an address of this host)");
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // Serving before the constructor returns: a stop() that came before the accept loop started
  // would not end it.
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

HttpServer::~HttpServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string HttpServer::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return std::string(secure_ ? "https://" : "http://") + (v6 ? "[" + host_ + "]" : host_) + ":" +
         std::to_string(port_);
}

void HttpServer::routes(const Telemetry& telemetry, AssetLookup assets) {
  auto& s = *server_;
  // Read-only: only GET (and the HEAD httplib derives from it) reach a handler.
  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD")
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Allow", "GET, HEAD");
    error_reply(res, 405, "read-only endpoint: " + req.method + " is not allowed");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string why = res.status == 404   ? "no such path: " + req.path.substr(0, 200)
                            : res.status == 413 ? "request body too large"
                                                : "bad request";
    error_reply(res, res.status, why);
  });
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string why = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          why = e.what();
        } catch (...) {
        }
        error_reply(res, 500, why);
      });
  s.Get("/metrics", [&telemetry](const httplib::Request&, httplib::Response& res) {
    res.set_content(telemetry.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/api/v1/status", [&telemetry](const httplib::Request&, httplib::Response& res) {
    json_reply(res, 200, telemetry.status());
  });
  s.Get("/api/v1/rounds", [&telemetry](const httplib::Request& req, httplib::Response& res) {
    std::uint64_t since = 0;
    if (req.has_param("since")) {
      const auto v = parse_u64(req.get_param_value("since"));
      if (!v) return error_reply(res, 400, "since must be a round number (an unsigned integer)");
      since = *v;
    }
    json_reply(res, 200, telemetry.rounds_since(since, kMaxRoundsPerReply));
  });
  auto asset = [assets](std::string name) {
    return [assets, name](const httplib::Request&, httplib::Response& res) {
      const auto body = assets ? assets(name) : std::nullopt;
      if (!body) return error_reply(res, 404, "this build has no " + name);
      res.set_content(std::string(*body), content_type(name));
    };
  };
  s.Get("/", asset("index.html"));
  s.Get("/index.html", asset("index.html"));
  s.Get("/static/dashboard.js", asset("dashboard.js"));
  s.Get("/static/chart.js", asset("chart.js"));
}

}  // namespace cohort::observe
