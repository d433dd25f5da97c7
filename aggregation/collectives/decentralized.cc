#include "cohort/aggregation/decentralized.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "cohort/aggregation/allreduce.h"
#include "cohort/core/error.h"

namespace cohort::aggregation {

namespace {

void check_sizes(std::span<float> x, std::span<const float> g) {
  COHORT_CHECK(x.size() == g.size())
      << "gradient of " << g.size() << " for a model of " << x.size();
}

// g + lambda x into out.
void regularized(std::span<const float> g, std::span<const float> x, float lambda,
                 std::vector<float>& out) {
  out.resize(g.size());
  for (std::size_t k = 0; k < g.size(); ++k) out[k] = g[k] + lambda * x[k];
}

class Dpsgd final : public DecentralizedOptimizer {
 public:
  Dpsgd(float wd, bool overlap) : wd_(wd), overlap_(overlap) {}
  std::string_view name() const override { return "dpsgd"; }
  void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    regularized(grad, x, wd_, g_);
    half_.resize(x.size());
    if (overlap_) {  // (5.1) x <- W x - lr g
      gossip.mix(t, x, half_);
      for (std::size_t k = 0; k < x.size(); ++k) x[k] = half_[k] - lr * g_[k];
    } else {  // (5.2) x <- W (x - lr g)
      for (std::size_t k = 0; k < x.size(); ++k) half_[k] = x[k] - lr * g_[k];
      gossip.mix(t, half_, x);
    }
  }

 private:
  float wd_;
  bool overlap_;
  std::vector<float> g_, half_;
};

class Dsgdm final : public DecentralizedOptimizer {
 public:
  Dsgdm(float beta, float wd, bool nesterov) : beta_(beta), wd_(wd), nesterov_(nesterov) {}
  std::string_view name() const override { return nesterov_ ? "dsgdm_n" : "dsgdm"; }
  void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    regularized(grad, x, wd_, g_);  // (6.1)
    m_.resize(x.size(), 0.0f);
    half_.resize(x.size());
    for (std::size_t k = 0; k < x.size(); ++k) {
      m_[k] = beta_ * m_[k] + g_[k];                              // (6.2)
      const float u = nesterov_ ? g_[k] + beta_ * m_[k] : m_[k];  // (6.3)
      half_[k] = x[k] - lr * u;                                   // (6.4)
    }
    gossip.mix(t, half_, x);  // (6.5)
  }

 private:
  float beta_, wd_;
  bool nesterov_;
  std::vector<float> g_, m_, half_;
};

class QgDsgdm final : public DecentralizedOptimizer {
 public:
  QgDsgdm(float beta, float mu, float wd, bool nesterov)
      : beta_(beta), mu_(mu), wd_(wd), nesterov_(nesterov) {}
  std::string_view name() const override { return nesterov_ ? "qg_dsgdm_n" : "qg_dsgdm"; }
  void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    COHORT_CHECK(lr > 0) << "QG-DSGDm divides by the learning rate";
    regularized(grad, x, wd_, g_);  // (6.6)
    const std::size_t d = x.size();
    mhat_.resize(d, 0.0f);
    half_.resize(d);
    prev_.assign(x.begin(), x.end());
    for (std::size_t k = 0; k < d; ++k) {
      const float m = beta_ * mhat_[k] + g_[k];           // (6.7), mhat not overwritten
      const float u = nesterov_ ? g_[k] + beta_ * m : m;  // (6.8)
      half_[k] = x[k] - lr * u;                           // (6.9)
    }
    gossip.mix(t, half_, x);  // (6.10)
    const float inv = 1.0f / lr;
    for (std::size_t k = 0; k < d; ++k) {
      const float disp = (prev_[k] - x[k]) * inv;    // (6.11)
      mhat_[k] = mu_ * mhat_[k] + (1 - mu_) * disp;  // (6.12)
    }
  }

 private:
  float beta_, mu_, wd_;
  bool nesterov_;
  std::vector<float> g_, mhat_, half_, prev_;
};

