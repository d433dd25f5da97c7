#!/usr/bin/env python3
"""A PyTorch CNN as a Cohort client: conv-bn-relu-pool twice and a linear layer, a model with no
entry in Cohort's zoo. The coordinator needs only a model.spec whose vector has the same layout
(state_dict order, BatchNorm's running statistics included, num_batches_tracked not): SPEC below,
written in Cohort's net: layer grammar, describes this very network, so the server initialises
and averages it (evaluation is done by the clients, here in PyTorch).

    cnn_client.py --print-spec          # the coordinator's model.spec and the parameter count
    PYTHONPATH=build/python /usr/bin/python3 examples/pytorch/cnn_client.py \\
        --server tcp://127.0.0.1:7000 --name cnn-0 --part 0/3 --ca ... --cert ... --key ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

# The same network in Cohort's layer list (model.spec), layer for layer.
SPEC = ("net:1x28x28,conv:8:3:1:1,bn,relu,maxpool:2,conv:16:3:1:1,bn,relu,maxpool:2,flatten,"
        "linear:10")


def make_model():
    from torch import nn
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, stride=1, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=1, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--print-spec", action="store_true",
                   help="print the coordinator's model.spec and the parameter count, and exit")
    if "--print-spec" in sys.argv[1:]:
        import cohort.torch
        print(SPEC, cohort.torch.parameter_count(make_model()))
        return
    args = p.parse_args()
    import torch
    torch.manual_seed(args.seed)
    common.run(args, make_model(), flatten=False)


if __name__ == "__main__":
    main()
