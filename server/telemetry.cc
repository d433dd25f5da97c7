#include "telemetry.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/observe/embedded.h"

namespace cohort::server {
namespace {

using observe::Kind;
using observe::label;

double number(const MetricValue& v) { return numeric(v).value_or(0); }

nlohmann::json to_json(const std::vector<MetricField>& fields) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : fields) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    std::visit([&](const auto& x) { j[key] = x; }, v);
  }
  return j;
}

// The process's resident set, from /proc/self/statm (its second field, in pages).
double resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

const char* mode_name(transport::TrainingMode m) {
  switch (m) {
    case transport::TrainingMode::kBuffered: return "fedbuff";
    case transport::TrainingMode::kDataParallel: return "dataparallel";
    default: return "federated";
  }
}

void describe(observe::Telemetry& t) {
  const std::vector<double> round_buckets{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  t.describe("cohort_rounds_committed_total", Kind::kCounter,
             "Rounds (FedBuff: steps) committed by the coordinator.");
  t.describe("cohort_rounds_failed_total", Kind::kCounter,
             "Rounds that did not commit, by reason.");
  t.describe("cohort_round_duration_seconds", Kind::kHistogram,
             "Wall time of each committed round, from its start to its commit.", round_buckets);
  t.describe("cohort_round_train_seconds", Kind::kGauge,
             "The last committed round's training time (the slowest client's).");
  t.describe("cohort_round_comm_seconds", Kind::kGauge,
             "The last committed round's communication time.");
  t.describe("cohort_clients", Kind::kGauge,
             "Clients by state: registered, selected (this round), reporting (reported this "
             "round), unreachable.");
  t.describe("cohort_train_loss", Kind::kGauge, "The last committed round's mean training loss.");
  t.describe("cohort_test_loss", Kind::kGauge, "The latest evaluation's test loss.");
  t.describe("cohort_test_accuracy", Kind::kGauge, "The latest evaluation's test accuracy (0-1).");
  t.describe("cohort_dp_epsilon", Kind::kGauge,
             "Differential privacy: epsilon spent so far at dp.delta.");
  t.describe("cohort_updates_accepted_total", Kind::kCounter, "Updates a shard accepted.");
  t.describe("cohort_updates_refused_total", Kind::kCounter, "Updates a shard refused, by reason.");
  t.describe("cohort_received_bytes_total", Kind::kCounter,
             "Payload bytes a shard's listening endpoint received.");
  t.describe("cohort_sent_bytes_total", Kind::kCounter,
             "Payload bytes a shard's listening endpoint sent.");
  t.describe("cohort_push_bytes_total", Kind::kCounter, "Update (push) bytes a shard received.");
  t.describe("cohort_pull_bytes_total", Kind::kCounter, "Model (pull) bytes a shard served.");
  t.describe("cohort_push_throughput_bytes_per_second", Kind::kGauge,
             "Push bytes a shard received per second over the last second.");
  t.describe("cohort_pull_throughput_bytes_per_second", Kind::kGauge,
             "Pull bytes a shard served per second over the last second.");
  t.describe("cohort_tls_handshakes_total", Kind::kCounter, "TLS handshakes a shard completed.");
  t.describe("cohort_tls_handshake_failures_total", Kind::kCounter,
             "Peers a shard refused: failed handshakes, or plaintext against TLS.");
  t.describe("cohort_records_dropped_total", Kind::kCounter,
             "Records a shard dropped, by reason: tampered (failed authentication), replayed, "
             "malformed.");
  t.describe("cohort_checkpoint_age_seconds", Kind::kGauge,
             "Seconds since a shard's last checkpoint (since its start when it has written none).");
  t.describe("cohort_checkpoint_failures_total", Kind::kCounter,
             "Checkpoints a shard failed to write.");
  t.describe("cohort_process_resident_memory_bytes", Kind::kGauge,
             "A shard process's resident memory.");
  t.describe("cohort_telemetry_refresh_seconds_total", Kind::kCounter,
             "Time a shard's message loop spent refreshing these figures (the endpoint's cost to "
             "training; requests are served on other threads).");
}

}  // namespace

