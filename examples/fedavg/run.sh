#!/usr/bin/env bash
# The main job: a federation of real processes on loopback — 2 parameter-server shards and 10
# clients, mutual TLS with certificates made by cohort-keygen in a temporary folder, FedAvg on
# Fashion-MNIST (iid split) for 20 rounds. Shard 0 prints one progress line per round and writes
# metrics.jsonl (into --out, default the current folder).
#
# Usage: examples/fedavg/run.sh [--bin DIR] [--out DIR] [--clients N] [--shards S] [--rounds R]
#                               [--partition SPEC] [--insecure] [--server-flag FLAG]...
#                               [--client-flag FLAG]... [--client-flag-for I FLAG]...
#   --server-flag FLAG passes FLAG (e.g. --aggregator.name=median) to every shard, --client-flag
#   FLAG (e.g. --compressor.name=topk) to every client, --client-flag-for I FLAG to client I only.
#   --server-flag --server.mode=fedbuff (or dataparallel) runs that mode from fedbuff.toml (or
#   dataparallel.toml) beside this script; --rounds R is then R server steps (data-parallel: R
#   steps per worker).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../../build/bin"
out="$PWD"
clients=10
shards=2
rounds=""
partition=iid
insecure=0
server_flags=()
client_flags=()
declare -A client_flags_for=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --server-flag) server_flags+=("$2"); shift 2 ;;
    --client-flag) client_flags+=("$2"); shift 2 ;;
    --client-flag-for) client_flags_for[$2]="${client_flags_for[$2]:-} $3"; shift 3 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in cohort-server cohort-client cohort-keygen; do
  [ -x "$bin/$b" ] || { echo "run.sh: $bin/$b not found; build first (cmake --build build)" >&2; exit 2; }
done
mkdir -p "$out"
work=$(mktemp -d -t cohort-fedavg-XXXXXX)
chmod 700 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
# Each process's name and log, by pid: a process that fails is reported with its log at once.
declare -A name_of=() log_of=()
# Ctrl-C: show where every process was before the logs go (cleanup removes them at exit).
interrupted() {
  echo "run.sh: interrupted; the end of each log:" >&2
  for p in "${!log_of[@]}"; do
    [ -s "${log_of[$p]}" ] && { echo "--- ${name_of[$p]}" >&2; tail -n 5 "${log_of[$p]}" >&2; }
  done
  exit 130
}
trap cleanup EXIT
trap interrupted INT TERM

tls=()
if [ "$insecure" = 1 ]; then
  tls_for() { echo "--insecure"; }
else
  "$bin/cohort-keygen" ca --out "$work/ca" >/dev/null
  for ((i = 0; i < shards; i++)); do "$bin/cohort-keygen" node --ca "$work/ca" --name "shard-$i" --out "$work/certs" >/dev/null; done
  for ((i = 0; i < clients; i++)); do "$bin/cohort-keygen" node --ca "$work/ca" --name "client-$i" --out "$work/certs" >/dev/null; done
  tls_for() { echo "--tls.ca_file=$work/ca/ca.pem --tls.cert_file=$work/certs/$1.pem --tls.key_file=$work/certs/$1.key"; }
fi
# The server mode, from the flags (the last --server.mode wins, as in cohort-server): each mode
# has its own file, since the server refuses keys its mode cannot honour.
mode=federated
for ((k = 0; k < ${#server_flags[@]}; k++)); do
  case "${server_flags[$k]}" in
    --server.mode=*) mode=${server_flags[$k]#--server.mode=} ;;
    --server.mode) mode=${server_flags[$((k + 1))]:-federated} ;;
  esac
done
case "$mode" in
  federated) config="$here/fedavg.toml" ;;
  fedbuff|dataparallel) config="$here/$mode.toml" ;;
  *) echo "run.sh: server.mode '$mode' is not one this example runs (federated, fedbuff, dataparallel)" >&2; exit 2 ;;
esac
extra=("--server.min_clients=$clients")
case "$mode" in
  federated)
    [ -n "$rounds" ] && extra+=("--server.rounds=$rounds")
    extra+=("--server.clients_per_round=$clients")
    # A round still counts at its deadline with half the cohort (fedavg.toml's 5 assumes 10
    # clients; with fewer clients than that, no round could ever commit).
    extra+=("--server.min_updates=$(( (clients + 1) / 2 ))") ;;
  fedbuff)
    [ -n "$rounds" ] && extra+=("--server.rounds=$rounds")
    extra+=("--server.concurrency=$clients") ;;
  dataparallel)
    [ -n "$rounds" ] && extra+=("--server.steps=$rounds")
    extra+=("--server.clients_per_round=$clients") ;;
