#!/usr/bin/env bash
# Decentralized training with real processes on loopback: a rendezvous-only cohort-server
# (server.mode = decentralized: registration, membership, topology; no parameter server) and N
# cohort-client --mode decentralized peers that gossip with their neighbours directly, over mutual
# TLS with certificates made by cohort-keygen in a temporary folder. Each peer prints one JSON
# line with its test accuracy; the coordinator prints a summary line.
#
# Usage: examples/decentralized/run.sh [--bin DIR] [--peers N] [--algorithm A] [--topology T]
#                                      [--steps S] [--lr LR] [--partition SPEC] [--insecure]
#                                      [--kill I@SECONDS] [--server-flag FLAG]...
#   A: dpsgd, dsgdm, dsgdm_n, qg_dsgdm, qg_dsgdm_n, choco, push_sum, ring_allreduce
#   T: ring, torus, exponential, one_peer_exponential, complete, random_regular, time_varying
#   --kill I@SECONDS kills peer I after SECONDS (the others drop it and go on).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../../build/bin"
peers=8
algorithm=qg_dsgdm
topology=ring
steps=1000
lr=0.05
partition=dirichlet:0.1
insecure=0
kill_spec=""
server_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --algorithm) algorithm=$2; shift 2 ;;
    --topology) topology=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --kill) kill_spec=$2; shift 2 ;;
    --server-flag) server_flags+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in cohort-server cohort-client cohort-keygen; do
  [ -x "$bin/$b" ] || { echo "run.sh: $bin/$b not found; build first (cmake --build build)" >&2; exit 2; }
done
work=$(mktemp -d -t cohort-decentralized-XXXXXX)
chmod 700 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

if [ "$insecure" = 1 ]; then
  tls_for() { echo "--insecure"; }
else
  "$bin/cohort-keygen" ca --out "$work/ca" >/dev/null
  "$bin/cohort-keygen" node --ca "$work/ca" --name shard-0 --out "$work/certs" >/dev/null
  for ((i = 0; i < peers; i++)); do "$bin/cohort-keygen" node --ca "$work/ca" --name "peer-$i" --out "$work/certs" >/dev/null; done
  tls_for() { echo "--tls.ca_file=$work/ca/ca.pem --tls.cert_file=$work/certs/$1.pem --tls.key_file=$work/certs/$1.key"; }
fi

# shellcheck disable=SC2046
"$bin/cohort-server" --server.mode=decentralized --listen 'tcp://127.0.0.1:*' --port-file "$work/port" \
  --decentralized.peers="$peers" --decentralized.algorithm="$algorithm" \
  --decentralized.topology="$topology" --decentralized.steps="$steps" --decentralized.lr="$lr" \
  --decentralized.partition="$partition" --server.heartbeat_ms=500 --server.client_timeout_ms=10000 \
  ${server_flags[@]+"${server_flags[@]}"} $(tls_for shard-0) --log-level warn &
pids+=($!)
server=$!
for _ in $(seq 1 200); do [ -s "$work/port" ] && break; sleep 0.05; done
[ -s "$work/port" ] || { echo "run.sh: the coordinator did not start" >&2; exit 1; }
coordinator="tcp://127.0.0.1:$(cat "$work/port")"
declare -A peer_pid=()
for ((i = 0; i < peers; i++)); do
  # shellcheck disable=SC2046
  "$bin/cohort-client" --mode decentralized --server "$coordinator" --name "peer-$i" \
    $(tls_for "peer-$i") --log-level warn 2>"$work/peer-$i.log" &
  pids+=($!)
  peer_pid[$i]=$!
done
echo "cohort: $peers peers on a $topology ($([ "$insecure" = 1 ] && echo plaintext || echo mutual TLS)), $algorithm, $steps steps, partition $partition"
if [ -n "$kill_spec" ]; then
  victim=${kill_spec%@*}
  ( sleep "${kill_spec#*@}"; kill -9 "${peer_pid[$victim]}" 2>/dev/null && echo "killed peer-$victim" ) &
fi
status=0
wait "$server" || status=$?
[ "$status" = 0 ] || { echo "run.sh: the coordinator failed (exit $status)" >&2; tail -n 5 "$work"/*.log >&2 || true; }
exit "$status"
