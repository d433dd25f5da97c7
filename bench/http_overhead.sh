#!/usr/bin/env bash
# What serving /metrics and the dashboard costs the main job: examples/fedavg/run.sh (2 shards, 10
# clients, mutual TLS, Fashion-MNIST) with server.http = off, and with the endpoint on while a
# scraper reads it as hard as the dashboard and Prometheus together would: /metrics every second,
# and /api/v1/status plus /api/v1/rounds?since=N every 1.5 s (the page's poll). The two runs
# alternate PAIRS times. Prints one JSON line per run and a summary:
#   {"bench":"http_overhead","http":"off"|"on","round_s_mean":..,"rounds":..,"requests":..}
#   {"bench":"http_overhead","summary":true,"off_round_s":..,"on_round_s":..,"overhead":..}
# round_s_mean is the mean of metrics.jsonl's round_seconds over rounds 2..R (round 1 includes
# start-up); overhead = on / off - 1, from the medians over the pairs.
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

# Reads the endpoint until the port file's federation is gone; counts requests in $1.
scrape() {
  local count=$1 port=$2 n=0 tick=0 since=0
  while :; do
    curl -sf -o /dev/null "http://127.0.0.1:$port/metrics" || [ $n -eq 0 ] || break
    n=$((n + 1))
    if [ $((tick % 3)) -ne 1 ]; then
      curl -sf -o /dev/null "http://127.0.0.1:$port/api/v1/status" && n=$((n + 1))
      since=$(curl -sf "http://127.0.0.1:$port/api/v1/rounds?since=$since" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["next"])' || echo "$since")
      n=$((n + 1))
    fi
    echo "$n" > "$count"
    tick=$((tick + 1))
    sleep 0.5
  done
}

run() {  # run MODE I: one main job, prints its JSON line
  local mode=$1 i=$2 dir="$out/$1-$2" requests=0
  mkdir -p "$dir"
  local flags=(--server-flag --server.http=off)
  if [ "$mode" = on ]; then
    flags=(--server-flag --server.http=127.0.0.1:0 --server-flag "--server.http_port_file=$dir/http")
  fi
  "$here/../examples/fedavg/run.sh" --bin "$bin" --out "$dir" --rounds "$rounds" "${flags[@]}" \
    > "$dir/run.log" 2>&1 &
  local job=$!
  if [ "$mode" = on ]; then
    for _ in $(seq 1 600); do [ -s "$dir/http" ] && break; sleep 0.1; done
    [ -s "$dir/http" ] || { echo "http_overhead: no endpoint" >&2; cat "$dir/run.log" >&2; exit 1; }
    scrape "$dir/count" "$(cat "$dir/http")" &
    scraper=$!
  fi
  wait "$job" || { echo "http_overhead: the main job failed" >&2; tail -20 "$dir/run.log" >&2; exit 1; }
  if [ -n "$scraper" ]; then
    kill "$scraper" 2> /dev/null || true
    wait "$scraper" 2> /dev/null || true
    scraper=
    requests=$(cat "$dir/count" 2> /dev/null || echo 0)
  fi
  python3 - "$dir/metrics.jsonl" "$mode" "$requests" "$cpu" << 'PY'
import json, sys
rs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "round"]
secs = [r["round_seconds"] for r in rs if r["round"] >= 2]
print(json.dumps({"bench": "http_overhead", "http": sys.argv[2],
                  "round_s_mean": sum(secs) / len(secs), "rounds": len(rs),
                  "requests": int(sys.argv[3]), "cpu": sys.argv[4]}))
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
                  "pairs": len(lines) // 2, "cpu": lines[0]["cpu"]}))
PY
