#!/usr/bin/env python3
"""A stand-in for cohort-server's HTTP endpoint (docs/HTTP_API.md), for working on the dashboard
page and for testing it without the server (the CTest dashboard_page).

Serves the page (observe/dashboard/index.html), its script, Chart.js from Debian's libjs-chart.js
and synthetic /api/v1/status and /api/v1/rounds data that grows by one round every
1/--rounds-per-second seconds until --rounds rounds, after which the state is "finished".
Python standard library only.

  dashboard_fake_server.py [--port 0] [--rounds 30] [--rounds-per-second 1] [--clients 8]
                           [--shards 2] [--port-file FILE] [--chart-js PATH] [--dashboard-dir DIR]

Binds 127.0.0.1 only. With --port 0 the kernel picks a free port; the line "listening on
http://127.0.0.1:PORT/" on stdout (and PORT in --port-file, when given) tells which. Stops on
SIGTERM or SIGINT, and by itself after --max-seconds (default 600).
"""

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DASHBOARD_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "observe", "dashboard"))
DEFAULT_CHART_JS = "/usr/share/javascript/chart.js/chart.min.js"
MAX_ROUNDS_PER_REPLY = 1000
CLIENT_STATES = ("training", "idle", "selected", "reporting")


class Run:
    """Synthetic, deterministic run data: everything is a function of the elapsed time."""

    def __init__(self, rounds, rounds_per_second, clients=8, shards=2):
        self.rounds = rounds
        self.rate = rounds_per_second
        self.clients = clients
        self.shards = shards
        self.started = time.monotonic()

    def committed(self):
        elapsed = time.monotonic() - self.started
        return min(self.rounds, int(elapsed * self.rate))

    def round_record(self, r):
        accuracy = 0.95 - 0.85 * math.exp(-r / 6.0) + 0.01 * math.sin(r)
        train_loss = 0.15 + 2.2 * math.exp(-r / 5.0) + 0.02 * math.cos(r)
        train_seconds = 0.8 + 0.1 * math.sin(r / 2.0)
        comm_seconds = 0.25 + 0.05 * math.cos(r / 3.0)
        bytes_all = 1.6e6 + 5e4 * math.sin(r)
        record = {
            "round": r, "round_id": r + 2, "clients": 4, "selected": 4,
            "train_loss": round(train_loss, 4), "bytes": round(bytes_all),
            "uplink_bytes": round(bytes_all / 2), "round_seconds": round(train_seconds + comm_seconds, 3),
            "train_seconds": round(train_seconds, 3), "comm_seconds": round(comm_seconds, 3),
            "wall_seconds": round(r / self.rate, 3),
        }
        if r % 3 != 2:  # evaluated on two rounds in three: the page must bridge the gaps
            record["test_accuracy"] = round(accuracy, 4)
            record["test_loss"] = round(train_loss * 1.1 + 0.03, 4)
        return record

    def status(self):
        committed = self.committed()
        state = "waiting" if committed == 0 else "finished" if committed >= self.rounds else "running"
        latest = {"round": committed}
        if committed > 0:
            last_measured = next(r for r in range(committed, 0, -1) if r % 3 != 2 or r == 1)
            record = self.round_record(last_measured)
            latest["test_accuracy"] = record.get("test_accuracy")
            latest["test_loss"] = record.get("test_loss")
            latest["train_loss"] = self.round_record(committed)["train_loss"]
            latest = {k: v for k, v in latest.items() if v is not None}
        clients = []
        for i in range(self.clients):
            unreachable = i == self.clients - 1 and committed > 3
            client = {
                "name": f"client-{i}",
                "state": "unreachable" if unreachable else
                         "idle" if state == "finished" else CLIENT_STATES[(i + committed) % 4],
                "last_round": max(0, committed - (i % 3)) if not unreachable else 3,
                "rounds": max(0, committed - i // 2) if not unreachable else 3,
                "throughput_bytes_per_second": 1.1e7 + 7.3e5 * i,
                "samples_per_second": 2800.0 + 150.0 * i,
            }
            if i % 4 != 3:  # "assigned" may be absent
                client["assigned"] = {"batch_size": 32 * (1 + i % 2), "local_steps": 40 + 5 * i}
            clients.append(client)
        shards = [{
            "shard": s, "received_bytes": int(committed * 8.1e5 + s * 1000),
            "sent_bytes": int(committed * 7.9e5 + s * 500), "resident_memory_bytes": 7.8e7 + s * 2.1e6,
            "tls_handshakes": self.clients, "records_dropped": 0,
        } for s in range(self.shards)]
        return {
            "source": "cohort-server", "version": "0.1.0", "mode": "federated", "state": state,
            "model": "mlp:784-128-10", "rounds_planned": self.rounds, "rounds_committed": committed,
            "rounds_failed": committed // 10,
            "uptime_seconds": round(time.monotonic() - self.started, 1),
            "latest": latest, "clients": clients, "shards": shards,
            "refusals": {"stale": committed // 4, "malformed": 0, "wrong_shape": committed // 9},
        }

    def rounds_after(self, since):
        last = min(self.committed(), since + MAX_ROUNDS_PER_REPLY)
        records = [self.round_record(r) for r in range(since + 1, last + 1)]
        return {"rounds": records, "next": last if records else since}


def make_handler(run, dashboard_dir, chart_js):
    files = {
        "/": (os.path.join(dashboard_dir, "index.html"), "text/html; charset=utf-8"),
        "/static/dashboard.js": (os.path.join(dashboard_dir, "dashboard.js"),
                                 "text/javascript; charset=utf-8"),
        "/static/chart.js": (chart_js, "text/javascript; charset=utf-8"),
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # quiet: a test's output should show the test
            pass

        def reply(self, status, body, content_type):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def reply_json(self, status, value):
            self.reply(status, json.dumps(value).encode(), "application/json")

        def do_GET(self):
            url = urlsplit(self.path)
            if url.path in files:
                path, content_type = files[url.path]
                with open(path, "rb") as f:  # read per request: edits show on reload
                    self.reply(200, f.read(), content_type)
            elif url.path == "/api/v1/status":
                self.reply_json(200, run.status())
            elif url.path == "/api/v1/rounds":
                values = parse_qs(url.query).get("since", ["0"])
                if len(values) != 1 or not values[0].isdigit():
                    self.reply_json(400, {"error": "since must be a non-negative integer"})
                    return
                self.reply_json(200, run.rounds_after(int(values[0])))
            else:
                self.reply_json(404, {"error": f"no such path: {url.path}"})

        def refuse_method(self):
            self.reply_json(405, {"error": "only GET is served"})

        do_POST = do_PUT = do_DELETE = do_PATCH = refuse_method

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rounds-per-second", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--port-file")
    parser.add_argument("--chart-js", default=DEFAULT_CHART_JS)
    parser.add_argument("--dashboard-dir", default=DEFAULT_DASHBOARD_DIR)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args()
    for path in (args.chart_js, os.path.join(args.dashboard_dir, "index.html")):
        if not os.path.isfile(path):
            hint = " (Debian package libjs-chart.js)" if path == args.chart_js else ""
            sys.exit(f"dashboard_fake_server: {path} is missing{hint}")

    run = Run(args.rounds, args.rounds_per_second, args.clients, args.shards)
    server = ThreadingHTTPServer(("127.0.0.1", args.port),
                                 make_handler(run, args.dashboard_dir, args.chart_js))
    server.daemon_threads = True
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"listening on http://127.0.0.1:{port}/", flush=True)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    timer = threading.Timer(args.max_seconds, stop)
    timer.daemon = True
    timer.start()
    server.serve_forever(poll_interval=0.2)
    server.server_close()


if __name__ == "__main__":
    main()
