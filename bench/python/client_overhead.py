#!/usr/bin/python3
"""A Python client's framework cost per round against a stock C++ client's.

Two federations one after the other, each one cohort-server shard (TLS, loopback) and one
client: a cohort-client, then a cohort.Client training the same MLP with cohort.torch.Trainer on
the same number of Fashion-MNIST examples (alone, so neither waits behind the other's push). Each client reports round_seconds (from its RoundStart to its report) and train_seconds
(its local training alone: for the Python client, cohort.torch.Trainer's loop without the
conversions in and out of the torch.nn.Module); the server's metrics file holds both per client
and round. framework = round - train: pulling, pushing, the update, and (Python) the call into
Python and the parameter conversions. Prints one JSON object.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python/client_overhead.py [--build build]
       [--rounds 10] [--model mlp:784-256-128-10] [--steps 20]
"""
import argparse
import gzip
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


def idx(name):
    with gzip.open(FASHION / name, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def mlp(spec):
    import torch.nn as nn
    sizes = [int(s) for s in spec.split(":")[1].split("-")]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--model", default="mlp:784-256-128-10")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    build = pathlib.Path(args.build).resolve()
    sys.path.insert(0, str(build / "python"))
    import torch
    import cohort
    import cohort.torch

    torch.set_num_threads(1)
    cohort.set_log_level("warn")
    work = pathlib.Path(tempfile.mkdtemp(prefix="cohort-pybench-"))
    cohort.keygen_ca(str(work / "ca"))
    for n in ("shard-0", "client-0", "py-0"):
        cohort.keygen_node(str(work / "ca"), n, str(work / "certs"))

    def tls(n):
        return {"tls.ca_file": str(work / "ca/ca.pem"), "tls.cert_file": str(work / f"certs/{n}.pem"),
                "tls.key_file": str(work / f"certs/{n}.key")}

    x = idx("train-images-idx3-ubyte.gz").reshape(-1, 784)[:30000].astype(np.float32) / 255
    y = idx("train-labels-idx1-ubyte.gz")[:30000].astype(np.int64)

    def federation(kind):
        """One shard and one client (kind "cpp" or "py") for args.rounds rounds: each client
        alone, so that neither's pull or push waits behind the other's."""
        metrics = work / f"metrics-{kind}.jsonl"
        port = work / f"port-{kind}"
        procs = []
        try:
            server = subprocess.Popen(
                [str(build / "bin/cohort-server"), "--shard", "0", "--shards", "1", "--listen",
                 "tcp://127.0.0.1:*", "--port-file", str(port), "--log-level", "warn",
                 f"--server.metrics_file={metrics}", f"--server.checkpoint_dir={work / kind}",
                 f"--model.spec={args.model}", f"--server.rounds={args.rounds}",
                 "--server.clients_per_round=1", "--server.min_clients=1", "--server.work=fixed",
                 f"--train.steps={args.steps}", "--train.batch_size=32", "--train.lr=0.05",
                 "--server.eval_every=0"] + [f"--{k}={v}" for k, v in tls("shard-0").items()],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            procs.append(server)
            deadline = time.monotonic() + 20
            while not port.exists() or not port.read_text().strip():
                if time.monotonic() > deadline:
                    raise SystemExit("the shard did not start")
                time.sleep(0.05)
            url = "tcp://127.0.0.1:" + port.read_text().strip()
            wall0 = time.monotonic()
            if kind == "cpp":
                procs.append(subprocess.Popen(
                    [str(build / "bin/cohort-client"), "--server", url, "--name", "client-0",
                     "--data", "iid", "--part", "0/2", "--log-level", "warn"]
                    + [f"--{k}={v}" for k, v in tls("client-0").items()],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            else:
                trainer = cohort.torch.Trainer(mlp(args.model), (x, y))
                client = cohort.Client(
                    options={"client.server": url, "client.name": "py-0", **tls("py-0")})
                error = []
                t = threading.Thread(target=lambda: _run(client, trainer, len(y), error),
                                     daemon=True)
                t.start()
                t.join(600)
                if t.is_alive():
                    client.stop()
                    raise SystemExit("the Python client did not finish within 600 s")
                if error:
                    raise error[0]
            if server.wait(600) != 0:
                raise SystemExit(f"the {kind} federation's shard failed")
            wall = time.monotonic() - wall0
            records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            return wall, [r for r in records if r.get("event") == "client" and r.get("trained")]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)

    wall_cpp, rows_cpp = federation("cpp")
    wall_py, rows_py = federation("py")

    def summary(rows):
        mine = rows[1:]  # round 1 warms up (first touches)
        fw = [r["round_seconds"] - r["train_seconds"] for r in mine]
        return {"rounds": len(mine),
                "round_s": statistics.median(r["round_seconds"] for r in mine),
                "train_s": statistics.median(r["train_seconds"] for r in mine),
                "comm_s": statistics.median(r["comm_seconds"] for r in mine),
                "framework_s": statistics.median(fw)}

    py, cpp = summary(rows_py), summary(rows_cpp)
    out = {
        "bench": "python_client_overhead", "model": args.model, "steps": args.steps,
        "batch": 32, "wall_s": {"python": round(wall_py, 2), "cpp": round(wall_cpp, 2)},
        "python": py, "cpp": cpp,
        # The bound: a Python round costs at most 10% more than a C++ round beyond the
        # difference in local training, i.e. (py framework - cpp framework) / cpp round <= 0.10.
        "extra_framework_over_cpp_round": (py["framework_s"] - cpp["framework_s"]) / cpp["round_s"],
        "framework_ratio_py_over_cpp": py["framework_s"] / cpp["framework_s"],
    }
    print(json.dumps(out))


def _run(client, trainer, n, error):
    try:
        client.run(trainer, num_samples=n)
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        error.append(e)


if __name__ == "__main__":
    main()
