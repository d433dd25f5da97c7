#!/usr/bin/env bash
# Builds this example against an installed Cohort, runs its test, then runs its clipped_sgd rule
# through the stock programs: a federation of the installed cohort-server (train.rule in
# custom_trainer.toml) and 3 cohort-client --plugin libclipped_sgd_plugin.so for 3 rounds of a
# small MLP on Fashion-MNIST (plaintext on loopback), and the same rule in cohort-sim --plugin
# (20 virtual clients). Exits non-zero unless every round completes with every client's update,
# the federation's final test accuracy reaches 60%, and a program without the plug-in refuses
# the rule by name.
#
# Usage: run.sh --prefix DIR [--build DIR] [--rounds R] [--clients N] [--timeout SEC]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=""
build=""
rounds=3
clients=3
timeout_s=120
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "run.sh: --prefix DIR (where cmake --install put Cohort) is required" >&2; exit 2; }
prefix=$(cd "$prefix" && pwd)
for b in cohort-server cohort-client cohort-sim; do
  [ -x "$prefix/bin/$b" ] || { echo "run.sh: $prefix/bin/$b not found; run cmake --install first" >&2; exit 2; }
done

work=$(mktemp -d -t cohort-custom-trainer-XXXXXX)
[ -n "$build" ] || build="$work/build"
pids=()
cleanup() {
  {
    for p in "${pids[@]}"; do kill "$p" || true; done
    sleep 0.2
    for p in "${pids[@]}"; do kill -9 "$p" || true; done
    wait || true
  } 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; echo "run.sh: configuring the example failed" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; echo "run.sh: building the example failed" >&2; exit 1; }
"$build/clipped_sgd_test" >"$work/test.log" ||
  { cat "$work/test.log" >&2; echo "run.sh: clipped_sgd_test failed" >&2; exit 1; }
tail -n 1 "$work/test.log"
plugin="$build/libclipped_sgd_plugin.so"

# 1. Without the plug-in the rule is unknown: one line naming it, at start-up.
if "$prefix/bin/cohort-sim" --config "$here/custom_trainer.toml" --sim.clients=2 \
    --server.rounds=1 >"$work/refused.log" 2>&1; then
  echo "run.sh: cohort-sim ran train.rule = clipped_sgd without the plug-in" >&2; exit 1
fi
grep -q "unknown local training rule 'clipped_sgd'" "$work/refused.log" ||
  { cat "$work/refused.log" >&2; echo "run.sh: the refusal does not name the rule" >&2; exit 1; }

# 2. A federation: the stock server sends train.rule; each client loads the plug-in.
dir="$work/federation" metrics="$work/metrics.jsonl"
mkdir -p "$dir"
start=$SECONDS
"$prefix/bin/cohort-server" --config "$here/custom_trainer.toml" --insecure \
  --listen 'tcp://127.0.0.1:*' --port-file "$dir/port" --server.metrics_file="$metrics" \
  --server.rounds="$rounds" --server.clients_per_round="$clients" \
  --server.min_clients="$clients" --server.min_updates="$clients" --log-level warn \
  2>"$dir/server.log" &
server=$!
pids+=("$server")
for _ in $(seq 1 200); do [ -s "$dir/port" ] && break; kill -0 "$server" 2>/dev/null || break; sleep 0.05; done
[ -s "$dir/port" ] || { echo "run.sh: the server did not start:" >&2; cat "$dir/server.log" >&2; exit 1; }
url="tcp://127.0.0.1:$(cat "$dir/port")"
for ((i = 0; i < clients; i++)); do
  "$prefix/bin/cohort-client" --plugin "$plugin" --server "$url" --name "client-$i" \
    --part "$i/20" --insecure --log-level warn 2>"$dir/client-$i.log" &
  pids+=($!)
done
while kill -0 "$server" 2>/dev/null && [ $((SECONDS - start)) -lt "$timeout_s" ]; do sleep 0.2; done
if kill -0 "$server" 2>/dev/null; then
  echo "run.sh: no result after ${timeout_s}s; logs:" >&2; tail -n 5 "$dir"/*.log >&2 || true; exit 1
fi
status=0
wait "$server" || status=$?
[ "$status" = 0 ] || { echo "run.sh: the server failed (exit $status):" >&2; tail -n 5 "$dir"/*.log >&2 || true; exit 1; }
done_rounds=$(grep -c '"event":"round"' "$metrics" || true)
full_rounds=$(grep '"event":"round"' "$metrics" | grep -c "\"clients\":$clients[,}]" || true)
accuracy=$(grep '"event":"round"' "$metrics" | tail -n 1 | sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p')
echo "custom_trainer [federation]: $done_rounds/$rounds rounds with clipped_sgd, $full_rounds with" \
  "all $clients clients, final test accuracy ${accuracy:-?}, $((SECONDS - start)) s"
if [ "$done_rounds" != "$rounds" ] || [ "$full_rounds" != "$rounds" ] ||
   ! awk -v a="${accuracy:-0}" 'BEGIN { exit !(a >= 0.6) }'; then
  echo "run.sh: expected $rounds rounds with $clients clients each and accuracy >= 0.6:" >&2
  cat "$metrics" >&2; exit 1
fi

# 3. The simulator: 20 virtual clients train with the same rule, 5 a round.
"$prefix/bin/cohort-sim" --plugin "$plugin" --config "$here/custom_trainer.toml" \
  --sim.clients=20 --server.clients_per_round=5 --server.rounds="$rounds" \
  --sim.metrics_file="$work/sim.jsonl" --sim.csv_file= >"$work/sim.log" 2>&1 ||
  { cat "$work/sim.log" >&2; echo "run.sh: cohort-sim --plugin failed" >&2; exit 1; }
line=$(grep "^cohort-sim: .* rounds" "$work/sim.log" | head -n 1)
echo "custom_trainer [cohort-sim]: ${line#cohort-sim: }"
echo "$line" | grep -q "$rounds rounds ($rounds committed)" ||
  { cat "$work/sim.log" >&2; echo "run.sh: cohort-sim did not commit $rounds rounds" >&2; exit 1; }
