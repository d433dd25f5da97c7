"""What the example's PyTorch clients share: Fashion-MNIST from its IDX files, cohort-client's iid
partition, and the command line that makes a cohort.Client."""
import argparse
import gzip
import os
import sys

import numpy as np

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
MASK = (1 << 64) - 1


# --- Fashion-MNIST ------------------------------------------------------------------------


def _read_idx(path):
    """An IDX file (gzip'd or not) as a NumPy array of its dtype and shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    dtype, ndim = np.dtype(dtypes[raw[2]]), raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(shape)


def _idx_file(folder, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{folder}: no {stem} or {stem}.gz (Fashion-MNIST's IDX files)")


def load_fashion_mnist(folder=FASHION_MNIST):
    """(x_train, y_train, x_test, y_test): 784 pixels per image as float32 scaled to [0, 1] (as
    cohort-client's data.scale = auto), labels as int64."""
    out = []
    for split in ("train", "t10k"):
        x = _read_idx(_idx_file(folder, f"{split}-images-idx3-ubyte"))
        y = _read_idx(_idx_file(folder, f"{split}-labels-idx1-ubyte"))
        out += [(x.reshape(len(x), -1).astype(np.float32) / np.float32(255.0)),
                y.astype(np.int64)]
    return tuple(out)


# --- cohort-client's iid partition (client/partition.cc, core/random.cc) ---------------------


def _splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


class Rng:
    """Cohort's cohort::Rng: xoshiro256** seeded by four SplitMix64 steps; below(n) is Lemire's
    multiply-and-reject; shuffle() Fisher-Yates from the back. Bit-identical to the C++ one."""

    def __init__(self, seed):
        state = seed & MASK
        self.s = []
        for _ in range(4):
            state, word = _splitmix64(state)
            self.s.append(word)

    def next(self):
        s = self.s
        result = (_rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def below(self, n):
        m = self.next() * n
        low = m & MASK
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & MASK
        return m >> 64

    def shuffle(self, values):
        for i in range(len(values), 1, -1):
            j = self.below(i)
            values[i - 1], values[j] = values[j], values[i - 1]


def iid_part(n_items, part, count, seed=1):
    """The examples cohort-client --data iid --part PART/COUNT trains on (data.seed = seed): a
    seeded shuffle of 0..n-1 cut as numpy.array_split does. Returns int64 indices in that order."""
    order = list(range(n_items))
    Rng(seed).shuffle(order)
    base, extra = divmod(n_items, count)
    begin = part * base + min(part, extra)
    size = base + (1 if part < extra else 0)
    return np.array(order[begin:begin + size], dtype=np.int64)


# --- the client ---------------------------------------------------------------------------


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--server", default="tcp://127.0.0.1:7000", help="shard 0's url")
    p.add_argument("--name", required=True, help="node id (the certificate's CN)")
    p.add_argument("--part", default="0/1", help="this client's iid part of Fashion-MNIST: I/N")
    p.add_argument("--data-dir", default=FASHION_MNIST)
    p.add_argument("--ca", help="the CA certificate (cohort-keygen ca)")
    p.add_argument("--cert", help="this client's certificate (cohort-keygen node)")
    p.add_argument("--key", help="this client's private key")
    p.add_argument("--insecure", action="store_true", help="plaintext (no TLS)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed (the global model "
                   "comes from the coordinator; this seeds only what the model's __init__ draws)")
    return p


def client_options(args):
    options = {"client.name": args.name, "client.server": args.server}
    if args.insecure:
        options["tls.insecure"] = True
    else:
        if not (args.ca and args.cert and args.key):
            sys.exit(f"{args.name}: give --ca, --cert and --key (or --insecure)")
        options.update({"tls.ca_file": args.ca, "tls.cert_file": args.cert,
                        "tls.key_file": args.key})
    return options


def my_part(args, x_train, y_train):
    i, n = (int(v) for v in args.part.split("/"))
    if not 0 <= i < n:
        sys.exit(f"--part {args.part}: I/N with 0 <= I < N")
    rows = iid_part(len(x_train), i, n)
    return x_train[rows], y_train[rows]


def run(args, model, flatten):
    """Loads this client's part and the test set, and serves rounds with cohort.torch.Trainer
    until the coordinator ends training."""
    import time

    import torch

    import cohort
    import cohort.torch

    torch.set_num_threads(args.threads)
    x_train, y_train, x_test, y_test = load_fashion_mnist(args.data_dir)
    x, y = my_part(args, x_train, y_train)
    if not flatten:  # images 1x28x28 for a CNN
        x, x_test = x.reshape(-1, 1, 28, 28), x_test.reshape(-1, 1, 28, 28)
    trainer = cohort.torch.Trainer(model, (x, y), test_data=(x_test, y_test))
    count = cohort.torch.parameter_count(model)

    def train(params, round):
        if round.parameter_count != count:
            raise ValueError(f"the coordinator's model {round.model_spec} has "
                             f"{round.parameter_count} parameters, this PyTorch model {count}")
        out = trainer(params, round)
        m = out[2]
        print(f"{args.name}: round {round.id}: {m['steps']} steps, loss {m['loss']:.4f}, "
              f"train {m['train_seconds']:.2f}s", file=sys.stderr, flush=True)
        return out

    client = cohort.Client(options=client_options(args))
    print(f"{args.name}: {len(x)} training examples (iid {args.part}), {count} parameters, "
          f"joining {args.server}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    client.run(train, num_samples=len(x), evaluate=trainer.evaluate)
    print(f"{args.name}: done after {time.perf_counter() - t0:.1f}s", file=sys.stderr,
          flush=True)