std::string reason_class(const std::string& reason) {
  auto has = [&](const char* s) { return reason.find(s) != std::string::npos; };
  if (has("after its round closed") || has("stale") || has("late") || has("takes no more"))
    return "late";
  if (has("non-finite") || has("not finite")) return "non_finite";
  if (has("misaligned") || has("past the end") || has("longer than") || has("shorter than") ||
      has("bad shape") || has("chunk at byte") || has("length") || has("zero samples"))
    return "malformed";
  if (has("second") || has("different update") || has("duplicate")) return "duplicate";
  if (has("not opened") || has("another round")) return "wrong_round";
  if (has("not selected") || has("not a member") || has("not in")) return "not_selected";
  if (has("deadline") || has("timed out")) return "deadline";
  if (has("could not aggregate") || has("needs at least")) return "too_few_updates";
  if (has("unmask") || has("masked") || has("secure aggregation") || has("SecAgg"))
    return "secure_aggregation";
  if (has("shard")) return "shard";
  return "other";
}

ServerTelemetry::ServerTelemetry(const ServerOptions& options, std::uint32_t shard)
    : shard_(label("shard", std::to_string(shard))), index_(shard) {
  describe(t_);
  t_.set_status("source", options.http.source);
  t_.set_status("mode", mode_name(options.modes.mode));
  t_.set_status("model", options.model.spec);
  t_.set_status("rounds_planned", options.round.rounds);
  t_.set_status("rounds_committed", 0);
  t_.set_status("rounds_failed", 0);
  t_.set_status("state", "waiting");
  t_.set_status("latest", nlohmann::json::object());
  t_.set_status("clients", nlohmann::json::array());
  t_.set_status("refusals", nlohmann::json::object());
  t_.set_status("shards", nlohmann::json::array());
  t_.set("cohort_rounds_committed_total", "", 0);
}

void ServerTelemetry::watch(MetricsSink& sink) {
  sink.observe([this](std::string_view event, const std::vector<MetricField>& fields) {
    on_record(event, fields);
  });
}

void ServerTelemetry::on_record(std::string_view event, const std::vector<MetricField>& f) {
  if (event == "round") {
    on_round(f);
  } else if (event == "round_failed") {
    const auto* why = find_field(f, "reason");
    const std::string reason =
        why && std::holds_alternative<std::string>(*why) ? std::get<std::string>(*why) : "";
    t_.add("cohort_rounds_failed_total", label("reason", reason_class(reason)), 1);
    std::lock_guard lock(mu_);
    t_.set_status("rounds_failed", ++rounds_failed_);
  } else if (event == "client") {
    on_client(f);
  }
}

void ServerTelemetry::on_round(const std::vector<MetricField>& f) {
  auto get = [&](std::string_view k) -> std::optional<double> {
    const auto* v = find_field(f, k);
    return v ? numeric(*v) : std::nullopt;
  };
  const double round = get("round").value_or(0);
  t_.set("cohort_rounds_committed_total", "", round);
  if (auto s = get("round_seconds")) t_.observe("cohort_round_duration_seconds", *s);
  if (auto s = get("train_seconds")) t_.set("cohort_round_train_seconds", "", *s);
  if (auto s = get("comm_seconds")) t_.set("cohort_round_comm_seconds", "", *s);
  std::lock_guard lock(mu_);
  nlohmann::json& latest = latest_;
  latest["round"] = static_cast<std::uint64_t>(round);
  if (auto v = get("train_loss")) {
    t_.set("cohort_train_loss", "", *v);
    latest["train_loss"] = *v;
  }
  if (auto v = get("test_loss")) {
    t_.set("cohort_test_loss", "", *v);
    latest["test_loss"] = *v;
  }
  if (auto v = get("test_accuracy")) {
    t_.set("cohort_test_accuracy", "", *v);
    latest["test_accuracy"] = *v;
  }
  if (auto v = get("dp_epsilon")) t_.set("cohort_dp_epsilon", "", *v);
  t_.set_status("latest", latest);
  t_.set_status("rounds_committed", static_cast<std::uint64_t>(round));
  t_.add_round(to_json(f));
}

