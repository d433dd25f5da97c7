#include "options.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "cohort/aggregation/server_optimizer.h"
#include "cohort/client/trainer.h"
#include "cohort/core/error.h"
#include "cohort/server/server.h"
#include "cohort/transport/config.h"

#include "server_options.h"

namespace cohort::server {
namespace {

// The modes that honour each mode-specific key; setting one in another mode is an error, never
// silently ignored. Keys not listed apply to every mode.
struct ModeKeys {
  std::string_view key;  // a key, or a free section's prefix ending in '.'
  std::initializer_list<std::string_view> modes;
};
constexpr std::string_view kFederated = "federated", kFedBuff = "fedbuff",
                           kDataParallel = "dataparallel", kDecentralized = "decentralized";
const ModeKeys kModeKeys[] = {
    {"server.rounds", {kFederated, kFedBuff}},
    {"server.clients_per_round", {kFederated, kDataParallel}},
    {"server.overselect", {kFederated}},
    {"server.selection", {kFederated}},
    {"server.min_updates", {kFederated}},
    {"server.normalization", {kFederated}},
    {"server.secure_aggregation", {kFederated}},
    {"secagg.stage_ms", {kFederated}},
    {"secagg.clip", {kFederated}},
    {"secagg.levels", {kFederated}},
    {"secagg.threshold", {kFederated}},
    {"secagg.degree", {kFederated}},
    {"server.work", {kFederated}},
    {"server.min_local_steps", {kFederated}},
    {"server.max_local_steps", {kFederated}},
    {"server.deadline_margin", {kFederated}},
    {"server.max_failed_rounds", {kFederated, kFedBuff}},
    {"server.consistency", {kDataParallel}},
    {"server.staleness", {kDataParallel}},
    {"server.steps", {kDataParallel}},
    {"server.batch_policy", {kDataParallel}},
    {"server.max_worker_batch", {kDataParallel}},
    {"server.rebalance_every", {kDataParallel}},
    {"server.buffer_size", {kFedBuff}},
    {"server.max_staleness", {kFedBuff}},
    {"server.concurrency", {kFedBuff}},
    // Local training rules train federated rounds; data-parallel workers compute gradients.
    {"train.rule", {kFederated, kFedBuff}},
    {"server.eval_every", {kFederated, kFedBuff, kDataParallel}},
    {"server.round_deadline_ms", {kFederated, kFedBuff, kDataParallel}},
    {"server.min_clients", {kFederated, kFedBuff, kDataParallel}},
    {"server.shards", {kFederated, kFedBuff, kDataParallel}},
    {"server.checkpoint_dir", {kFederated, kFedBuff, kDataParallel}},
    {"server.checkpoint_every", {kFederated, kFedBuff, kDataParallel}},
    {"dp.clip", {kFederated}},
    {"dp.noise_multiplier", {kFederated}},
    {"dp.delta", {kFederated}},
    {"dp.seed", {kFederated}},
    {"aggregator.", {kFederated}},
    {"server_optimizer.", {kFederated, kFedBuff, kDataParallel}},
    {"train.", {kFederated, kFedBuff, kDataParallel}},
    {"decentralized.", {kDecentralized}},
};

// server.work and the keys that size deadline work (federated mode only; the mode check is done).
void validate_work(const Config& config) {
  const std::string work = config.get_string("server.work");
  if (work != "fixed" && work != "deadline") {
    throw ConfigError("server.work must be fixed or deadline, got '" + work + "'");
  }
  if (work == "fixed") {
    for (const char* key :
         {"server.min_local_steps", "server.max_local_steps", "server.deadline_margin"}) {
      if (config.is_set(key)) {
        throw ConfigError(std::string(key) +
                          " applies to server.work = deadline only (server.work = fixed runs "
                          "train.epochs / train.steps on every client)");
      }
    }
    return;
  }
  constexpr std::int64_t kMaxSteps = 1'000'000'000;
  const std::int64_t lo = config.get_int("server.min_local_steps");
  const std::int64_t hi = config.get_int("server.max_local_steps");
  if (lo < 1 || lo > kMaxSteps) {
    throw ConfigError("server.min_local_steps must be from 1 to 1000000000, got " +
                      std::to_string(lo));
  }
  if (hi < 0 || hi > kMaxSteps) {
    throw ConfigError("server.max_local_steps must be from 0 (derived) to 1000000000, got " +
                      std::to_string(hi));
  }
  if (hi > 0 && hi < lo) {
    throw ConfigError("server.max_local_steps = " + std::to_string(hi) +
                      " is below server.min_local_steps = " + std::to_string(lo));
  }
  const double margin = config.get_double("server.deadline_margin");
  if (!(margin >= 0 && margin < 1)) {
    throw ConfigError("server.deadline_margin must be a fraction in [0, 1), got " +
                      std::to_string(margin));
  }
}

std::string join(std::initializer_list<std::string_view> items) {
  std::string out;
  for (auto item : items) out += (out.empty() ? "" : ", ") + std::string(item);
  return out;
}

// The formula behind a built-in robust rule's minimum, for the error that names it.
std::string minimum_formula(const std::string& rule) {
  if (rule == "krum" || rule == "multi_krum") return "2f+3";
  if (rule == "bulyan") return "4f+3";
  return "";
}

// server.secure_aggregation and [secagg] (federated mode only; the mode check is done).
void validate_secure_aggregation(const Config& config, const std::string& rule) {
  const SecAggOptions o = parse_secure_aggregation(config);
  if (o.kind == SecAggKind::kNone) {
    for (const char* key :
         {"secagg.stage_ms", "secagg.clip", "secagg.levels", "secagg.threshold", "secagg.degree"}) {
      if (config.is_set(key)) {
        throw ConfigError(std::string(key) +
                          " applies with server.secure_aggregation = secagg or secagg+ only");
      }
    }
    return;
  }
  const std::string what = "server.secure_aggregation = " +
                           std::string(o.kind == SecAggKind::kSecAgg ? "secagg" : "secagg+");
  // The shards see only the sum of the masked inputs: a rule that looks at each update (a
  // median, Krum, a norm clip) or reweighs it per client cannot run on it.
  if (rule != "fedavg") {
    throw ConfigError(what +
                      " needs aggregator.name = fedavg (the shards see only the sum of the "
                      "cohort's updates, not each one), got '" +
                      rule + "'");
  }
  if (parse_normalization(config) != Normalization::kNone) {
    throw ConfigError(what +
                      " does not combine with server.normalization = fednova (the shards "
                      "cannot divide each update by its local work)");
  }
  const std::int64_t cohort = config.get_int("server.clients_per_round");
  const double over = std::max(1.0, config.get_double("server.overselect"));
  const auto selected = static_cast<std::uint64_t>(std::ceil(static_cast<double>(cohort) * over));
  const std::uint64_t most =
      (std::uint64_t{1} << 32) / o.levels - (((std::uint64_t{1} << 32) % o.levels) == 0 ? 1 : 0);
  if (selected > most) {
    throw ConfigError(what + ": " + std::to_string(selected) +
                      " clients per round (server.clients_per_round x server.overselect) would "
                      "overflow the 32-bit sum at secagg.levels = " +
                      std::to_string(o.levels) + " (at most " + std::to_string(most) +
                      " inputs): lower secagg.levels");
  }
  if (cohort < 2) throw ConfigError(what + " needs server.clients_per_round >= 2");
}

// server.batch_policy and the keys only `speed` reads (docs/ALGORITHMS.md 3.4).
void validate_batch_policy(const Config& config) {
  const BatchPolicy policy = parse_batch_policy(config);
  const std::string consistency = config.get_string("server.consistency");
  if (policy == BatchPolicy::kSpeed && consistency != "bsp") {
    throw ConfigError(
        "server.batch_policy = speed needs server.consistency = bsp (ASP and SSP keep equal "
        "batches: their pace is not set by the slowest worker), got '" +
        consistency + "'");
  }
  for (const char* key : {"server.max_worker_batch", "server.rebalance_every"}) {
    if (policy != BatchPolicy::kSpeed && config.is_set(key)) {
      throw ConfigError(std::string(key) + " applies to server.batch_policy = speed only");
    }
  }
  if (config.get_int("server.rebalance_every") < 1) {
    throw ConfigError("server.rebalance_every must be >= 1, got " +
                      std::to_string(config.get_int("server.rebalance_every")));
  }
  const std::int64_t cap = config.get_int("server.max_worker_batch");
  const std::int64_t batch = config.section("train").get_int("batch_size", 64);
  if (cap < 0 || (cap > 0 && cap < batch)) {
    throw ConfigError("server.max_worker_batch must be 0 (no cap) or at least train.batch_size = " +
                      std::to_string(batch) +
                      " (the workers must be able to take the global batch), got " +
                      std::to_string(cap));
  }
  const std::int64_t workers = config.get_int("server.clients_per_round");
  if (policy == BatchPolicy::kSpeed && workers > 0 && batch > 0 &&
      batch > std::int64_t{std::numeric_limits<std::uint32_t>::max()} / workers) {
    throw ConfigError(
        "server.batch_policy = speed: the global batch train.batch_size x "
        "server.clients_per_round must fit in 32 bits (PullReply.batchSize)");
  }
}

}  // namespace

void validate(const Config& config, const Registries& registries) {
  const std::string mode = config.get_string("server.mode");
  if (mode != kFederated && mode != kFedBuff && mode != kDataParallel && mode != kDecentralized) {
    throw ConfigError(
        "server.mode must be federated, fedbuff, dataparallel or decentralized, got '" + mode +
        "'");
  }
  for (const auto& [key, modes] : kModeKeys) {
    if (std::find(modes.begin(), modes.end(), mode) != modes.end()) continue;
    const bool section = key.ends_with('.');
    const std::string name(section ? key.substr(0, key.size() - 1) : key);
    const bool set = section ? !config.section(name).names().empty() : config.is_set(name);
    if (set) {
      throw ConfigError(std::string(section ? "[" + name + "] options apply" : name + " applies") +
                        " to server.mode = " + join(modes) + " only, not " + mode);
    }
  }
  // tls.* and transport.* (transport.aead = ipsec-mb where it cannot run, too), in every mode.
  auto endpoint = shard_endpoint_options(config, config.get_string("server.name"));
  set_listener_receive_queue(config, endpoint);
  if (mode == kDecentralized) return;  // run_rendezvous() checks its own section
  const std::string selection = config.get_string("server.selection");
  if (selection != "uniform" && selection != "weighted" && selection != "speed_aware") {
    throw ConfigError("server.selection must be uniform, weighted or speed_aware, got '" +
                      selection + "'");
  }
  if (selection != "uniform" && config.get_double("dp.noise_multiplier") > 0) {
    throw ConfigError("server.selection = " + selection +
                      " does not sample clients uniformly, which the privacy accountant of "
                      "dp.noise_multiplier assumes (q = m / N): use server.selection = uniform");
  }
  // Clients read [train] after joining: check it here, where a mistake costs nothing.
  const auto train = config.section("train");
  for (const char* key : {"device", "threads"}) {
    if (train.has(key)) {
      throw ConfigError(
          std::string("train.") + key + " is not a server option: each client picks its " +
          (std::string(key) == "device" ? "device with cohort-client --device (client.device)"
                                        : "threads with client.threads"));
    }
  }
  try {
    (void)client::trainer_options_from(train);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("[train] (sent to every client): ") + e.what());
  }
  (void)registries.server_optimizers.create(
      config.section("server_optimizer").get_string("name", "sgd"), optimizer_options(config));
  const auto rule_options = config.section("aggregator");
  const std::string rule = rule_options.get_string("name", "fedavg");
  const auto aggregator = registries.aggregators.create(rule, rule_options);
  if (mode == kDataParallel) validate_batch_policy(config);
  if (mode != kFederated) return;
  // FedNova reweighs a sample-weighted mean (weights n_i / a_i, then a rescale); a rule that is
  // not such a mean (median, Krum, ...; norm_clip clips each update before its mean, so its
  // bound would be on Delta_i, not on the normalised update) would ignore or distort it.
  if (parse_normalization(config) == Normalization::kFedNova && rule != "fedavg") {
    throw ConfigError(
        "server.normalization = fednova needs aggregator.name = fedavg (the only weighted mean of "
        "the updates), got '" +
        rule + "'");
  }
  validate_work(config);
  validate_secure_aggregation(config, rule);
  const auto cohort = static_cast<std::size_t>(
      std::max<std::int64_t>(0, config.get_int("server.clients_per_round")));
  if (cohort < 1) throw ConfigError("server.clients_per_round must be >= 1");
  const std::int64_t min_updates = config.get_int("server.min_updates");
  if (min_updates > static_cast<std::int64_t>(cohort)) {
    throw ConfigError("server.min_updates = " + std::to_string(min_updates) +
                      " can never be reached: a round closes at server.clients_per_round = " +
                      std::to_string(cohort) + " complete updates");
  }
  if (const std::size_t need = aggregator->min_updates(); need > cohort) {
    const std::string formula = minimum_formula(rule);
    throw ConfigError(
        "aggregator '" + rule + "'" +
        (rule_options.has("f") ? " with f = " + std::to_string(rule_options.get_int("f", 0)) : "") +
        " needs at least " + (formula.empty() ? "" : formula + " = ") + std::to_string(need) +
        " complete updates per round, but a round closes at server.clients_per_round = " +
        std::to_string(cohort) + ": raise server.clients_per_round to " + std::to_string(need) +
        (formula.empty() ? "" : " or lower aggregator.f"));
  }
}

