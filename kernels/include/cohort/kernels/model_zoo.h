// Model specs from config strings, built on the kernels' NetworkSpec (cohort/kernels/network.h).
//
//   spec                    network                                                 params
//   mlp:784-256-128-10      linear layers of the given widths, ReLU between (any     235,146
//                           number of widths >= 2; the first is the input size)
//   cnn:lenet5              1x28x28: conv5x5x6 (pad 2)-relu-pool2-conv5x5x16-relu-    61,706
//                           pool2-fc120-relu-fc84-relu-fc10 (LeCun et al., 1998, with
//                           ReLU and max pooling as commonly run today)
//   cnn:2conv               1x28x28: conv5x5x32 (pad 2)-relu-pool2-conv5x5x64 (pad 2)- 1,663,370
//                           relu-pool2-fc512-relu-fc10 (the CNN of McMahan et al.,
//                           2017, "FedAvg")
//   cnn:2conv:1024          the same with fc1024: TensorFlow's "Deep MNIST" tutorial  3,274,634
//                           net (without its dropout)
//   cnn:cifar               3x32x32: conv5x5x32 (pad 2)-relu-pool2-conv5x5x64 (pad 2)- 2,156,490
//                           relu-pool2-fc512-relu-fc10
//   cnn:resnet20            3x32x32: ResNet-20 (He et al., 2016): conv3x3x16-bn-relu,   274,442
//   (also resnet20)         3 stages x 3 blocks (conv3x3-bn-relu-conv3x3-bn + shortcut,  (1,376 of
//                           relu) at 16/32/64 channels, stride 2 and a 1x1 projection     them bn
//                           shortcut entering stages 2 and 3, global average pooling,     running
//                           fc10; convolutions keep their bias                            stats)
//   net:INPUT,LAYER,...     your own network: INPUT is CxHxW (or a width D), each LAYER one of
//                           conv:OUT:K[:STRIDE[:PAD]] (stride 1, pad 0 by default),
//                           maxpool:K[:STRIDE], avgpool:K[:STRIDE], gap (global average
//                           pooling), linear:OUT (flattens a CxHxW input), bn (batch
//                           normalisation), relu, tanh, sigmoid, gelu (exact), flatten,
//                           dropout:P; "res[" before a layer opens a residual block, "]" after
//                           one closes it (identity shortcut, or a 1x1 projection with stride
//                           where the block changes the shape); input channels and widths
//                           follow from the layer before, e.g.
//                           net:1x28x28,conv:16:3:1:1,relu,maxpool:2,linear:64,relu,linear:10
//                           (white space around the commas is ignored: a TOML multi-line
//                           string may hold one layer per line)
// The CNNs take the input shape from the spec's default or from `input` when given (e.g.
// cnn:2conv on 3x32x32), and the number of classes from `classes` (default 10).
//
// Initialisation is NetworkSpec::initialize / Network::init(seed): deterministic for a seed on
// every machine and device. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/kernels/network.h"

namespace cohort::kernels {

struct ModelOptions {
  // Per-example input shape; empty means the spec's own (mlp: its first width, as (W, 1, 1)).
  std::optional<Shape> input;
  // Logits; 0 means the spec's own (mlp: its last width; CNNs: 10).
  std::size_t classes = 0;
};

// Throws ConfigError for an unknown spec (listing the known ones), a malformed width list, or an
// input shape the network cannot take (e.g. an mlp whose first width is not the input size).
NetworkSpec make_network_spec(std::string_view spec, const ModelOptions& options = {});

// The spec strings make_network_spec() knows, for help text: "mlp:W0-W1-...-Wn", "cnn:lenet5", ...
std::string known_model_specs();

}  // namespace cohort::kernels