class Choco final : public DecentralizedOptimizer {
 public:
  Choco(std::shared_ptr<const Compressor> q, float gamma, float beta, bool nesterov, float wd,
        std::uint64_t seed)
      : q_(std::move(q)), gamma_(gamma), beta_(beta), nesterov_(nesterov), wd_(wd), seed_(seed) {}
  std::string_view name() const override { return "choco"; }
  void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    const std::size_t d = x.size();
    if (xhat_.empty()) {
      xhat_.assign(d, 0.0f);
      s_.assign(d, 0.0f);
      m_.assign(d, 0.0f);
      state_ = q_->make_state(d);
    }
    regularized(grad, x, wd_, g_);
    for (std::size_t k = 0; k < d; ++k) {  // (7.20)
      float u = g_[k];
      if (beta_ > 0) {
        m_[k] = beta_ * m_[k] + g_[k];
        u = nesterov_ ? g_[k] + beta_ * m_[k] : m_[k];
      }
      x[k] -= lr * u;
    }
    for (std::size_t k = 0; k < d; ++k) x[k] += gamma_ * (s_[k] - xhat_[k]);  // (7.21)
    diff_.resize(d);
    for (std::size_t k = 0; k < d; ++k) diff_[k] = x[k] - xhat_[k];
    q_->encode(diff_, state_.get(), compression_seed(seed_, t, gossip.rank()), wire_);  // (7.22)
    double self = 0;
    auto got = gossip.exchange(t, std::span<const std::byte>(wire_), &self);
    q_->decode(wire_, diff_);  // our own q_i, exactly as the neighbours decode it
    const float ws = static_cast<float>(self);
    for (std::size_t k = 0; k < d; ++k) {  // (7.23), memory-efficient form
      xhat_[k] += diff_[k];
      s_[k] += ws * diff_[k];
    }
    for (auto& r : got) {
      q_->decode(r.bytes.span(), diff_);
      const float w = static_cast<float>(r.weight);
      for (std::size_t k = 0; k < d; ++k) s_[k] += w * diff_[k];
    }
  }

 private:
  std::shared_ptr<const Compressor> q_;
  float gamma_, beta_;
  bool nesterov_;
  float wd_;
  std::uint64_t seed_;
  std::unique_ptr<CompressorState> state_;
  std::vector<float> xhat_, s_, m_, g_, diff_;
  std::vector<std::byte> wire_;
};

class PushSum final : public DecentralizedOptimizer {
 public:
  PushSum(float beta, float wd) : beta_(beta), wd_(wd) {}
  std::string_view name() const override { return "push_sum"; }
  bool needs_symmetric() const override { return false; }
  std::span<const float> eval_point(std::span<const float> x) override {
    z_.resize(x.size());
    const float inv = static_cast<float>(1.0 / w_);
    for (std::size_t k = 0; k < x.size(); ++k) z_[k] = x[k] * inv;
    return z_;
  }
  void step(std::uint64_t t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    const std::size_t d = x.size();
    // Weight decay acts on the de-biased model z, where the gradient was taken.
    (void)eval_point(x);
    regularized(grad, z_, wd_, g_);
    m_.resize(d, 0.0f);
    for (std::size_t k = 0; k < d; ++k) {  // (5.4)
      float u = g_[k];
      if (beta_ > 0) {
        m_[k] = beta_ * m_[k] + g_[k];
        u = m_[k];
      }
      x[k] -= lr * u;
    }
    w_ = gossip.push(t, x, w_);  // (5.5)-(5.6)
  }
  [[nodiscard]] double weight() const { return w_; }

 private:
  float beta_, wd_;
  double w_ = 1.0;
  std::vector<float> z_, g_, m_;
};

// All-reduce SGD: every node averages the gradients exactly (ring AllReduce over the Gossip's
// Comm, no topology), then takes the same momentum step, so the models stay identical. The
// data-parallel baseline the gossip methods approximate; a crashed node stops it (TimeoutError).
class AllreduceSgd final : public DecentralizedOptimizer {
 public:
  AllreduceSgd(float beta, float wd, bool nesterov, AllreduceAlgo algo)
      : beta_(beta), wd_(wd), nesterov_(nesterov), algo_(algo) {}
  std::string_view name() const override { return "ring_allreduce"; }
  bool needs_symmetric() const override { return false; }
  void step(std::uint64_t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    if (!reducer_) {
      AllreduceOptions o;
      o.timeout = std::chrono::milliseconds(60000);
      o.algo = algo_;
      reducer_ = std::make_unique<AllReducer>(gossip.comm(), o);
    }
    g_.assign(grad.begin(), grad.end());
    reducer_->mean(g_);
    m_.resize(x.size(), 0.0f);
    for (std::size_t k = 0; k < x.size(); ++k) {
      const float g = g_[k] + wd_ * x[k];
      m_[k] = beta_ * m_[k] + g;
      x[k] -= lr * (nesterov_ ? g + beta_ * m_[k] : m_[k]);
    }
  }