transport::EndpointOptions shard_endpoint_options(const Config& config, const std::string& name) {
  return transport::endpoint_options_from(config, name);
}

void set_listener_receive_queue(const Config& config, transport::EndpointOptions& options) {
  set_listener_receive_queue(config.get_int("transport.receive_queue"), options);
}

void set_listener_receive_queue(std::int64_t queue, transport::EndpointOptions& options) {
  // One queued chunk per client: memory stays O(model) + O(clients), and TCP pushes back. In
  // plaintext the shard works on the frame ZeroMQ received, still hot in cache; under TLS the
  // endpoint reads one record ahead of the one it decrypts, so ZeroMQ keeps reading the socket
  // meanwhile (docs/PERFORMANCE.md 3.4). The queue is fixed at bind (EndpointOptions).
  if (queue < 0 || queue > 65536) {
    throw ConfigError("transport.receive_queue must be from 0 (automatic) to 65536, got " +
                      std::to_string(queue));
  }
  options.receive_queue = queue > 0 ? static_cast<int>(queue) : 1;
}

// [server_optimizer] as the shard's optimizer reads it: in data-parallel mode it steps on
// gradients, summed over the workers under BSP, so a built-in optimizer without server_optimizer.lr
// takes its gradient rate (aggregation::default_server_lr), not the rate it applies deltas with.
ConfigSection optimizer_options(const Config& config) {
  const auto section = config.section("server_optimizer");
  if (config.get_string("server.mode") != "dataparallel" || section.has("lr")) return section;
  const auto lr = aggregation::default_server_lr(section.get_string("name", "sgd"),
                                                 aggregation::ServerInput::kGradient);
  return lr ? section.with("lr", *lr) : section;
}

