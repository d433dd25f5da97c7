#!/usr/bin/env python3
"""TensorBoard event files (metrics.tensorboard_dir) read back by TensorBoard's own reader.

Two runs, each bounded in time, every process killed and reaped on the way out:
  * a real federation on loopback (plaintext): two cohort-server shards, two cohort-client
    processes, 3 rounds with DP on. Shard 0's event file must hold, for every "round" record of
    its metrics.jsonl, one scalar per mapped field (step = round, value = the field as float32);
    shard 1 must write none.
  * cohort-sim in one process, 3 rounds: DIR/sim holds the sim_round records, DIR/server the
    coordinator's round records.
The reader is tensorboard.backend.event_processing.event_accumulator.EventAccumulator (PyPI
tensorboard), from a test-only venv under the build folder that `--setup-venv VENV` makes once
(the CTest fixture tensorboard_venv); the test runs with that venv's python. A missing
tensorboard is a failure, never a pass.
"""
import argparse
import glob
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

from procs import Processes, read_port, records

# The fields each record type maps to a tag (server/round_report.cc round_scalars(),
# sim/report.cc sim_round_scalars()).
ROUND_TAGS = {
    "train_loss": "train/loss", "test_loss": "test/loss", "test_accuracy": "test/accuracy",
    "round_seconds": "round/seconds", "train_seconds": "round/train_seconds",
    "comm_seconds": "round/comm_seconds", "bytes": "bytes/round", "uplink_bytes": "bytes/uplink",
    "total_bytes": "bytes/total", "clients": "clients/updates", "selected": "clients/selected",
    "dp_epsilon": "dp/epsilon",
}
SIM_ROUND_TAGS = {
    "train_loss": "train/loss", "test_loss": "test/loss", "test_accuracy": "test/accuracy",
    "sim_round_seconds": "round/sim_seconds", "wall_round_seconds": "round/wall_seconds",
    "wall_train_seconds": "round/wall_train_seconds", "sim_seconds": "sim/seconds",
    "committed": "round/committed", "bytes": "bytes/round", "total_bytes": "bytes/total",
    "selected": "clients/selected", "completed": "clients/completed",
    "stragglers": "clients/stragglers", "silent": "clients/silent",
    "secagg_seconds": "secagg/seconds", "secagg_bytes": "secagg/bytes",
}
ROUNDS = 3
FAILURES = []


def check(ok, message):
    if not ok:
        FAILURES.append(message)
        print("FAILED: " + message, flush=True)
    return ok


