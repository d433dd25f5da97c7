// What one server process shows on its HTTP endpoint (observe/): its own figures, refreshed about
// once a second by the message loop, and on shard 0 the coordinator's and every other shard's, so
// that one scrape of shard 0 sees the whole federation. Internal to the server library.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cohort/core/metrics.h"
#include "cohort/observe/http_server.h"
#include "cohort/observe/telemetry.h"
#include "cohort/transport/endpoint.h"

#include "server_options.h"
#include "shard_core.h"

namespace cohort::server {

// The coordinator's membership and progress, as the endpoint shows them.
struct CoordinatorSnapshot {
  std::string state;  // waiting | running | finished | failed
  std::uint64_t rounds_planned = 0;
  std::size_t registered = 0, selected = 0, reporting = 0, unreachable = 0;
  struct Client {
    std::string name;
    std::string state;  // selected | reported | training | idle | unreachable
  };
  std::vector<Client> clients;  // at most kMaxClientRows, by name
};
inline constexpr std::size_t kMaxClientRows = 1000;

class ServerTelemetry {
 public:
  ServerTelemetry(const ServerOptions& options, std::uint32_t shard);

  [[nodiscard]] const observe::Telemetry& store() const { return t_; }
  // Shard 0: rounds, failed rounds and client records come from the metrics sink.
  void watch(MetricsSink& sink);
  // This process's figures; the message loop calls it about once a second.
  void refresh(const transport::EndpointStats& listener, const ShardStats& shard);
  void refresh(const CoordinatorSnapshot& coordinator);
  // Counts the message loop's time in the refreshes (and in sending them to shard 0).
  void add_refresh_time(double seconds);
  // Shards > 0: this process's samples, as the Telemetry message's payload (JSON).
  [[nodiscard]] std::vector<std::byte> encode_samples() const;
  // Shard 0: what shard `shard` sent. Throws ProtocolError for a malformed payload.
  void on_remote(std::uint32_t shard, std::span<const std::byte> payload);

 private:
  struct ClientRow {
    std::uint64_t last_round = 0, rounds = 0;
    double samples_per_second = 0, throughput = 0;
    std::uint64_t assigned_steps = 0, micro_batch = 0;
  };
  void on_record(std::string_view event, const std::vector<MetricField>& fields);
  void on_round(const std::vector<MetricField>& fields);
  void on_client(const std::vector<MetricField>& fields);

  observe::Telemetry t_;
  std::string shard_;  // the label shard="i"
  std::uint32_t index_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;  // guards the members below (sink observer vs. message loop)
  std::map<std::string, ClientRow> clients_;  // from the "client" records, by name
  std::map<std::uint32_t, nlohmann::json> shard_rows_;
  std::map<std::string, double> refusals_;            // this process's, by reason class
  nlohmann::json latest_ = nlohmann::json::object();  // the status's "latest", kept here
  std::uint64_t rounds_failed_ = 0;
  std::chrono::steady_clock::time_point last_refresh_{};
  std::uint64_t last_push_ = 0, last_pull_ = 0;  // at the last refresh, for the throughputs
};

// The HTTP endpoint a server process runs, per server.http: none, or one serving `telemetry`.
// A default address (shard 0, server.http empty) that is taken is a warning, not an error, so that
// several federations can run on one host; an address the user set must bind.
std::unique_ptr<observe::HttpServer> start_http(const HttpEndpointOptions& options,
                                                const observe::Telemetry& telemetry);

}  // namespace cohort::server