void ServerTelemetry::on_client(const std::vector<MetricField>& f) {
  const auto* name = find_field(f, "client");
  if (!name || !std::holds_alternative<std::string>(*name)) return;
  auto num = [&](std::string_view k) {
    const auto* v = find_field(f, k);
    return v ? number(*v) : 0.0;
  };
  std::lock_guard lock(mu_);
  ClientRow& row = clients_[std::get<std::string>(*name)];
  row.last_round = static_cast<std::uint64_t>(num("round_id"));
  row.rounds = static_cast<std::uint64_t>(num("participations"));
  row.samples_per_second = num("measured_samples_per_s");
  row.throughput = num("up_bytes_per_s_0");
  row.assigned_steps = static_cast<std::uint64_t>(num("assigned_steps"));
  row.micro_batch = static_cast<std::uint64_t>(num("micro_batch"));
}

void ServerTelemetry::add_refresh_time(double seconds) {
  t_.add("cohort_telemetry_refresh_seconds_total", shard_, seconds);
}

void ServerTelemetry::refresh(const transport::EndpointStats& ep, const ShardStats& s) {
  const auto now = std::chrono::steady_clock::now();
  t_.set("cohort_received_bytes_total", shard_, static_cast<double>(ep.bytes_received));
  t_.set("cohort_sent_bytes_total", shard_, static_cast<double>(ep.bytes_sent));
  const double dt = std::chrono::duration<double>(now - last_refresh_).count();
  if (dt > 0 && last_refresh_.time_since_epoch().count() != 0) {
    t_.set("cohort_push_throughput_bytes_per_second", shard_,
           static_cast<double>(s.push_bytes - last_push_) / dt);
    t_.set("cohort_pull_throughput_bytes_per_second", shard_,
           static_cast<double>(s.pull_bytes - last_pull_) / dt);
  }
  last_refresh_ = now;
  last_push_ = s.push_bytes;
  last_pull_ = s.pull_bytes;
  t_.set("cohort_push_bytes_total", shard_, static_cast<double>(s.push_bytes));
  t_.set("cohort_pull_bytes_total", shard_, static_cast<double>(s.pull_bytes));
  t_.set("cohort_tls_handshakes_total", shard_, static_cast<double>(ep.handshakes));
  t_.set("cohort_tls_handshake_failures_total", shard_, static_cast<double>(ep.refused_peers));
  const std::string id = std::to_string(index_);
  t_.set("cohort_records_dropped_total", observe::labels("shard", id, "reason", "tampered"),
         static_cast<double>(ep.dropped_auth));
  t_.set("cohort_records_dropped_total", observe::labels("shard", id, "reason", "replayed"),
         static_cast<double>(ep.dropped_replay));
  t_.set("cohort_records_dropped_total", observe::labels("shard", id, "reason", "malformed"),
         static_cast<double>(ep.dropped_malformed));
  const auto since = s.last_checkpoint.value_or(start_);
  t_.set("cohort_checkpoint_age_seconds", shard_,
         std::chrono::duration<double>(now - since).count());
  t_.set("cohort_checkpoint_failures_total", shard_, static_cast<double>(s.checkpoint_failures));
  const double rss = resident_bytes();
  t_.set("cohort_process_resident_memory_bytes", shard_, rss);
  t_.set("cohort_updates_accepted_total", shard_, static_cast<double>(s.accepted));
  for (const auto& [why, n] : s.refused) {
    t_.set("cohort_updates_refused_total", observe::labels("shard", id, "reason", why),
           static_cast<double>(n));
  }
  nlohmann::json row{
      {"shard", index_},
      {"received_bytes", ep.bytes_received},
      {"sent_bytes", ep.bytes_sent},
      {"push_bytes", s.push_bytes},
      {"pull_bytes", s.pull_bytes},
      {"resident_memory_bytes", rss},
      {"tls_handshakes", ep.handshakes},
      {"records_dropped", ep.dropped_auth + ep.dropped_replay + ep.dropped_malformed}};
  std::lock_guard lock(mu_);
  shard_rows_[index_] = std::move(row);
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& [i, r] : shard_rows_) shards.push_back(r);
  t_.set_status("shards", std::move(shards));
  for (const auto& [why, n] : s.refused) refusals_[why] = static_cast<double>(n);
  t_.set_status("uptime_seconds", std::chrono::duration<double>(now - start_).count());
}