def setup_venv(venv):
    """Makes VENV with tensorboard unless it already imports there. Exits non-zero on failure."""
    py = os.path.join(venv, "bin", "python")
    # prometheus_client: the exposition-format parser of http_endpoint_test.py, same venv.
    probe = [py, "-c", "import tensorboard.backend.event_processing.event_accumulator, "
             "prometheus_client.parser"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True, timeout=120).returncode == 0:
        print(f"{venv}: tensorboard already installed")
        return 0
    # Debian's interpreter (python3-venv): python3 on PATH may be another build.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", venv], check=True, timeout=300)
    subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
                    "tensorboard", "prometheus_client"], check=True, timeout=1200)
    r = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        print(f"tensorboard does not import in {venv}: {r.stderr}", file=sys.stderr)
        return 1
    print(f"{venv}: tensorboard installed")
    return 0


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def compare(run_dir, recs, tags, what):
    """Checks that run_dir's one event file holds exactly recs' mapped fields as scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    if not check(len(files) == 1, f"{what}: {len(files)} event files in {run_dir}, want 1"):
        return
    check(len(recs) >= ROUNDS, f"{what}: {len(recs)} records, want at least {ROUNDS}")
    failures = len(FAILURES)
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every scalar
    acc.Reload()
    want = {tag: [(r["round"], f32(r[field])) for r in recs if field in r]
            for field, tag in tags.items()}
    want = {tag: points for tag, points in want.items() if points}
    got_tags = set(acc.Tags()["scalars"])
    check(got_tags == set(want), f"{what}: tags {sorted(got_tags)} != {sorted(want)}")
    for tag, points in sorted(want.items()):
        if tag not in got_tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        # Exact: both sides are the JSON value rounded to float32.
        check(got == points, f"{what}: {tag}: TensorBoard has {got}, the JSON lines {points}")
    if len(FAILURES) == failures:
        print(f"{what}: {len(want)} tags x {len(recs)} records match ({run_dir})", flush=True)
    return want


def federation(bins, work):
    tb, procs = os.path.join(work, "tb-federation"), Processes(work)
    common = ["--insecure", "--log-level", "info", "--model.spec=mlp:784-32-10",
              f"--server.rounds={ROUNDS}", "--server.clients_per_round=2", "--server.min_clients=2",
              "--dp.clip=1", "--dp.noise_multiplier=0.5", "--server.round_deadline_ms=60000",
              "--metrics.tensorboard_dir=" + tb]
    try:
        s0 = procs.start("shard-0", [bins.server, "--shard", "0", "--shards", "2", "--name",
                                     "shard-0", "--listen", "tcp://127.0.0.1:*", "--port-file",
                                     os.path.join(work, "port-0"), "--server.metrics_file=" +
                                     os.path.join(work, "metrics.jsonl")] + common)
        coordinator = "tcp://127.0.0.1:" + read_port(os.path.join(work, "port-0"), s0)
        procs.start("shard-1", [bins.server, "--shard", "1", "--shards", "2", "--name", "shard-1",
                                "--listen", "tcp://127.0.0.1:*", "--coordinator", coordinator,
                                "--server.metrics_file="] + common)
        for i in range(2):
            procs.start(f"client-{i}", [bins.client, "--insecure", "--server", coordinator,
                                        "--name", f"client-{i}", "--data", "iid", "--part",
                                        f"{i}/2", "--log-level", "info"])
        try:
            code = s0.wait(timeout=180)
        except subprocess.TimeoutExpired:
            code = None
        if not check(code == 0, f"federation: shard 0 exited with {code}:\n{procs.log('shard-0')}"):
            return
    finally:
        procs.close()
    # One event file, shard 0's: shard 1 ignores the key.
    want = compare(tb, records(os.path.join(work, "metrics.jsonl"), "round"), ROUND_TAGS,
                   "federation")
    if want is not None:
        for tag in ("dp/epsilon", "test/accuracy", "train/loss", "bytes/round"):
            check(tag in want, f"federation: no {tag} in the round records")


def simulation(bins, work):
    tb = os.path.join(work, "tb-sim")
    args = [bins.sim, "--sim.clients=4", "--server.clients_per_round=2",
            f"--server.rounds={ROUNDS}", "--sim.progress=false", "--sim.threads=2",
            "--sim.csv_file=", "--model.spec=mlp:784-32-10",
            "--sim.metrics_file=" + os.path.join(work, "sim.jsonl"),
            "--server.metrics_file=" + os.path.join(work, "sim-server.jsonl"),
            "--metrics.tensorboard_dir=" + tb]
    with open(os.path.join(work, "sim.log"), "wb") as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            code = p.wait(timeout=30)
    with open(os.path.join(work, "sim.log"), errors="replace") as f:
        log = f.read()[-3000:]
    if not check(code == 0, f"cohort-sim exited with {code}:\n{log}"):
        return
    check(sorted(os.listdir(tb)) == ["server", "sim"], f"cohort-sim: {tb} holds {os.listdir(tb)}")
    compare(os.path.join(tb, "sim"), records(os.path.join(work, "sim.jsonl"), "sim_round"),
            SIM_ROUND_TAGS, "cohort-sim sim_round")
    compare(os.path.join(tb, "server"), records(os.path.join(work, "sim-server.jsonl"), "round"),
            ROUND_TAGS, "cohort-sim round")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup-venv", metavar="VENV")
    ap.add_argument("--server")
    ap.add_argument("--client")
    ap.add_argument("--sim")
    bins = ap.parse_args()
    if bins.setup_venv:
        return setup_venv(bins.setup_venv)
    try:
        from tensorboard.backend.event_processing import event_accumulator  # noqa: F401
    except ImportError as e:
        print(f"FAILED: TensorBoard's reader does not import ({e}); run with the venv that "
              "--setup-venv makes (CTest fixture tensorboard_venv)", file=sys.stderr)
        return 1
    for b in (bins.server, bins.client, bins.sim):
        if not b or not os.access(b, os.X_OK):
            print(f"FAILED: no binary {b}", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="cohort-tb-") as work:
        federation(bins, work)
        simulation(bins, work)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("all TensorBoard checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