// Client-level DP (dp.*) and secure aggregation (server.secure_aggregation, [secagg]):
// docs/ALGORITHMS.md 8.3 and 8.5.
void add_privacy_keys(ConfigSchema& s) {
  s.add("server.secure_aggregation", std::string("none"),
        "federated: none | secagg | secagg+. Secure aggregation (ALGORITHMS.md 8.1, 8.2): each "
        "client masks its fixed-point update with pairwise masks whose seeds it shares (Shamir, "
        "t of n) with the others (secagg) or with k = O(log n) neighbours (secagg+), so the "
        "shards learn only the cohort's sum; up to n - t dropouts are recovered. Needs "
        "aggregator.name = fedavg and no compressor on the clients")
      .add("secagg.stage_ms", std::int64_t{30000},
           "secure aggregation: how long the coordinator waits for each key stage (keys, shares, "
           "unmasking); who has not answered by then has dropped")
      .add("secagg.clip", 8.0,
           "secure aggregation: the fixed-point range c; each client clips its weighted update "
           "n_k/N x Delta_k to [-c, c] per coordinate before quantising")
      .add("secagg.levels", std::int64_t{1} << 22,
           "secure aggregation: the fixed-point levels Q (step 2c/Q); n Q < 2^32 bounds the cohort "
           "(1023 clients at the default)")
      .add("secagg.threshold", 0.5,
           "secure aggregation: t = floor(threshold x k) + 1 of a client's k share holders "
           "(itself and its neighbours) rebuild its secrets; from 0.5 to 1")
      .add("secagg.degree", std::int64_t{0},
           "secagg+: the neighbourhood size k, odd, counting the client (0: 2 ceil(log2 n) + 1)")
      .add("dp.clip", 0.0,
           "client-level DP (DP-FedAvg): L2 bound S of an update; shards clip each update's range "
           "to S and weigh clients equally (0: off; clients clip with client.dp_clip = S; under "
           "server.secure_aggregation the shards see no update, and client.dp_clip is the bound)")
      .add("dp.noise_multiplier", 0.0,
           "client-level DP: z; shards add N(0, (z S / m)^2) to each round's mean of m updates and "
           "shard 0 reports epsilon (RDP, Poisson sampling at q = cohort / clients) (0: no noise)")
      .add("dp.delta", 1e-5, "client-level DP: the delta of the reported (epsilon, delta)")
      .add(
          "dp.seed", std::int64_t{0},
          "seed of the DP noise (0: random; a fixed seed makes the noise predictable: tests only)");
}

