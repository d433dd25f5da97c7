#!/usr/bin/env bash
# PyTorch clients beside C++ clients in one Cohort federation, over mutual TLS on loopback.
#
# Run 1 ("mixed"): one cohort-server shard, 2 cohort-client processes (Fashion-MNIST iid parts 0/4
# and 1/4) and 2 PyTorch clients (mlp_client.py: cohort.Client + cohort.torch.Trainer, parts 2/4
# and 3/4), FedAvg on mlp:784-256-128-10, 4 clients a round. Run 2 ("all-C++"): the same with 4
# cohort-client processes. Prints each round's line, then both runs' final accuracy, their
# difference, wall times, and the per-round times of a PyTorch and a C++ client from the
# server's metrics file. Exits 1 if the mixed run ends more than 1 point below the all-C++ one.
# --cnn then runs a third federation of 3 PyTorch clients training a BatchNorm CNN that the
# server knows only as a net: layer list of the same layout (cnn_client.py).
#
# Usage: examples/pytorch/run.sh [--build DIR] [--rounds N] [--steps S] [--cnn] [--cnn-only]
#                                [--timeout SECONDS] [--keep]
#   --build DIR    the build folder (default: build, beside examples/)
#   --rounds N     federated rounds of each run (default 5)
#   --steps S      local steps a round (default 0: one epoch, 469 batches of 32)
#   --cnn          also run the PyTorch-only CNN federation; --cnn-only: only that one
#   --timeout T    give up on a run after T seconds (default 600)
#   --keep         keep the temporary folder (keys, logs, metrics) and print its path
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../../build"
rounds=5
steps=0
cnn=0
mlp=1
run_timeout=600
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cnn) cnn=1; shift ;;
    --cnn-only) cnn=1; mlp=0; shift ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "run.sh: no build folder $build" >&2; exit 2; }
bin="$build/bin"
for b in cohort-server cohort-client cohort-keygen; do
  [ -x "$bin/$b" ] || { echo "run.sh: $bin/$b not found; build first" >&2; exit 2; }
done
compgen -G "$build/python/cohort/_cohort*.so" >/dev/null ||
  { echo "run.sh: $build/python/cohort/_cohort*.so not found: build the Python module" >&2; exit 2; }
python=/usr/bin/python3  # Debian's, with numpy and torch
[ -x "$python" ] || python=python3
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c 'import torch, numpy, cohort.torch' 2>/dev/null ||
  { echo "run.sh: $python cannot import torch, numpy and cohort.torch" >&2; exit 2; }

work=$(mktemp -d -t cohort-pytorch-XXXXXX)
chmod 700 "$work"
pids=()
# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in ${pids[@]+"${pids[@]}"}; do kill -9 "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then echo "run.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

# Keys: a CA, shard-0's certificate, and one per client name (the certificate's CN is the name).
"$bin/cohort-keygen" ca --out "$work/ca" >/dev/null
for name in shard-0 cpp-0 cpp-1 cpp-2 cpp-3 py-2 py-3 cnn-0 cnn-1 cnn-2; do
  "$bin/cohort-keygen" node --ca "$work/ca" --name "$name" --out "$work/certs" >/dev/null
done
tls() { echo "--tls.ca_file=$work/ca/ca.pem --tls.cert_file=$work/certs/$1.pem --tls.key_file=$work/certs/$1.key"; }
pytls() { echo "--ca $work/ca/ca.pem --cert $work/certs/$1.pem --key $work/certs/$1.key"; }

now_ms() { date +%s%3N; }

