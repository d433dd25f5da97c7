#!/usr/bin/env bash
# Aggregation experiments (issue 5, item 6): real federations on loopback through
# examples/fedavg/run.sh (2 shards, N clients, FedAvg on Fashion-MNIST, MLP 784-256-128-10, iid),
# each printing one JSON line on stdout (logs go to stderr and to --out):
#   (a) "aggregation_compression": the same rounds under each compressor (none, fp16, bf16, int8,
#       qsgd, topk 1% + error feedback, randomk 1%, sign, powersgd rank 2): the uplink bytes the
#       clients sent (payload bytes, from the round metrics) and the final test accuracy;
#   (b) "aggregation_attack": 20% of the clients push -scale x their honest delta
#       (client.attack = sign_flip, scale 5 by default: the FedAvg mean becomes about -0.2 x the
#       honest step: gradient ascent); final accuracy of fedavg, median, trimmed_mean and krum
#       (f = the number of attackers), and of the clean fedavg run. A run whose model diverges
#       (every update non-finite, refused, the round retried) is stopped and reported with
#       "diverged": true and the accuracy of its last evaluated round.
#
# Usage: bench/aggregation/experiments.sh [--bin DIR] [--out DIR] [--clients N] [--rounds R]
#                                         [--attack-scale S] [--only compression|attack] [--quick]
#   --quick: 5 clients, 1 round, a few runs: a smoke test of the script and the flags (CTest).
# Takes about 20 s per run on 2 cores with the defaults (10 clients, 10 rounds): ~5 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
bin="$root/build/bin"
out=""
clients=10
rounds=10
scale=5
only=""
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --attack-scale) scale=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "experiments.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$quick" = 1 ]; then
  clients=5
  rounds=1
fi
if [ -z "$out" ]; then
  out=$(mktemp -d -t cohort-agg-exp-XXXXXX)
fi
mkdir -p "$out"
git_rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
attackers=$(( clients / 5 ))  # 20%
[ "$attackers" -ge 1 ] || attackers=1

# run NAME [run.sh flags...]: one federation; its metrics land in $out/NAME/metrics.jsonl.
run() {
  local name=$1
  shift
  echo "experiments.sh: run $name" >&2
  timeout 300 "$root/examples/fedavg/run.sh" --bin "$bin" --out "$out/$name" \
    --clients "$clients" --shards 2 --rounds "$rounds" --insecure "$@" >"$out/$name.log" 2>&1 &
  local pid=$! status=0
  # A diverged model makes every update non-finite: the shards refuse them and the coordinator
  # retries the round for ever. Three such rounds end the run (reported as diverged).
  while kill -0 "$pid" 2>/dev/null; do
    local refused
    refused=$(grep -c 'closes with 0 complete updates' "$out/$name.log" 2>/dev/null || true)
    if [ "${refused:-0}" -ge 3 ]; then
      echo "experiments.sh: run $name diverged (every update non-finite); stopping it" >&2
      touch "$out/$name.diverged"
      kill "$pid" 2>/dev/null || true
      break
    fi
    sleep 1
  done
  wait "$pid" || status=$?
  if [ "$status" != 0 ]; then
    echo "experiments.sh: run $name failed (exit $status); its log ends:" >&2
    tail -n 5 "$out/$name.log" >&2
    return 1
  fi
}

# experiment NAME JSON-FIELDS [run.sh flags...]: runs NAME and sets $line to its JSON line (with
# "error" when the federation failed: the script goes on with the next run).
experiment() {
  local name=$1 fields=$2
  shift 2
  if run "$name" "$@"; then
    line=$(summary "$name" "$fields")
  elif [ -s "$out/$name/metrics.jsonl" ]; then  # e.g. a diverged model: report what it reached
    line=$(summary "$name" "$fields")
    if [ -e "$out/$name.diverged" ]; then
      line=$("$py" -c 'import json,sys; r=json.loads(sys.argv[1]); r["diverged"]=True; print(json.dumps(r))' "$line")
    else
      line=$("$py" -c 'import json,sys; r=json.loads(sys.argv[1]); r["error"]="run failed, see "+sys.argv[2]; print(json.dumps(r))' "$line" "$out/$name.log")
    fi
  else
    line=$("$py" -c 'import json,sys; r=json.loads(sys.argv[1]); r["error"]="run failed, see "+sys.argv[2]; print(json.dumps(r))' "$fields" "$out/$name.log")
  fi
}

