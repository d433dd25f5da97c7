#!/usr/bin/env bash
# Secure aggregation's cost in cohort-sim: examples/sim/overhead_100.toml (mlp:784-128-10, 5
# local epochs of 10-sample batches, one shard, iid Fashion-MNIST), with server.secure_aggregation
# none, secagg and secagg+ at each cohort size (clients per round; sim.clients is 10x that, at
# least 1000, sample:60 partitions beyond 60,000 examples), ROUNDS rounds each (1000 per round:
# one). Prints one JSON line per (mode, cohort) with medians over the rounds:
#   {"bench":"secagg","mode":..,"clients_per_round":N,"sim_round_s":..,"secagg_s":..,
#    "wall_round_s":..,"bytes_per_round":..,"secagg_bytes_per_round":..,"secagg_bytes_per_client":..}
# sim_round_s is on the virtual clock (the stages charged as fleet_secagg.cc says); wall_round_s
# is this host's time for the whole federation (clients, coordinator and shard in one process).
# The key stages and the round wait up to an hour (secagg.stage_ms, sim.wall_deadline_ms): plain
# SecAgg at 1000 clients per round spends minutes of this host's time agreeing keys and masking.
# Usage: bench/secagg.sh [ROUNDS (3)] [COHORTS ("10 100 1000")] [MODES ("none secagg secagg+")]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bin"
rounds=${1:-3}
cohorts=${2:-"10 100 1000"}
modes=${3:-"none secagg secagg+"}
[ -x "$bin/cohort-sim" ] || { echo "secagg: build cohort-sim first" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
for n in $cohorts; do
  clients=$((n * 10 < 1000 ? 1000 : n * 10))
  partition=iid
  [ "$clients" -gt 60000 ] && partition=sample:60
  r=$rounds
  [ "$n" -ge 1000 ] && r=1
  for mode in $modes; do
    m="$out/$mode-$n.jsonl"
    "$bin/cohort-sim" --config "$here/../examples/sim/overhead_100.toml" --set sim.clients=$clients \
      --set server.clients_per_round=$n --set server.min_updates=$n --set server.rounds=$r \
      --set server.eval_every=0 --set data.partition=$partition \
      --set server.secure_aggregation=$mode --set sim.metrics_file="$m" --set sim.progress=false \
      $([ "$mode" = none ] || echo --set secagg.stage_ms=3600000 --set sim.wall_deadline_ms=3600000) \
      >/dev/null 2>"$out/log" || {
      # A run that fails says why in its line, and the others still run.
      /usr/bin/python3 -c 'import json,sys; print(json.dumps({"bench": "secagg", "mode": sys.argv[1], "clients_per_round": int(sys.argv[2]), "error": sys.argv[3], "cpu": sys.argv[4]}))' \
        "$mode" "$n" "$(grep -v '^\s*$' "$out/log" | tail -1)" "$cpu"
      continue
    }
    /usr/bin/python3 - "$m" "$mode" "$n" "$cpu" <<'PY'
import json, statistics, sys
path, mode, n, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(path) if '"sim_round"' in l]
med = lambda k: statistics.median(r.get(k, 0) for r in rows)
print(json.dumps({"bench": "secagg", "mode": mode, "clients_per_round": n, "rounds": len(rows),
                  "sim_round_s": round(med("sim_round_seconds"), 4),
                  "secagg_s": round(med("secagg_seconds"), 4),
                  "wall_round_s": round(med("wall_round_seconds"), 3),
                  "bytes_per_round": int(med("bytes")),
                  "secagg_bytes_per_round": int(med("secagg_bytes")),
                  "secagg_bytes_per_client": int(med("secagg_bytes") / n),
                  "committed": all(r["committed"] for r in rows), "cpu": cpu}))
PY
  done
done