esac
extra+=(${server_flags[@]+"${server_flags[@]}"})

start=$(date +%s.%N)
# shellcheck disable=SC2046
"$bin/cohort-server" --config "$config" --shard 0 --shards "$shards" \
  --listen 'tcp://127.0.0.1:*' --port-file "$work/port" --server.metrics_file="$out/metrics.jsonl" \
  "${extra[@]}" $(tls_for shard-0) --log-level warn &
pids+=($!)
server0=$!
for _ in $(seq 1 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "run.sh: shard 0 did not start" >&2; exit 1; }
coordinator="tcp://127.0.0.1:$(cat "$work/port")"
for ((i = 1; i < shards; i++)); do
  # shellcheck disable=SC2046
  "$bin/cohort-server" --config "$config" --shard "$i" --shards "$shards" \
    --listen 'tcp://127.0.0.1:*' --coordinator "$coordinator" $(tls_for "shard-$i") \
    ${server_flags[@]+"${server_flags[@]}"} --log-level warn 2>"$work/shard-$i.log" &
  pids+=($!)
  name_of[$!]="shard $i"
  log_of[$!]="$work/shard-$i.log"
done
for ((i = 0; i < clients; i++)); do
  # shellcheck disable=SC2046
  # Standardized pixels (the training set's mean and deviation) learn better than [0, 1] at the
  # main job's learning rate; a --client-flag --data.scale=... given to run.sh wins (it comes later).
  "$bin/cohort-client" --server "$coordinator" --name "client-$i" --data "$partition" \
    --part "$i/$clients" $(tls_for "client-$i") --data.scale=standardize \
    ${client_flags[@]+"${client_flags[@]}"} \
    ${client_flags_for[$i]:-} --log-level warn 2>"$work/client-$i.log" &
  pids+=($!)
  name_of[$!]="client-$i"
  log_of[$!]="$work/client-$i.log"
done
# The banner names what really runs: the model of a --server-flag --model.spec=..., else the
# config's; the clients' own data file, else Fashion-MNIST.
model=$(sed -n 's/^spec *= *"\(.*\)".*/\1/p' "$config" | head -n 1)
data="Fashion-MNIST ($partition)"
for f in ${server_flags[@]+"${server_flags[@]}"}; do
  case "$f" in --model.spec=*) model=${f#--model.spec=} ;; esac
done
for f in ${client_flags[@]+"${client_flags[@]}"}; do
  case "$f" in --data.train=*) data=${f#--data.train=} ;; esac
done
echo "cohort: $shards shards + $clients clients on loopback ($([ "$insecure" = 1 ] && echo plaintext || echo mutual TLS)), server.mode $mode, model $model, data $data"
# Until shard 0 ends: any other process that exits with an error is reported at once, with the
# end of its log, instead of the run waiting out its round deadline.
status=0
live=("${pids[@]}")
while [ ${#live[@]} -gt 0 ]; do
  done_pid=""
  code=0
  wait -n -p done_pid "${live[@]}" || code=$?
  [ -n "$done_pid" ] || break
  if [ "$done_pid" = "$server0" ]; then
    status=$code
    break
  fi
  if [ "$code" != 0 ]; then
    echo "run.sh: ${name_of[$done_pid]} exited with status $code; the end of its log:" >&2
    tail -n 15 "${log_of[$done_pid]}" >&2
    exit 1
  fi
  rest=()
  for p in "${live[@]}"; do [ "$p" = "$done_pid" ] || rest+=("$p"); done
  live=(${rest[@]+"${rest[@]}"})
done
end=$(date +%s.%N)
if [ "$status" != 0 ]; then
  echo "run.sh: shard 0 failed (exit $status); client logs:" >&2
  tail -n 5 "$work"/*.log >&2 || true
  exit "$status"
fi
python3 - "$out/metrics.jsonl" "$start" "$end" <<'PY' || true
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rounds = [r for r in rows if r.get("event") == "round"]
acc = [r["test_accuracy"] for r in rounds if "test_accuracy" in r]
train = sum(r["train_seconds"] for r in rounds); comm = sum(r["comm_seconds"] for r in rounds)
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"done: {len(rounds)} rounds in {wall:.1f} s, final test accuracy {acc[-1]*100:.2f}%, "
      f"per round: local training {train/len(rounds):.2f} s, communication {comm/len(rounds):.2f} s; "
      f"metrics in {sys.argv[1]}")
PY
