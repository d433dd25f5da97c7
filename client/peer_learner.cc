#include "peer_learner.h"

#include <algorithm>
#include <cstring>

#include "cohort/client/participant.h"
#include "cohort/core/error.h"
#include "cohort/kernels/loss.h"

namespace cohort::client {

PeerLearner::PeerLearner(const kernels::Device& device, const kernels::NetworkSpec& spec,
                         const Dataset& train, std::vector<std::uint32_t> indices,
                         std::size_t batch, std::uint64_t data_seed, std::uint64_t init_seed,
                         std::unique_ptr<aggregation::DecentralizedOptimizer> optimizer)
    : train_(train),
      net_(device.make_network(spec)),
      indices_(std::move(indices)),
      batch_(batch),
      data_seed_(data_seed),
      opt_(std::move(optimizer)) {
  if (indices_.empty()) throw DataError("a decentralized peer needs at least one training row");
  if (batch_ == 0) throw ConfigError("batch size must be at least 1");
  if (train_.feature_dim() != spec.input_shape().size()) {
    throw DataError("the data has " + std::to_string(train_.feature_dim()) +
                    " features per row, the model takes " +
                    std::to_string(spec.input_shape().size()));
  }
  net_->init(init_seed);
  x_ = FloatBuffer(net_->parameters());
}

std::span<const float> PeerLearner::model() { return opt_->eval_point(x_.span()); }

float PeerLearner::step(std::uint64_t t, float lr, aggregation::Gossip& gossip) {
  const auto rows = dataparallel_batch(indices_, t, batch_, data_seed_);
  const std::size_t b = rows.size(), dim = train_.feature_dim();
  batch_x_.resize(b * dim);
  batch_y_.resize(b);
  for (std::size_t k = 0; k < b; ++k) {
    const auto row = train_.row(rows[k]);
    std::memcpy(batch_x_.data() + k * dim, row.data(), dim * sizeof(float));
    batch_y_[k] = train_.labels()[rows[k]];
  }
  net_->set_parameters(opt_->eval_point(x_.span()));
  const float loss = net_->compute_gradients(batch_x_, batch_y_, b);
  opt_->step(t, x_.span(), std::as_const(*net_).gradients(), lr, gossip);
  return loss;
}

EvalResult PeerLearner::evaluate(const Dataset& data) {
  net_->set_parameters(model());
  EvalResult out;
  const std::size_t dim = data.feature_dim(), chunk = 1000;
  double loss = 0;
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < data.size(); begin += chunk) {
    const std::size_t b = std::min(chunk, data.size() - begin);
    const auto e = net_->evaluate(data.features().subspan(begin * dim, b * dim),
                                  data.labels().subspan(begin, b), b);
    loss += e.loss_sum;
    correct += e.correct;
  }
  out.count = data.size();
  out.loss = out.count ? loss / static_cast<double>(out.count) : 0;
  out.accuracy = out.count ? static_cast<double>(correct) / static_cast<double>(out.count) : 0;
  return out;
}

}  // namespace cohort::client
