#!/usr/bin/env python3
"""cohort-server's HTTP endpoint over a whole federation (2 shards, 3 clients, mutual TLS).

While it trains: /metrics parses as Prometheus exposition text (prometheus_client's parser, from
the test venv, plus strict checks of our own: HELP and TYPE before every family's samples, names
and units as Prometheus wants them), with every family the endpoint documents; bad requests get
errors (unknown path, a write, a bad query, a 64 KiB header, clients that send half a request and
stall) and training goes on; the dashboard, opened in headless Chromium (dashboard_test.py), shows
curves for at least two rounds. After the last round (server.http_linger_ms keeps the endpoint up):
the counters and gauges agree with metrics.jsonl, and /api/v1/rounds returns its round records.
Exits non-zero on any failure; every process it starts is killed.
"""
import argparse
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from procs import Processes, records

ROUNDS = 8
FAILURES = []

FAMILIES = [
    "cohort_rounds_committed_total", "cohort_rounds_failed_total",
    "cohort_round_duration_seconds", "cohort_round_train_seconds", "cohort_round_comm_seconds",
    "cohort_clients", "cohort_train_loss", "cohort_test_loss", "cohort_test_accuracy",
    "cohort_dp_epsilon", "cohort_updates_accepted_total", "cohort_updates_refused_total",
    "cohort_received_bytes_total", "cohort_sent_bytes_total", "cohort_push_bytes_total",
    "cohort_pull_bytes_total", "cohort_push_throughput_bytes_per_second",
    "cohort_pull_throughput_bytes_per_second", "cohort_tls_handshakes_total",
    "cohort_tls_handshake_failures_total", "cohort_records_dropped_total",
    "cohort_checkpoint_age_seconds", "cohort_checkpoint_failures_total",
    "cohort_process_resident_memory_bytes", "cohort_telemetry_refresh_seconds_total",
]
PER_SHARD = [f for f in FAMILIES if f.startswith(("cohort_received", "cohort_sent",
                                                   "cohort_push", "cohort_pull", "cohort_tls",
                                                   "cohort_records", "cohort_checkpoint",
                                                   "cohort_process", "cohort_updates_accepted"))]


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print("FAIL: " + what, file=sys.stderr, flush=True)
    return ok


def get(url, timeout=10, method="GET", headers=None, data=None):
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def strict_parse(text):
    """Our own strict reading of the exposition format: {family: [(name, labels, value)]}."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    helped, typed, samples = set(), {}, {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$')
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split(" ")[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            typed[name] = kind
            check(name in helped, f"TYPE before HELP for {name}")
            if kind == "counter":
                check(name.endswith("_total"), f"counter {name} does not end in _total")
        elif line:
            m = line_re.match(line)
            if not check(m is not None, f"not an exposition line: {line!r}"):
                continue
            name, value = m.group(1), float(m.group(4))
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
            check(base in typed, f"sample {name} before its family's TYPE")
            check(name.startswith("cohort_"), f"{name} has no cohort_ prefix")
            check(not math.isnan(value), f"{name} is NaN")
            samples.setdefault(base, []).append((name, m.group(3) or "", value))
    return families, typed, samples


def one(samples, family, labels=""):
    vals = [v for n, l, v in samples.get(family, []) if l == labels and n == family]
    return vals[0] if len(vals) == 1 else None


def wait_file(path, proc, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"no {path} (exit code {proc.poll()})")


def keys(bins, work):
    pki = os.path.join(work, "pki")
    os.makedirs(pki)
    names = ["shard-0", "shard-1"] + [f"client-{i}" for i in range(3)]
    subprocess.run([bins.keygen, "ca", "--out", pki], check=True, timeout=120,
                   capture_output=True)
    for n in names:
        subprocess.run([bins.keygen, "node", "--ca", pki, "--name", n, "--out", pki], check=True,
                       timeout=120, capture_output=True)
    return pki


def https(pki, port):
    """A non-loopback endpoint: HTTPS only, TLS 1.3, with the shard's own certificate."""
    import ssl
    ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.pem"))
    ctx.check_hostname = False  # the certificate names the node (shard-1), not an address
    with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw) as tls:
            check(tls.version() == "TLSv1.3", f"shard 1's endpoint speaks {tls.version()}")
            cn = dict(x[0] for x in tls.getpeercert()["subject"]).get("commonName")
            check(cn == "shard-1", f"shard 1's endpoint shows the certificate of {cn}")
            tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = b""
            while len(reply) < 1 << 20:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                reply += chunk
    text = reply.decode(errors="replace")
    check(text.startswith("HTTP/1.1 200") and 'cohort_sent_bytes_total{shard="1"}' in text,
          f"https /metrics on shard 1: {text[:200]!r}")
    try:
        code, _, _ = get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        check(False, f"plain HTTP to a non-loopback endpoint got {code}")
    except (urllib.error.URLError, ConnectionError, OSError, http.client.HTTPException):
        pass
    print("shard 1: HTTPS (TLS 1.3) with its own certificate; plain HTTP refused", flush=True)


