#include "cohort/aggregation/decentralized.h"

#include <array>
#include <cmath>
#include <cstring>
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
  AllreduceSgd(float beta, float wd, bool nesterov) : beta_(beta), wd_(wd), nesterov_(nesterov) {}
  std::string_view name() const override { return "ring_allreduce"; }
  bool needs_symmetric() const override { return false; }
  void step(std::uint64_t, std::span<float> x, std::span<const float> grad, float lr,
            Gossip& gossip) override {
    check_sizes(x, grad);
    if (!reducer_) {
      AllreduceOptions o;
      o.timeout = std::chrono::milliseconds(60000);
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
    static constexpr std::array<std::string_view, 3> known{"momentum", "weight_decay", "nesterov"};
    o.require_known(known);
    return std::make_unique<AllreduceSgd>(float_option(o, "momentum", 0.9, 0, 1),
                                          float_option(o, "weight_decay", 0, 0, 1),
                                          o.get_bool("nesterov", false));
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