 private:
  float beta_, wd_;
  bool nesterov_;
  AllreduceAlgo algo_;
  std::unique_ptr<AllReducer> reducer_;
  std::vector<float> g_, m_;
};

float float_option(const ConfigSection& o, std::string_view key, double fallback, double lo,
                   double hi) {
  const double v = o.get_double(key, fallback);
  if (!(v >= lo && v <= hi)) {
    throw ConfigError(o.prefix() + "." + std::string(key) + " must be in [" + std::to_string(lo) +
                      ", " + std::to_string(hi) + "], got " + std::to_string(v));
  }
  return static_cast<float>(v);
}

}  // namespace

void DecentralizedOptimizerRegistry::add(std::string name, DecentralizedOptimizerFactory factory) {
  if (factories_.contains(name)) {
    throw ConfigError("decentralized optimizer '" + name + "' is registered twice");
  }
  factories_.emplace(std::move(name), std::move(factory));
}

std::unique_ptr<DecentralizedOptimizer> DecentralizedOptimizerRegistry::create(
    std::string_view name, const ConfigSection& options,
    std::shared_ptr<const Compressor> compressor) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw ConfigError("unknown decentralized optimizer '" + std::string(name) +
                      "' (known: " + names() + ")");
  }
  return it->second(options, std::move(compressor));
}

bool DecentralizedOptimizerRegistry::contains(std::string_view name) const {
  return factories_.contains(name);
}

std::string DecentralizedOptimizerRegistry::names() const {
  std::string out;
  for (const auto& [name, f] : factories_) out += (out.empty() ? "" : ", ") + name;
  return out;
}

void add_builtin_decentralized_optimizers(DecentralizedOptimizerRegistry& registry) {
  registry.add("dpsgd", [](const ConfigSection& o, std::shared_ptr<const Compressor>) {
    static constexpr std::array<std::string_view, 2> known{"weight_decay", "overlap"};
    o.require_known(known);
    return std::make_unique<Dpsgd>(float_option(o, "weight_decay", 0, 0, 1),
                                   o.get_bool("overlap", false));
  });
  for (bool nesterov : {false, true}) {
    registry.add(nesterov ? "dsgdm_n" : "dsgdm", [nesterov](const ConfigSection& o,
                                                            std::shared_ptr<const Compressor>) {
      static constexpr std::array<std::string_view, 2> known{"momentum", "weight_decay"};
      o.require_known(known);
      return std::make_unique<Dsgdm>(float_option(o, "momentum", 0.9, 0, 1),
                                     float_option(o, "weight_decay", 0, 0, 1), nesterov);
    });
    registry.add(
        nesterov ? "qg_dsgdm_n" : "qg_dsgdm",
        [nesterov](const ConfigSection& o, std::shared_ptr<const Compressor>) {
          static constexpr std::array<std::string_view, 3> known{"momentum", "mu", "weight_decay"};
          o.require_known(known);
          return std::make_unique<QgDsgdm>(float_option(o, "momentum", 0.9, 0, 1),
                                           float_option(o, "mu", 0.9, 0, 1),
                                           float_option(o, "weight_decay", 0, 0, 1), nesterov);
        });
  }
  registry.add("choco", [](const ConfigSection& o, std::shared_ptr<const Compressor> q) {
    static constexpr std::array<std::string_view, 5> known{"gamma", "momentum", "nesterov",
                                                           "weight_decay", "seed"};
    o.require_known(known);
    if (!q) throw ConfigError("choco needs a compressor (decentralized.compressor = ...)");
    return std::make_unique<Choco>(
        std::move(q), float_option(o, "gamma", 0.5, 0, 1), float_option(o, "momentum", 0, 0, 1),
        o.get_bool("nesterov", false), float_option(o, "weight_decay", 0, 0, 1),
        static_cast<std::uint64_t>(o.get_int("seed", 1)));
  });
  registry.add("ring_allreduce", [](const ConfigSection& o, std::shared_ptr<const Compressor>) {
    static constexpr std::array<std::string_view, 4> known{"momentum", "weight_decay", "nesterov",
                                                           "allreduce"};
    o.require_known(known);
    return std::make_unique<AllreduceSgd>(
        float_option(o, "momentum", 0.9, 0, 1), float_option(o, "weight_decay", 0, 0, 1),
        o.get_bool("nesterov", false), parse_allreduce_algo(o.get_string("allreduce", "auto")));
  });
  for (const char* name : {"push_sum", "sgp"}) {
    registry.add(name, [](const ConfigSection& o, std::shared_ptr<const Compressor>) {
      static constexpr std::array<std::string_view, 2> known{"momentum", "weight_decay"};
      o.require_known(known);
      return std::make_unique<PushSum>(float_option(o, "momentum", 0, 0, 1),
                                       float_option(o, "weight_decay", 0, 0, 1));
    });
  }
}

