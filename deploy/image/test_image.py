#!/usr/bin/python3
"""Builds the Cohort image from a Release build's install tree and runs a federation from it.

    deploy/image/test_image.py --build-dir build --cache DIR [--work DIR] [--keep]

1. `cmake --install BUILD --prefix WORK/install` (the binaries as a user installs them);
2. deploy/image/build-image.sh --install-tree WORK/install: a debootstrapped Debian 12 base (the
   tarball is cached in --cache), imported into a private podman storage under WORK, and the
   Dockerfile's `prebuilt` target: nothing is pulled from a registry, nothing is compiled;
3. cohort-keygen, in a container of the image as its user 65532, makes a CA and the certificates
   shard-0, client-0, client-1;
4. one shard and two clients, each in its own container of the image, TLS on: the shard in a
   network namespace of its own with loopback only (--network none), the clients in the shard's
   (--network container:...), as the pods run (uid 65532, read-only root file system, writable
   /tmp, no capabilities, no-new-privileges); Fashion-MNIST from the image;
5. every container exits 0 and the shard's metrics.jsonl (a mounted folder) holds the rounds;
6. the containers, the images and the private storage are removed, also on failure.
Every wait is bounded. Needs root, podman, runc, debootstrap (exit 77, skipped, without root).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = 3
CLIENTS = 2
SKIP = 77


def run(argv, timeout, check=True, **kw):
    """Runs argv with a time limit; its output goes to ours (CTest keeps it)."""
    print("+ " + " ".join(argv), flush=True)
    p = subprocess.run(argv, timeout=timeout, stdin=subprocess.DEVNULL, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{argv[0]} {' '.join(argv[1:3])} ... exited {p.returncode}")
    return p


class Podman:
    """podman with a private storage under `storage` and settings that need no /etc edits."""

    def __init__(self, storage):
        self.storage = storage
        self.base = ["podman", "--root", f"{storage}/root", "--runroot", f"{storage}/run",
                     "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
                     "--events-backend", "file", "--runtime", "runc"]

        self.names = []  # containers started, in order

    def __call__(self, *args, timeout=120, check=True, capture=False):
        kw = {"capture_output": True} if capture else {}
        return run(self.base + list(args), timeout, check=check, **kw)


def run_limits():
    # podman's default rlimits (nofile 1048576) exceed what an unprivileged sandbox may set; ask
    # for at most what this process has.
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 8192)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]


def hardening():
    return ["--user", "65532:65532", "--read-only", "--tmpfs", "/tmp:size=64m", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", *run_limits()]


def federation(pm, image, pki, out, tag):
    """Starts the shard and the clients; returns {name: exit code} and the logs."""
    tls = ["-v", f"{pki}:/etc/cohort/tls:ro"]
    shard = f"{tag}-shard-0"
    names = pm.names
    names.append(shard)
    pm("run", "-d", "--name", shard, "--network", "none", *hardening(), *tls,
       "-v", f"{out}:/var/lib/cohort", image,
       "cohort-server", "--shard", "0", "--shards", "1", "--listen", "tcp://0.0.0.0:7000",
       "--name", "shard-0", f"--server.rounds={ROUNDS}", f"--server.clients_per_round={CLIENTS}",
       f"--server.min_clients={CLIENTS}", f"--server.min_updates={CLIENTS}",
       "--server.round_deadline_ms=120000", "--train.steps=5", "--model.spec=mlp:784-64-10",
       "--server.metrics_file=/var/lib/cohort/metrics.jsonl",
       "--server.checkpoint_dir=/var/lib/cohort/checkpoints",
       "--tls.ca_file=/etc/cohort/tls/ca.pem", "--tls.cert_file=/etc/cohort/tls/shard-0.pem",
       "--tls.key_file=/etc/cohort/tls/shard-0.key", capture=True)
    for j in range(CLIENTS):
        name = f"{tag}-client-{j}"
        names.append(name)
        pm("run", "-d", "--name", name, "--network", f"container:{shard}", *hardening(), *tls, image,
           "cohort-client", "--server", "tcp://127.0.0.1:7000", "--name", f"client-{j}",
           "--data", "iid", "--part", f"{j}/{CLIENTS}", "--device", "cpu",
           "--tls.ca_file=/etc/cohort/tls/ca.pem", f"--tls.cert_file=/etc/cohort/tls/client-{j}.pem",
           f"--tls.key_file=/etc/cohort/tls/client-{j}.key", capture=True)
    codes = {}
    deadline = time.time() + 300
    for name in names:
        left = max(5, deadline - time.time())
        try:
            p = pm("wait", name, timeout=left, capture=True)
            codes[name] = int(p.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            codes[name] = None  # still running at the deadline
    logs = {n: pm("logs", n, check=False, capture=True) for n in names}
    return codes, {n: (p.stdout or "") + (p.stderr or "") for n, p in logs.items()}, names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True, help="a built Release tree (cmake --install source)")
    ap.add_argument("--cache", required=True, help="folder of the cached debootstrap tarball")
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--work", help="scratch folder (default: a temporary folder, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the images and the storage")
    args = ap.parse_args()

    if os.geteuid() != 0:
        print("skipped: needs root (debootstrap, podman's storage)")
        return SKIP
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        print(f"FAILED: {', '.join(missing)} not installed (apt-get install podman runc debootstrap)")
        return 1

    work = args.work or tempfile.mkdtemp(prefix="cohort-image-test.")
    os.makedirs(work, exist_ok=True)
    tag = f"cohort-test-{os.getpid()}"
    image = f"localhost/{tag}:latest"
    base = f"localhost/{tag}-base:bookworm"
    pm = Podman(os.path.join(work, "storage"))
    names = pm.names
    failures = []
    started = time.time()
    try:
        install = os.path.join(work, "install")
        shutil.rmtree(install, ignore_errors=True)
        run([args.cmake, "--install", args.build_dir, "--prefix", install], 300,
            stdout=subprocess.DEVNULL)
        t0 = time.time()
        run([os.path.join(HERE, "build-image.sh"), "--install-tree", install, "--cache", args.cache,
             "--storage", pm.storage, "--tag", image, "--base-tag", base], 900)
        print(f"image built in {time.time() - t0:.0f} s", flush=True)

        pki = os.path.join(work, "pki")
        shutil.rmtree(pki, ignore_errors=True)
        os.makedirs(pki, mode=0o700)
        os.chown(pki, 65532, 65532)
        keygen = ["run", "--rm", "--network", "none", *hardening(), "-v", f"{pki}:/pki", image,
                  "cohort-keygen"]
        pm(*keygen, "ca", "--out", "/pki", capture=True)
        for node in ["shard-0"] + [f"client-{j}" for j in range(CLIENTS)]:
            pm(*keygen, "node", "--ca", "/pki", "--name", node, "--out", "/pki", capture=True)
        os.unlink(os.path.join(pki, "ca.key"))  # as make-secrets.sh: the CA key never reaches a node

        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        os.chown(out, 65532, 65532)
        t0 = time.time()
        codes, logs, names = federation(pm, image, pki, out, tag)
        print(f"federation ran in {time.time() - t0:.0f} s: exit codes {codes}", flush=True)
        for name in names:
            if codes[name] != 0:
                failures.append(f"{name} exited {codes[name]}:\n{logs[name][-3000:]}")
        if "0.0.0.0:7000 (TLS)" not in logs[names[0]]:
            failures.append(f"the shard did not listen with TLS:\n{logs[names[0]][-3000:]}")
        metrics = os.path.join(out, "metrics.jsonl")
        records = []
        if os.path.exists(metrics):
            with open(metrics, encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
        rounds = [r.get("round") for r in records if r.get("event") == "round"]
        if rounds != list(range(1, ROUNDS + 1)):
            failures.append(f"metrics.jsonl rounds {rounds}, expected 1..{ROUNDS}")
        if not any(r.get("event") == "done" for r in records):
            failures.append("metrics.jsonl has no done record")
        if not all(r.get("clients") == CLIENTS for r in records if r.get("event") == "round"):
            failures.append(f"a round without {CLIENTS} clients: {records}")
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as e:
        failures.append(str(e))
    finally:
        if not args.keep:
            for name in reversed(names):  # the clients first: they use the shard's network
                pm("rm", "-f", "-t", "5", "--ignore", name, timeout=120, check=False, capture=True)
            pm("rm", "-f", "-t", "5", "--all", timeout=120, check=False)
            pm("rmi", "-f", "--all", timeout=120, check=False)
            pm("system", "reset", "-f", timeout=120, check=False, capture=True)
            shutil.rmtree(pm.storage, ignore_errors=True)
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)

    print(f"total {time.time() - started:.0f} s")
    if failures:
        print(f"FAILED: {len(failures)} problem(s)")
        for f in failures:
            print(f"  - {f}")
        return 1
    print(f"PASSED: image built offline; 1 shard + {CLIENTS} clients in containers, TLS, "
          f"{ROUNDS} rounds in metrics.jsonl" + ("" if args.keep else "; containers and images removed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