// server.http*: the read-only HTTP endpoint (observe/).
void add_http_keys(ConfigSchema& s) {
  s.add("server.http", std::string(""),
        "read-only HTTP endpoint host:port: the dashboard at /, Prometheus text at /metrics, "
        "the JSON API at /api/v1/ (docs/HTTP_API.md). Empty: 127.0.0.1:9100 on shard 0 (if "
        "that port is free) and none on the other shards; off: none. A non-loopback address "
        "serves HTTPS with tls.cert_file and tls.key_file (refused with tls.insecure); port 0 "
        "picks a free port")
      .add("server.http_port_file", std::string(""),
           "write the HTTP endpoint's bound port to this file")
      .add("server.http_linger_ms", std::int64_t{0},
           "keep serving the HTTP endpoint this long after training finishes (a last scrape)");
}

ConfigSchema config_schema() {
  const Registries builtins = builtin_registries();
  ConfigSchema s;
  s.add("server.shard", std::int64_t{0}, "this shard's index (0 also coordinates)")
      .add("server.shards", std::int64_t{1}, "number of shards")
      .add("server.listen", std::string("tcp://127.0.0.1:7000"),
           "url to bind (tcp://HOST:* picks a port)")
      .add("server.coordinator", std::string(""), "shards > 0: url of shard 0")
      .add("server.advertise", std::string(""),
           "url clients use to reach this shard (default: the bound url)")
      .add("server.name", std::string(""),
           "node id (default shard-<index>); must be the certificate CN")
      .add("server.port_file", std::string(""), "write the bound port to this file")
      .add("server.mode", std::string("federated"),
           "federated | fedbuff | dataparallel | decentralized (rendezvous only)")
      .add("server.rounds", std::int64_t{20}, "federated rounds to run (fedbuff: server steps)")
      .add("server.consistency", std::string("bsp"), "dataparallel: bsp | asp | ssp")
      .add("server.staleness", std::int64_t{2},
           "dataparallel ssp: how many clocks a worker may run ahead")
      .add("server.steps", std::int64_t{100}, "dataparallel: steps each worker takes")
      .add("server.batch_policy", std::string("equal"),
           "dataparallel: equal | speed. equal: every worker takes train.batch_size. speed (bsp "
           "only): the global batch B = train.batch_size x workers is split in proportion to "
           "each worker's speed as shard 0 measures it, so the workers finish a step together; "
           "each pushes the sum of its per-sample gradients and the step is the one on the "
           "whole B (ALGORITHMS.md 3.4)")
      .add("server.max_worker_batch", std::int64_t{0},
           "dataparallel, batch_policy = speed: the largest batch any worker is given (its "
           "memory budget); the excess goes to the others (0: no cap)")
      .add("server.rebalance_every", std::int64_t{50},
           "dataparallel, batch_policy = speed: re-split the global batch every K steps (and "
           "once every worker has a measured step)")
      .add("server.buffer_size", std::int64_t{10}, "fedbuff: K, updates per server step")
      .add("server.max_staleness", std::int64_t{-1},
           "fedbuff: refuse updates staler than this (-1: no bound)")
      .add("server.concurrency", std::int64_t{10}, "fedbuff: clients training at once")
      .add("server.clients_per_round", std::int64_t{10}, "K: complete updates that close a round")
      .add("server.overselect", 1.0, "select ceil(K * overselect) clients to absorb stragglers")
      .add("server.min_clients", std::int64_t{1}, "registered clients needed before a round starts")
      .add("server.min_updates", std::int64_t{1},
           "complete updates needed to commit a round at its deadline")
      .add("server.max_failed_rounds", std::int64_t{10},
           "rounds in a row without server.min_updates complete updates before the coordinator "
           "stops with an error (0: retry for ever)")
      .add("server.selection", std::string("uniform"),
           "federated: uniform | weighted (by data size) | speed_aware (draw weights grow with a "
           "client's wait; draws stop once expected completions reach K, at most ceil(K x "
           "server.overselect); ALGORITHMS.md 1.7)")
      .add("server.normalization", std::string("none"),
           "federated: none | fednova. fednova: FedNova's normalised averaging (ALGORITHMS.md "
           "1.7) for unequal local work: the server steps with tau_eff * sum_i p_i Delta_i / a_i, "
           "tau_eff = sum_i p_i a_i, p_i = n_i / sum_j n_j, a_i the local work each client sends "
           "with its push (a push without a_i > 0 is refused); needs aggregator.name = fedavg; "
           "with dp.clip each Delta_i / a_i is clipped and p_i = 1/m")
      .add("server.round_deadline_ms", std::int64_t{60000}, "a round closes at this deadline")
      .add("server.work", std::string("deadline"),
           "federated: deadline (each client gets the steps its measured speed and links fit "
           "into the round: the slowest selected client's time for the fixed work, at most (1 - "
           "server.deadline_margin) x server.round_deadline_ms; ALGORITHMS.md 1.7) | fixed "
           "(every client runs train.epochs / train.steps)")
      .add("server.min_local_steps", std::int64_t{1},
           "server.work = deadline: fewest local steps asked of a client, and what every client "
           "gets before any has been measured (the first round)")
      .add("server.max_local_steps", std::int64_t{0},
           "server.work = deadline: most local steps asked of a client (0: four times the work "
           "server.work = fixed gives it: train.steps, else train.epochs x ceil(its samples / "
           "train.batch_size))")
      .add("server.deadline_margin", 0.2,
           "server.work = deadline: fraction of server.round_deadline_ms left out of each "
           "client's plan (speed changes since its last report, the report and the close)")
      .add("server.eval_every", std::int64_t{1},
           "evaluate on the test set every R rounds (0: never)")
      .add("server.seed", std::int64_t{1}, "seed of client selection")
      .add("server.heartbeat_ms", std::int64_t{2000}, "client heartbeat interval")
      .add("server.client_timeout_ms", std::int64_t{60000},
           "a silent client leaves the pool after this")
      .add("server.checkpoint_dir", std::string(""), "write checkpoints here (empty: none)")
      .add("server.checkpoint_every", std::int64_t{1}, "checkpoint every R committed rounds")
      .add("server.metrics_file", std::string("metrics.jsonl"), "JSON-lines metrics (shard 0)")
      .add("metrics.tensorboard_dir", std::string(""),
           "folder for TensorBoard event files: each round's metrics (train/loss, test/loss, "
           "test/accuracy, round/seconds, bytes/round, dp/epsilon, ...) as scalars, step = "
           "round; only shard 0 writes them, the other shards ignore the key (empty: none)")
      .add("model.spec", std::string("mlp:784-256-128-10"),
           "model: mlp:W0-...-Wn, cnn:lenet5, cnn:2conv, cnn:cifar")
      .add("model.seed", std::int64_t{1}, "seed of the initial model");
  transport::add_transport_config(s, /*listener=*/true);  // tls.*, transport.*
  s.add_section("decentralized",
                "server.mode = decentralized only, checked at start-up and sent to every peer: "
                "peers = 4, topology = ring, topology_options.* (degree, seed, ...), "
                "algorithm = dpsgd, steps, lr, batch, partition, gossip_timeout_ms, "
                "staleness, the algorithm's own options (momentum, nesterov, mu, "
                "gamma, weight_decay, overlap, seed), compressor and "
                "compressor_options.* (choco only), allreduce = auto | ring | "
                "halving_doubling | recursive_doubling (ring_allreduce only; auto by size "
                "and peers)")
      .add_section("train",
                   "client-side training options sent to clients and checked at start-up: "
                   "epochs, steps, batch_size, drop_last, optimizer, lr, momentum, nesterov, "
                   "weight_decay, beta1, beta2, epsilon, lr_schedule, prox_mu, "
                   "reset_optimizer_state, eval_batch_size (each client picks its own "
                   "device and threads: cohort-client --device, client.threads)")
      .add_section("aggregator",
                   "federated only: the aggregation rule, name = " + builtins.aggregators.names() +
                       " or a plug-in's, and its options (f, beta, ...)")
      .add_section("server_optimizer",
                   "how a shard applies each aggregate (data-parallel: each "
                   "gradient): name = " +
                       builtins.server_optimizers.names() +
                       ", and its options (lr, momentum, beta1, beta2, tau); without lr "
                       "each takes its own default, in data-parallel mode its "
                       "gradient rate");
  add_privacy_keys(s);
  add_http_keys(s);
  return s;
}

}  // namespace cohort::server