namespace {

constexpr std::string_view kTopologyPrefix = "topology_options.";
constexpr std::string_view kCompressorPrefix = "compressor_options.";
constexpr std::array<std::string_view, 10> kRunKeys{
    "peers",     "steps",     "lr",       "batch",     "partition", "gossip_timeout_ms",
    "staleness", "algorithm", "topology", "compressor"};
constexpr std::array<std::string_view, 8> kOptimizerKeys{
    "weight_decay", "overlap", "momentum", "nesterov", "mu", "gamma", "seed", "allreduce"};

std::int64_t int_key(const ConfigSection& s, std::string_view key, std::int64_t fallback,
                     std::int64_t lo, std::int64_t hi) {
  const std::int64_t v = s.get_int(key, fallback);
  if (v < lo || v > hi) {
    throw ConfigError(s.prefix() + "." + std::string(key) + " must be between " +
                      std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                      std::to_string(v));
  }
  return v;
}

// A value of `s` with its own type (ConfigSection hides it: try the getters from the strictest).
Value value_of(const ConfigSection& s, const std::string& name) {
  try {
    return s.get_bool(name, false);
  } catch (const ConfigError&) {
  }
  try {
    return s.get_int(name, 0);
  } catch (const ConfigError&) {
  }
  try {
    return s.get_double(name, 0);
  } catch (const ConfigError&) {
  }
  return s.get_string(name, "");
}

// The keys of `s` under `prefix`, without it, as the section "<s's prefix>.<prefix>".
ConfigSection sub_section(const ConfigSection& s, std::string_view prefix) {
  std::map<std::string, Value, std::less<>> values;
  for (const auto& name : s.names()) {
    if (name.starts_with(prefix)) values[name.substr(prefix.size())] = value_of(s, name);
  }
  return ConfigSection(s.prefix() + "." + std::string(prefix.substr(0, prefix.size() - 1)),
                       std::move(values));
}

// The algorithms whose gossip goes through Gossip::mix(), the only asynchronous one.
bool mixes(std::string_view algorithm) {
  return algorithm == "dpsgd" || algorithm.starts_with("dsgdm") || algorithm.starts_with("qg_");
}

}  // namespace

