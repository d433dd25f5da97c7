#!/usr/bin/env python3
"""A PyTorch client of a Cohort federation: the model is nn.Sequential(Linear(784, 256), ReLU,
Linear(256, 128), ReLU, Linear(128, 10)), whose state_dict flattened in order is exactly the
vector of the coordinator's model.spec = "mlp:784-256-128-10" (235,146 floats), so it trains
beside cohort-client processes on the same global model. Data: the --part I/N of Fashion-MNIST
that cohort-client --data iid --part I/N takes (the same examples, pixels / 255).

    PYTHONPATH=build/python /usr/bin/python3 examples/pytorch/mlp_client.py \\
        --server tcp://127.0.0.1:7000 --name py-2 --part 2/4 --ca ca.pem --cert py-2.pem \\
        --key py-2.key
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def make_model():
    from torch import nn
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def main():
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    import torch
    torch.manual_seed(args.seed)
    common.run(args, make_model(), flatten=True)


if __name__ == "__main__":
    main()