def bad_requests(base):
    """Errors for bad requests; the stalled sockets are returned open (closed by the caller)."""
    code, ctype, body = get(base + "/no/such/path")
    check(code == 404 and "application/json" in ctype and "error" in json.loads(body),
          f"unknown path: {code} {ctype} {body[:200]}")
    code, _, _ = get(base + "/api/v1/status", method="POST", data=b"{}")
    check(code == 405, f"POST /api/v1/status: {code}")
    code, _, _ = get(base + "/metrics", method="DELETE")
    check(code == 405, f"DELETE /metrics: {code}")
    code, _, _ = get(base + "/api/v1/rounds?since=abc")
    check(code == 400, f"since=abc: {code}")
    try:
        code, _, _ = get(base + "/metrics", headers={"X-Huge": "a" * 65536})
        check(code in (400, 413, 431), f"64 KiB header: {code}")
    except (urllib.error.URLError, ConnectionError, OSError):
        pass  # the server closed the connection on the oversized header: also an error
    host, port = base.split("//")[1].split(":")
    stalled = []
    for _ in range(4):  # half as many as the endpoint has threads
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        stalled.append(s)
    return stalled


def run(bins, work):
    pki = keys(bins, work)
    procs = Processes(work)
    metrics = os.path.join(work, "metrics.jsonl")
    tls = lambda n: [f"--tls.ca_file={pki}/ca.pem", f"--tls.cert_file={pki}/{n}.pem",
                     f"--tls.key_file={pki}/{n}.key"]
    common = ["--model.spec=mlp:784-64-10", f"--server.rounds={ROUNDS}",
              "--server.clients_per_round=3", "--server.min_clients=3",
              "--server.round_deadline_ms=60000", "--train.epochs=5"]
    try:
        s0 = procs.start("shard-0", [bins.server, "--shard", "0", "--shards", "2", "--listen",
                                     "tcp://127.0.0.1:*", "--port-file", f"{work}/port-0",
                                     f"--server.metrics_file={metrics}",
                                     "--server.http=127.0.0.1:0",
                                     f"--server.http_port_file={work}/http-port",
                                     "--server.http_linger_ms=60000"] + common + tls("shard-0"))
        coordinator = "tcp://127.0.0.1:" + wait_file(f"{work}/port-0", s0, 30)
        base = "http://127.0.0.1:" + wait_file(f"{work}/http-port", s0, 30)
        # Shard 1 serves on a non-loopback address (all interfaces): HTTPS with its certificate.
        s1 = procs.start("shard-1", [bins.server, "--shard", "1", "--shards", "2", "--listen",
                                     "tcp://127.0.0.1:*", "--coordinator", coordinator,
                                     "--server.metrics_file=", "--server.http=0.0.0.0:0",
                                     f"--server.http_port_file={work}/http-port-1"]
                         + common + tls("shard-1"))
        https(pki, wait_file(f"{work}/http-port-1", s1, 30))
        for i in range(3):
            procs.start(f"client-{i}", [bins.client, "--server", coordinator, "--name",
                                        f"client-{i}", "--data", "iid", "--part", f"{i}/3"]
                        + tls(f"client-{i}"))
        during(base, bins, work, metrics, s0, procs)
        after(base, metrics, s0, procs)
    finally:
        procs.close()


def during(base, bins, work, metrics, s0, procs):
    """Scrapes while it trains, sends bad requests, and opens the dashboard."""
    stalled = bad_requests(base)
    scrapes, deadline = 0, time.monotonic() + 240
    try:
        dash = subprocess.Popen(["/usr/bin/python3", bins.dashboard_test, "--url", base + "/",
                                 "--min-rounds", "2", "--timeout", "150",
                                 "--screenshot", bins.screenshot], start_new_session=True)
        while len(records(metrics, "round")) < ROUNDS and time.monotonic() < deadline:
            if not check(s0.poll() is None, f"shard 0 exited early:\n{procs.log('shard-0')}"):
                break
            code, ctype, text = get(base + "/metrics")
            check(code == 200 and ctype.startswith("text/plain; version=0.0.4"),
                  f"/metrics: {code} {ctype}")
            _, typed, _ = strict_parse(text)
            missing = [f for f in FAMILIES if f not in typed]
            check(not missing, f"/metrics lacks {missing}")
            scrapes += 1
            time.sleep(0.5)
        try:
            code = dash.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(dash.pid, signal.SIGKILL)
            code = dash.wait(timeout=30)
        check(code == 0, f"the dashboard test failed ({code})")
    finally:
        for s in stalled:
            s.close()
    check(scrapes >= 3, f"only {scrapes} scrapes while training")
    check(len(records(metrics, "round")) == ROUNDS,
          f"{len(records(metrics, 'round'))} rounds, want {ROUNDS}:\n{procs.log('shard-0')}")
    print(f"{scrapes} scrapes while training, all valid", flush=True)