void ServerTelemetry::refresh(const CoordinatorSnapshot& c) {
  t_.set_status("state", c.state);
  t_.set("cohort_clients", label("state", "registered"), static_cast<double>(c.registered));
  t_.set("cohort_clients", label("state", "selected"), static_cast<double>(c.selected));
  t_.set("cohort_clients", label("state", "reporting"), static_cast<double>(c.reporting));
  t_.set("cohort_clients", label("state", "unreachable"), static_cast<double>(c.unreachable));
  nlohmann::json rows = nlohmann::json::array();
  std::lock_guard lock(mu_);
  for (const auto& client : c.clients) {
    nlohmann::json r{{"name", client.name}, {"state", client.state}};
    if (auto it = clients_.find(client.name); it != clients_.end()) {
      const ClientRow& row = it->second;
      r["last_round"] = row.last_round;
      r["rounds"] = row.rounds;
      r["samples_per_second"] = row.samples_per_second;
      r["throughput_bytes_per_second"] = row.throughput;
      if (row.assigned_steps > 0) {
        r["assigned"] = {{"local_steps", row.assigned_steps}, {"batch_size", row.micro_batch}};
      }
    }
    rows.push_back(std::move(r));
  }
  t_.set_status("clients", std::move(rows));
  nlohmann::json refusals = nlohmann::json::object();
  for (const auto& [why, n] : refusals_) refusals[why] = n;
  t_.set_status("refusals", std::move(refusals));
}

std::vector<std::byte> ServerTelemetry::encode_samples() const {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : t_.samples()) j.push_back({s.name, s.labels, s.value});
  nlohmann::json msg{{"samples", std::move(j)}};
  {
    // The shard's row of the status's shard table travels too.
    std::lock_guard lock(mu_);
    if (auto it = shard_rows_.find(index_); it != shard_rows_.end()) msg["row"] = it->second;
  }
  const std::string text = msg.dump();
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return {p, p + text.size()};
}

void ServerTelemetry::on_remote(std::uint32_t shard, std::span<const std::byte> payload) {
  constexpr std::size_t kMax = 1 << 20;
  if (payload.size() > kMax) throw ProtocolError("telemetry payload over 1 MiB");
  const auto* p = reinterpret_cast<const char*>(payload.data());
  const auto j = nlohmann::json::parse(p, p + payload.size(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("samples") || !j["samples"].is_array()) {
    throw ProtocolError("malformed telemetry payload");
  }
  std::vector<observe::Sample> samples;
  const std::string own = label("shard", std::to_string(shard));
  for (const auto& s : j["samples"]) {
    if (!s.is_array() || s.size() != 3 || !s[0].is_string() || !s[1].is_string() ||
        !s[2].is_number()) {
      throw ProtocolError("malformed telemetry sample");
    }
    auto labels = s[1].get<std::string>();
    // A shard speaks for itself only: its samples must carry its own shard label first.
    if (labels.rfind(own, 0) != 0) continue;
    samples.push_back({s[0].get<std::string>(), std::move(labels), s[2].get<double>()});
  }
  t_.set_remote(shard, std::move(samples));
  if (j.contains("row") && j["row"].is_object()) {
    nlohmann::json row = j["row"];
    row["shard"] = shard;
    std::lock_guard lock(mu_);
    shard_rows_[shard] = std::move(row);
    nlohmann::json shards = nlohmann::json::array();
    for (const auto& [i, r] : shard_rows_) shards.push_back(r);
    t_.set_status("shards", std::move(shards));
  }
}

std::unique_ptr<observe::HttpServer> start_http(const HttpEndpointOptions& options,
                                                const observe::Telemetry& telemetry) {
  std::unique_ptr<observe::HttpServer> server;
  if (!options.enabled) return server;
  try {
    server = std::make_unique<observe::HttpServer>(options.http, telemetry, observe::embedded_file);
  } catch (const ConfigError& e) {
    if (options.explicitly_set) throw;
    COHORT_LOG(Warn) << "no HTTP endpoint: " << e.what() << " (set server.http to choose another "
                     << "address, or server.http = off)";
    return nullptr;
  }
  COHORT_LOG(Info) << "HTTP endpoint (metrics, dashboard, /api/v1) at " << server->url();
  if (!options.port_file.empty()) {
    const std::string tmp = options.port_file + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) throw ConfigError("cannot write server.http_port_file " + options.port_file);
      out << server->port() << '\n';
    }
    std::rename(tmp.c_str(), options.port_file.c_str());
  }
  return server;
}

}  // namespace cohort::server