# summary NAME JSON-FIELDS: the JSON line of a finished run.
summary() {
  "$py" - "$out/$1/metrics.jsonl" "$2" "$git_rev" "$clients" "$rounds" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = [r for r in rows if r.get("event") == "round"]
acc = [r["test_accuracy"] for r in rounds if "test_accuracy" in r]
rec = json.loads(sys.argv[2])
rec.update({
    "clients": int(sys.argv[4]), "rounds": len(rounds), "rounds_asked": int(sys.argv[5]),
    "final_accuracy": round(acc[-1], 4) if acc else None,
    "uplink_bytes": int(sum(r.get("uplink_bytes", 0) for r in rounds)),
    "total_bytes": int(sum(r.get("bytes", 0) for r in rounds)),
    "wall_seconds": round(rounds[-1]["wall_seconds"], 1) if rounds else None,
    "git": sys.argv[3],
})
print(json.dumps(rec))
PY
}

# ---- (a) compressors ---------------------------------------------------------------------
if [ "$only" != attack ]; then
  if [ "$quick" = 1 ]; then
    compressors="none topk fp16"
  else
    compressors="none fp16 bf16 int8 qsgd topk randomk sign powersgd"
  fi
  none_bytes=""
  for c in $compressors; do
    flags=(--client-flag "--compressor.name=$c")
    opts=""
    case "$c" in
      topk) flags+=(--client-flag --compressor.k_fraction=0.01 --client-flag --compressor.error_feedback=true)
            opts="k_fraction=0.01,error_feedback=true" ;;
      randomk) flags+=(--client-flag --compressor.k_fraction=0.01 --client-flag --compressor.error_feedback=true)
               opts="k_fraction=0.01,error_feedback=true" ;;
      qsgd) opts="s=255,bucket_size=512" ;;
      sign) opts="error_feedback=true" ;;
      powersgd) opts="rank=2,error_feedback=true" ;;
    esac
    experiment "compress-$c" "{\"bench\":\"aggregation_compression\",\"compressor\":\"$c\",\"options\":\"$opts\"}" \
      "${flags[@]}"
    bytes=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1]).get("uplink_bytes", 0))' "$line")
    [ "$c" = none ] && none_bytes=$bytes
    if [ -n "$none_bytes" ] && [ "$bytes" -gt 0 ]; then
      line=$("$py" -c 'import json,sys; r=json.loads(sys.argv[1]); r["uplink_reduction_vs_none"]=round(int(sys.argv[2])/r["uplink_bytes"],2); print(json.dumps(r))' "$line" "$none_bytes")
    fi
    echo "$line"
  done
fi

# ---- (b) sign-flipping attackers ----------------------------------------------------------
if [ "$only" != compression ]; then
  attack=()
  for ((i = 0; i < attackers; i++)); do
    attack+=(--client-flag-for "$i" --client.attack=sign_flip --client-flag-for "$i" "--client.attack_scale=$scale")
  done
  experiment "attack-clean-fedavg" "{\"bench\":\"aggregation_attack\",\"aggregator\":\"fedavg\",\"attackers\":0,\"attack\":\"none\"}"
  echo "$line"
  if [ "$quick" = 1 ]; then
    rules="fedavg krum"
  else
    rules="fedavg median trimmed_mean krum"
  fi
  for rule in $rules; do
    flags=(--server-flag "--aggregator.name=$rule")
    opts=""
    case "$rule" in
      krum) flags+=(--server-flag "--aggregator.f=$attackers"); opts="f=$attackers" ;;
      trimmed_mean) flags+=(--server-flag --aggregator.beta=0.2); opts="beta=0.2" ;;
    esac
    experiment "attack-$rule" "{\"bench\":\"aggregation_attack\",\"aggregator\":\"$rule\",\"options\":\"$opts\",\"attackers\":$attackers,\"attack\":\"sign_flip\",\"attack_scale\":$scale}" \
      "${flags[@]}" "${attack[@]}"
    echo "$line"
  done
fi
echo "experiments.sh: logs and metrics in $out" >&2
