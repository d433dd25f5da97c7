#!/usr/bin/env bash
# What serving /metrics and the dashboard costs the main job: examples/fedavg/run.sh (2 shards, 10
# clients, mutual TLS, Fashion-MNIST) with server.http = off, and with the endpoint on (shard 0,
# 127.0.0.1:9100, which must be free) while a scraper reads it twice a second: /metrics every
# time, /api/v1/status and /api/v1/rounds?since=N two times in three (more than a dashboard and
# Prometheus together). The two runs alternate PAIRS times. Prints one JSON line per run and a
# summary:
#   {"bench":"http_overhead","http":"off"|"on","round_s_mean":..,"rounds":..,"requests":..,
#    "train_s":..,"http_cpu_s":..,"refresh_s":..,"cost_share":..}
#   {"bench":"http_overhead","summary":true,"off_round_s":..,"on_round_s":..,"overhead":..,
#    "cost_share_max":..}
# round_s_mean is the mean of metrics.jsonl's round_seconds over rounds 2..R (round 1 includes
# start-up); overhead = on / off - 1 from the medians over the pairs (on a shared 2-core host this
# is mostly noise). The direct measure is cost_share: the CPU time of shard 0's "cohort-http"
# threads (from /proc) plus the time its message loop spent refreshing the figures
# (cohort_telemetry_refresh_seconds_total), over the training's wall time (the sum of
# round_seconds): the share of the round time serving could take if all of it fell on the
# critical path.
# Usage: bench/http_overhead.sh [PAIRS (3)] [ROUNDS (20)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bin"
pairs=${1:-3}
rounds=${2:-20}
for b in cohort-server cohort-client cohort-keygen; do
  [ -x "$bin/$b" ] || { echo "http_overhead: build $b first" >&2; exit 2; }
done
command -v curl > /dev/null || { echo "http_overhead: needs curl" >&2; exit 2; }
out=$(mktemp -d)
scraper=
cleanup() {
  [ -n "$scraper" ] && kill "$scraper" 2> /dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)

# Reads the endpoint on port $2 of process $3 until the federation is gone, from one Python
# process (light next to the job); writes "requests http_cpu_s refresh_s" to $1 as it goes.
scrape() {
  python3 - "$@" << 'PY'
import glob, json, re, sys, time, urllib.request
out, port, pid = sys.argv[1], sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"
n = tick = since = 0
cpu = refresh = 0.0
def fetch(path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return r.read().decode()
while True:
    try:
        text = fetch("/metrics")
    except OSError:
        if n == 0:
            time.sleep(0.1)
            continue
        break
    n += 1
    m = re.search(r'^cohort_telemetry_refresh_seconds_total\{shard="0"\} (\S+)$', text, re.M)
    refresh = float(m.group(1)) if m else refresh
    if tick % 3 != 1:
        try:
            fetch("/api/v1/status")
            since = json.loads(fetch(f"/api/v1/rounds?since={since}"))["next"]
            n += 2
        except OSError:
            break
    total = 0
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            if open(t + "/comm").read().strip() == "cohort-http":
                total += int(open(t + "/schedstat").read().split()[0])
        except OSError:
            pass
    cpu = max(cpu, total / 1e9)
    with open(out, "w") as f:
        f.write(f"{n} {cpu} {refresh}\n")
    tick += 1
    time.sleep(0.5)
PY
}

run() {  # run MODE I: one main job, prints its JSON line
  local mode=$1 i=$2 dir="$out/$1-$2" stats="0 0 0"
  mkdir -p "$dir"
  local flags=(--server-flag --server.http=off)
  [ "$mode" = on ] && flags=()  # the default: shard 0 on 127.0.0.1:9100
  "$here/../examples/fedavg/run.sh" --bin "$bin" --out "$dir" --rounds "$rounds" "${flags[@]}" \
    > "$dir/run.log" 2>&1 &
  local job=$!
  if [ "$mode" = on ]; then
    local pid=
    for _ in $(seq 1 600); do
      pid=$(ss -ltnpH 'sport = :9100' 2> /dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
      [ -n "$pid" ] && break
      sleep 0.1
    done
    [ -n "$pid" ] || { echo "http_overhead: no endpoint on 9100" >&2; cat "$dir/run.log" >&2; exit 1; }
    scrape "$dir/count" 9100 "$pid" &
    scraper=$!
  fi
  wait "$job" || { echo "http_overhead: the main job failed" >&2; tail -20 "$dir/run.log" >&2; exit 1; }
  if [ -n "$scraper" ]; then
    kill "$scraper" 2> /dev/null || true
    wait "$scraper" 2> /dev/null || true
    scraper=
    stats=$(cat "$dir/count" 2> /dev/null || echo "0 0 0")
  fi
  python3 - "$dir/metrics.jsonl" "$mode" "$cpu" $stats << 'PY'
import json, sys
rs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "round"]
secs = [r["round_seconds"] for r in rs if r["round"] >= 2]
train = sum(r["round_seconds"] for r in rs)
requests, http_cpu, refresh = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
print(json.dumps({"bench": "http_overhead", "http": sys.argv[2],
                  "round_s_mean": sum(secs) / len(secs), "rounds": len(rs),
                  "requests": requests, "train_s": train, "http_cpu_s": http_cpu,
                  "refresh_s": refresh, "cost_share": (http_cpu + refresh) / train,
                  "cpu": sys.argv[3]}))
PY
}

for i in $(seq 1 "$pairs"); do
  run off "$i" | tee -a "$out/lines"
  run on "$i" | tee -a "$out/lines"
done
python3 - "$out/lines" << 'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
off = statistics.median(l["round_s_mean"] for l in lines if l["http"] == "off")
on = statistics.median(l["round_s_mean"] for l in lines if l["http"] == "on")
print(json.dumps({"bench": "http_overhead", "summary": True, "off_round_s": off,
                  "on_round_s": on, "overhead": on / off - 1,
                  "cost_share_max": max(l["cost_share"] for l in lines if l["http"] == "on"),
                  "pairs": len(lines) // 2, "cpu": lines[0]["cpu"]}))
PY
