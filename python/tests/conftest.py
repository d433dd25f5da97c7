"""A federation for the tests: keys from cohort.keygen_*, a cohort-server shard and cohort-client
processes over TLS on loopback, all killed when the test ends. ctest sets PYTHONPATH to the build
tree's python/ and COHORT_BIN_DIR to its bin/."""

import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

import cohort

BIN = pathlib.Path(os.environ.get("COHORT_BIN_DIR", pathlib.Path(__file__).parents[2] / "build" / "bin"))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Federation:
    def __init__(self, folder: pathlib.Path, names, server_args):
        self.dir = folder
        self.names = list(names)
        self.server_args = list(server_args)
        self.procs = []
        self.server = None
        self.url = None
        cohort.keygen_ca(str(folder / "ca"))
        for n in ["shard-0"] + self.names:
            cohort.keygen_node(str(folder / "ca"), n, str(folder / "certs"))

    def tls(self, name):
        return {
            "tls.ca_file": str(self.dir / "ca" / "ca.pem"),
            "tls.cert_file": str(self.dir / "certs" / f"{name}.pem"),
            "tls.key_file": str(self.dir / "certs" / f"{name}.key"),
        }

    @property
    def metrics(self):
        return self.dir / "metrics.jsonl"

    def start_server(self):
        args = [str(BIN / "cohort-server"), "--shard", "0", "--shards", "1",
                "--listen", "tcp://127.0.0.1:*", "--port-file", str(self.dir / "port"),
                f"--server.metrics_file={self.metrics}",
                f"--server.checkpoint_dir={self.dir / 'ckpt'}", "--log-level", "info"]
        args += [f"--{k}={v}" for k, v in self.tls("shard-0").items()] + self.server_args
        self.server = self._spawn(args, "server")
        port = self.dir / "port"
        try:
            wait_for(lambda: port.exists() and port.read_text().strip(), 20,
                     "the shard's port file")
        except AssertionError as e:
            raise AssertionError(f"{e}; the shard's log:\n{self.log('server')[-3000:]}") from None
        self.url = f"tcp://127.0.0.1:{port.read_text().strip()}"

    def start_cpp_client(self, name, part, extra=()):
        args = [str(BIN / "cohort-client"), "--server", self.url, "--name", name,
                "--data", "iid", "--part", part, "--log-level", "info"]
        args += [f"--{k}={v}" for k, v in self.tls(name).items()] + list(extra)
        return self._spawn(args, name)

    def client_options(self, name, **extra):
        o = {"client.server": self.url, "client.name": name, **self.tls(name)}
        o.update(extra)
        return o

    def _spawn(self, args, label):
        log = open(self.dir / f"{label}.log", "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def log(self, label):
        f = self.dir / f"{label}.log"
        return f.read_text() if f.exists() else ""

    def wait_server(self, timeout):
        try:
            return self.server.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not finish within {timeout} s:\n"
                                 + self.log("server")[-3000:])

    def records(self, event):
        if not self.metrics.exists():
            return []
        out = []
        for line in self.metrics.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("event") == event:
                    out.append(r)
        return out

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


@pytest.fixture
def federation(tmp_path):
    made = []

    def make(names, server_args):
        f = Federation(tmp_path, names, server_args)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


class ClientThread:
    """cohort.Client.run on a thread, so that a test can bound it in time."""

    def __init__(self, client, train, num_samples, **kw):
        self.client = client
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(train, num_samples, kw), daemon=True)
        self.thread.start()

    def _run(self, train, num_samples, kw):
        try:
            self.client.run(train, num_samples=num_samples, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def join(self, timeout):
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.client.stop()
            self.thread.join(10)
            raise AssertionError(f"cohort.Client.run did not return within {timeout} s")
        return self.error


def small_mlp_args(rounds, per_round, min_clients, extra=()):
    return ["--model.spec=mlp:784-32-10", f"--server.rounds={rounds}",
            f"--server.clients_per_round={per_round}", f"--server.min_clients={min_clients}",
            "--server.work=fixed", "--train.steps=2", "--server.round_deadline_ms=60000",
            *extra]