# federate LABEL MODEL_SPEC "TRAIN FLAGS" CLIENT...: one federation, CLIENT = cpp:NAME:I/N,
# py:NAME:I/N (mlp_client.py) or cnn:NAME:I/N (cnn_client.py). Writes $work/LABEL.jsonl and
# $work/LABEL.wall; returns non-zero (after printing the logs' ends) if any process failed.
federate() {
  local label=$1 spec=$2 train=$3
  shift 3
  local n=$#
  local server start end p kind name part code
  local -a cpids=() cnames=()
  rm -f "$work/$label.port"
  start=$(now_ms)
  # shellcheck disable=SC2046,SC2086
  "$bin/cohort-server" --shard 0 --shards 1 --listen 'tcp://127.0.0.1:*' \
    --port-file "$work/$label.port" --server.metrics_file="$work/$label.jsonl" \
    --model.spec="$spec" --model.seed=1 --server.rounds="$rounds" \
    --server.clients_per_round="$n" --server.min_clients="$n" --server.min_updates="$n" \
    --server.work=fixed --server.eval_every=1 --server.round_deadline_ms=120000 \
    --aggregator.name=fedavg $train $(tls shard-0) --log-level warn \
    > >(sed -u "s/^/[$label] /") 2>"$work/$label-server.log" &
  server=$!
  pids+=("$server")
  for _ in $(seq 1 300); do [ -s "$work/$label.port" ] && break; kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
  if [ ! -s "$work/$label.port" ]; then
    echo "run.sh: [$label] the server did not start:" >&2; tail -n 20 "$work/$label-server.log" >&2
    return 1
  fi
  local coord
  coord="tcp://127.0.0.1:$(cat "$work/$label.port")"
  for c in "$@"; do
    IFS=: read -r kind name part <<<"$c"
    # shellcheck disable=SC2046
    case "$kind" in
      cpp) "$bin/cohort-client" --server "$coord" --name "$name" --data iid --part "$part" \
             $(tls "$name") --log-level warn 2>"$work/$label-$name.log" & ;;
      py)  "$python" -B "$here/mlp_client.py" --server "$coord" --name "$name" --part "$part" \
             $(pytls "$name") 2>"$work/$label-$name.log" & ;;
      cnn) "$python" -B "$here/cnn_client.py" --server "$coord" --name "$name" --part "$part" \
             $(pytls "$name") 2>"$work/$label-$name.log" & ;;
    esac
    pids+=($!)
    cpids+=($!)
    cnames+=("$name")
  done
  echo "[$label] 1 shard + $n clients ($*) over mutual TLS, model $spec"
  # Until the server ends, bounded: a client that fails ends the run at once, with its log.
  local deadline
  deadline=$(( $(now_ms) + run_timeout * 1000 ))
  while kill -0 "$server" 2>/dev/null; do
    if [ "$(now_ms)" -gt "$deadline" ]; then
      echo "run.sh: [$label] not done after ${run_timeout}s; the end of each log:" >&2
      for name in server "${cnames[@]}"; do echo "--- $name" >&2; tail -n 5 "$work/$label-$name.log" >&2; done
      return 1
    fi
    for ((k = 0; k < ${#cpids[@]}; k++)); do
      p=${cpids[$k]}
      [ "$p" = 0 ] && continue
      kill -0 "$p" 2>/dev/null && continue
      code=0; wait "$p" || code=$?
      cpids[k]=0
      if [ "$code" != 0 ]; then
        echo "run.sh: [$label] ${cnames[$k]} exited with status $code; the end of its log:" >&2
        tail -n 15 "$work/$label-${cnames[$k]}.log" >&2
        return 1
      fi
    done
    sleep 0.2
  done
  end=$(now_ms)
  code=0; wait "$server" || code=$?
  if [ "$code" != 0 ]; then
    echo "run.sh: [$label] the server failed (exit $code):" >&2; tail -n 20 "$work/$label-server.log" >&2
    return 1
  fi
  echo "$(( end - start ))" >"$work/$label.wall"  # ms
  # The clients leave on the server's goodbye: 20 s at most, then they are stopped.
  for ((k = 0; k < ${#cpids[@]}; k++)); do
    p=${cpids[$k]}
    [ "$p" = 0 ] && continue
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$p" 2>/dev/null; then
      echo "run.sh: [$label] ${cnames[$k]} still runs 20 s after the server ended; stopping it" >&2
      kill "$p" 2>/dev/null || true
      continue
    fi
    code=0; wait "$p" || code=$?
    if [ "$code" != 0 ]; then
      echo "run.sh: [$label] ${cnames[$k]} exited with status $code after training:" >&2
      tail -n 15 "$work/$label-${cnames[$k]}.log" >&2
      return 1
    fi
  done
  sleep 0.5  # the server's last lines through sed
}

if [ "$steps" -gt 0 ]; then work_flag="--train.steps=$steps"; else work_flag="--train.epochs=1"; fi
train="--train.batch_size=32 --train.lr=0.05 --train.optimizer=sgd $work_flag"
status=0
if [ "$mlp" = 1 ]; then
  federate mixed mlp:784-256-128-10 "$train" cpp:cpp-0:0/4 cpp:cpp-1:1/4 py:py-2:2/4 py:py-3:3/4
  federate all-cpp mlp:784-256-128-10 "$train" cpp:cpp-0:0/4 cpp:cpp-1:1/4 cpp:cpp-2:2/4 cpp:cpp-3:3/4
fi
if [ "$cnn" = 1 ]; then
  cnn_spec=$("$python" -B "$here/cnn_client.py" --print-spec | cut -d' ' -f1)
  cnn_steps=$([ "$steps" -gt 0 ] && echo "$steps" || echo 100)
  federate cnn "$cnn_spec" "--train.batch_size=32 --train.lr=0.05 --train.momentum=0.9 --train.steps=$cnn_steps" \
    cnn:cnn-0:0/3 cnn:cnn-1:1/3 cnn:cnn-2:2/3
fi

"$python" - "$work" "$mlp" "$cnn" <<'PY' || status=$?
import json, os, statistics, sys

work, mlp, cnn = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"

def load(label):
    rows = [json.loads(l) for l in open(os.path.join(work, label + ".jsonl")) if l.strip()]
    rounds = [r for r in rows if r.get("event") == "round"]
    done = [r for r in rows if r.get("event") == "done"]
    acc = done[-1].get("final_accuracy") if done else None
    if acc is None:
        accs = [r["test_accuracy"] for r in rounds if "test_accuracy" in r]
        acc = accs[-1] if accs else float("nan")
    wall = float(open(os.path.join(work, label + ".wall")).read()) / 1000
    clients = [r for r in rows if r.get("event") == "client" and r.get("trained", True)]
    # Before round 1: the processes starting (PyTorch's import, the data) and joining.
    start = rounds[0]["wall_seconds"] - rounds[0]["round_seconds"] if rounds else float("nan")
    return {"acc": acc, "wall": wall, "rounds": len(rounds), "clients": clients, "start": start}

def times(clients, prefix):
    mine = [c for c in clients if str(c.get("client", "")).startswith(prefix)]
    if not mine:
        return None
    if "round_seconds" not in mine[0]:
        return "n/a (no round_seconds in the server's client records)"
    mean = lambda k: statistics.fmean(float(c.get(k, float("nan"))) for c in mine)
    r, t, c = mean("round_seconds"), mean("train_seconds"), mean("comm_seconds")
    return f"round {r:6.2f} s | train {t:6.2f} s | framework (round - train) {r - t:5.2f} s | comm {c:5.2f} s   ({len(mine)} reports)"

fail = 0
if mlp:
    m, c = load("mixed"), load("all-cpp")
    d = (m["acc"] - c["acc"]) * 100
    print()
    print(f"final test accuracy after {m['rounds']} rounds: mixed (2 C++ + 2 PyTorch) "
          f"{m['acc'] * 100:.2f}%, all-C++ {c['acc'] * 100:.2f}%, difference {d:+.2f} points")
    print(f"wall time: mixed {m['wall']:.1f} s, all-C++ {c['wall']:.1f} s (of which before round 1, "
          f"the clients starting and joining: {m['start']:.1f} s, {c['start']:.1f} s)")
    print("per round and client (means over the server's client records):")
    for label, run, prefix, who in (("mixed", m, "py-", "PyTorch client"),
                                     ("mixed", m, "cpp-", "C++ client    "),
                                     ("all-C++", c, "cpp-", "C++ client    ")):
        t = times(run["clients"], prefix)
        print(f"  {label:8s} {who}: {t}")
    if d < -1.0:
        print(f"FAIL: the mixed run ends {-d:.2f} points below the all-C++ run (more than 1)")
        fail = 1
if cnn:
    r = load("cnn")
    print(f"\nPyTorch CNN (3 PyTorch clients, server model.spec a net: twin): final test "
          f"accuracy {r['acc'] * 100:.2f}% after {r['rounds']} rounds, wall {r['wall']:.1f} s "
          f"({r['start']:.1f} s before round 1)")
    print(f"  cnn      PyTorch client: {times(r['clients'], 'cnn-')}")
    if not r["acc"] >= 0.6:
        print("FAIL: the CNN federation did not learn (final accuracy below 60%)")
        fail = 1
sys.exit(fail)
PY
exit "$status"
