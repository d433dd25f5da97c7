"""Helpers of the Python process tests (tensorboard_test.py, http_endpoint_test.py): child
processes with their output in files, port files, metrics.jsonl records."""
import json
import os
import signal
import subprocess
import time


class Processes:
    """Child processes with their output in files; all killed and reaped by close()."""

    def __init__(self, folder):
        self.folder, self.procs = folder, []

    def start(self, name, args):
        out = open(os.path.join(self.folder, name + ".log"), "wb")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append((name, p))
        return p

    def log(self, name):
        with open(os.path.join(self.folder, name + ".log"), errors="replace") as f:
            return f.read()[-3000:]

    def close(self):
        for _, p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for _, p in self.procs:
            p.wait(timeout=30)


def read_port(path, proc, seconds=30):
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / 0.05) + 1):
        if os.path.exists(path):
            with open(path) as f:
                port = f.read().strip()
            if port:
                return port
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no port in {path} (exit code {proc.poll()})")


def records(jsonl, event):
    """The records of `event` in a JSON-lines file ([] while it does not exist)."""
    if not os.path.exists(jsonl):
        return []
    with open(jsonl) as f:
        return [r for r in map(json.loads, f) if r.get("event") == event]