DecentralizedSettings decentralized_settings_from(
    const ConfigSection& section, const std::function<void(const std::string&)>& check_partition) {
  const std::string& p = section.prefix();
  for (const auto& name : section.names()) {
    if (name.starts_with(kTopologyPrefix) || name.starts_with(kCompressorPrefix)) continue;
    const bool run_key = std::find(kRunKeys.begin(), kRunKeys.end(), name) != kRunKeys.end();
    const bool opt_key =
        std::find(kOptimizerKeys.begin(), kOptimizerKeys.end(), name) != kOptimizerKeys.end();
    if (!run_key && !opt_key) {
      std::string known;
      for (auto k : kRunKeys) known += std::string(known.empty() ? "" : ", ") + std::string(k);
      for (auto k : kOptimizerKeys) known += ", " + std::string(k);
      throw ConfigError("unknown config key '" + p + "." + name + "' (known: " + known +
                        ", topology_options.*, compressor_options.*)");
    }
  }
  DecentralizedSettings out;
  out.peers = int_key(section, "peers", 4, 1, 4096);
  out.steps = static_cast<std::uint64_t>(int_key(section, "steps", 100, 1, std::int64_t{1} << 40));
  out.lr = section.get_double("lr", 0.05);
  if (!(out.lr > 0) || !std::isfinite(out.lr)) {
    throw ConfigError(p + ".lr must be a finite number > 0, got " + std::to_string(out.lr));
  }
  out.batch = static_cast<std::size_t>(int_key(section, "batch", 32, 1, 1 << 20));
  out.partition = section.get_string("partition", "");
  if (!out.partition.empty() && check_partition) check_partition(out.partition);
  out.gossip_timeout = std::chrono::milliseconds(
      int_key(section, "gossip_timeout_ms", 5000, 1, std::int64_t{1} << 40));
  out.staleness = static_cast<std::uint64_t>(int_key(section, "staleness", 0, 0, 1 << 20));
  out.algorithm = section.get_string("algorithm", "dpsgd");
  out.topology = section.get_string("topology", "ring");
  out.compressor = section.get_string("compressor", "none");
  std::map<std::string, Value, std::less<>> optimizer_values;
  for (auto k : kOptimizerKeys) {
    if (section.has(k)) optimizer_values[std::string(k)] = value_of(section, std::string(k));
  }
  out.optimizer_options = ConfigSection(p, std::move(optimizer_values));
  out.topology_options = sub_section(section, kTopologyPrefix);
  out.compressor_options = sub_section(section, kCompressorPrefix);

  const bool compresses = out.algorithm == "choco";
  if (!compresses && (out.compressor != "none" || !out.compressor_options.names().empty())) {
    throw ConfigError(p + ".compressor and " + p + ".compressor_options.* apply to choco only (" +
                      out.algorithm + " has no compressed form; docs/ALGORITHMS.md 7.7)");
  }
  auto topology = make_topology(out);
  (void)topology->mixing(static_cast<Rank>(out.peers), 0);  // a graph that exists for `peers`
  auto optimizer = make_optimizer(out, make_compressor(out));
  if (optimizer->needs_symmetric() && !topology->symmetric()) {
    throw ConfigError(out.algorithm + " needs a symmetric topology; " + out.topology +
                      " is directed (use push_sum)");
  }
  if (out.staleness > 0 && !mixes(out.algorithm)) {
    throw ConfigError(p + ".staleness applies to dpsgd, dsgdm, dsgdm_n, qg_dsgdm and qg_dsgdm_n (" +
                      out.algorithm + "'s exchanges are synchronous)");
  }
  if (out.staleness > 0 && topology->time_varying()) {
    throw ConfigError(p + ".staleness needs a static topology; " + out.topology +
                      " changes every step");
  }
  return out;
}

std::unique_ptr<Topology> make_topology(const DecentralizedSettings& settings) {
  TopologyRegistry registry;
  add_builtin_topologies(registry);
  return registry.create(settings.topology, settings.topology_options);
}

std::shared_ptr<const Compressor> make_compressor(const DecentralizedSettings& settings) {
  if (settings.algorithm != "choco") return nullptr;
  // Error feedback only when asked: CHOCO's public copies already carry what was not sent.
  std::map<std::string, Value, std::less<>> options;
  for (const auto& name : settings.compressor_options.names()) {
    options[name] = value_of(settings.compressor_options, name);
  }
  options.try_emplace("error_feedback", false);
  CompressorRegistry registry;
  add_builtin_compressors(registry);
  return registry.create(settings.compressor,
                         ConfigSection(settings.compressor_options.prefix(), std::move(options)));
}

std::unique_ptr<DecentralizedOptimizer> make_optimizer(
    const DecentralizedSettings& settings, std::shared_ptr<const Compressor> compressor) {
  DecentralizedOptimizerRegistry registry;
  add_builtin_decentralized_optimizers(registry);
  return registry.create(settings.algorithm, settings.optimizer_options, std::move(compressor));
}

double consensus_distance(const std::vector<std::vector<float>>& models) {
  if (models.empty()) return 0;
  const std::size_t d = models[0].size();
  std::vector<double> mean(d, 0.0);
  for (const auto& m : models) {
    for (std::size_t k = 0; k < d; ++k) mean[k] += m[k];
  }
  for (double& v : mean) v /= static_cast<double>(models.size());
  double s = 0;
  for (const auto& m : models) {
    for (std::size_t k = 0; k < d; ++k) s += (m[k] - mean[k]) * (m[k] - mean[k]);
  }
  return std::sqrt(s);
}

}  // namespace cohort::aggregation