def after(base, metrics, s0, procs):
    """The last scrape, in server.http_linger_ms, against metrics.jsonl."""
    deadline = time.monotonic() + 60
    while "training finished" not in procs.log("shard-0") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.5)  # one more refresh of the shards' figures (each second)
    rounds, failed = records(metrics, "round"), records(metrics, "round_failed")
    _, _, text = get(base + "/metrics")
    _, typed, samples = strict_parse(text)
    committed = one(samples, "cohort_rounds_committed_total")
    check(committed == len(rounds), f"rounds committed {committed} != {len(rounds)} records")
    failed_total = sum(v for _, _, v in samples.get("cohort_rounds_failed_total", []))
    check(failed_total == len(failed), f"rounds failed {failed_total} != {len(failed)} records")
    count = next(v for n, _, v in samples["cohort_round_duration_seconds"]
                 if n.endswith("_count"))
    total = next(v for n, _, v in samples["cohort_round_duration_seconds"] if n.endswith("_sum"))
    check(count == len(rounds), f"histogram count {count} != {len(rounds)}")
    want = sum(r["round_seconds"] for r in rounds)
    check(abs(total - want) < 1e-6 * max(1, want), f"histogram sum {total} != {want}")
    last = rounds[-1]
    for family, field in [("cohort_train_loss", "train_loss"), ("cohort_test_loss", "test_loss"),
                          ("cohort_test_accuracy", "test_accuracy"),
                          ("cohort_round_train_seconds", "train_seconds"),
                          ("cohort_round_comm_seconds", "comm_seconds")]:
        check(one(samples, family) == last[field],
              f"{family} {one(samples, family)} != the last record's {field} {last[field]}")
    updates = sum(r["clients"] for r in rounds)
    for shard in ("0", "1"):
        for family in PER_SHARD:
            check(any(l.startswith(f'shard="{shard}"') for _, l, _ in samples.get(family, [])),
                  f"{family} has no sample for shard {shard}")
        accepted = one(samples, "cohort_updates_accepted_total", f'shard="{shard}"')
        check(accepted == updates, f"shard {shard} accepted {accepted} updates, the records "
              f"say {updates}")
        hs = one(samples, "cohort_tls_handshakes_total", f'shard="{shard}"')
        check(hs is not None and hs >= 1, f"shard {shard}: {hs} TLS handshakes")
    code, _, body = get(base + "/api/v1/rounds?since=0")
    api = json.loads(body)
    check(code == 200 and [r["round"] for r in api["rounds"]] == [r["round"] for r in rounds],
          f"/api/v1/rounds: {code} {body[:300]}")
    check(api["next"] == rounds[-1]["round"], f"/api/v1/rounds next {api['next']}")
    for mine, theirs in zip(api["rounds"], rounds):
        theirs = {k: v for k, v in theirs.items() if k != "event"}
        check(mine == theirs, f"round {mine.get('round')}: API {mine} != record {theirs}")
    _, _, body = get(base + "/api/v1/status")
    status = json.loads(body)
    check(status["state"] == "finished" and status["rounds_committed"] == len(rounds),
          f"status: {status['state']} {status['rounds_committed']}")
    check(len(status["clients"]) == 3 and len(status["shards"]) == 2,
          f"status: {len(status['clients'])} clients, {len(status['shards'])} shards")
    print(f"after {len(rounds)} rounds: the counters agree with metrics.jsonl", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("server", "client", "keygen", "dashboard-test", "screenshot"):
        p.add_argument("--" + flag, required=True)
    bins = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cohort-http-") as work:
        try:
            run(bins, work)
        except Exception as e:  # noqa: BLE001 - any error fails the test, with its reason
            check(False, f"{type(e).__name__}: {e}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)", file=sys.stderr)
        return 1
    print("http endpoint: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
