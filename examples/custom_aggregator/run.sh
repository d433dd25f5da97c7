#!/usr/bin/env bash
# Builds this example against an installed Cohort and runs a short federation with its
# geometric_median rule: 1 shard + 3 clients (the installed cohort-client), plaintext on
# loopback, 3 rounds of a small MLP on Fashion-MNIST. Mode "plugin" runs the stock cohort-server
# with --plugin libgeomedian_plugin.so; "embedded" runs geomedian-server (the rule added to the
# registries in its own main()); "both" (default) runs one after the other. Exits non-zero unless
# every federation completes its rounds (checked in metrics.jsonl) within --timeout seconds.
#
# Usage: run.sh --prefix DIR [--build DIR] [--mode plugin|embedded|both] [--rounds R]
#               [--clients N] [--timeout SEC] [--out DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=""
build=""
mode=both
rounds=3
clients=3
timeout_s=120
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "run.sh: --prefix DIR (where cmake --install put Cohort) is required" >&2; exit 2; }
prefix=$(cd "$prefix" && pwd)
case "$mode" in plugin|embedded|both) ;; *) echo "run.sh: --mode must be plugin, embedded or both" >&2; exit 2 ;; esac
for b in cohort-server cohort-client; do
  [ -x "$prefix/bin/$b" ] || { echo "run.sh: $prefix/bin/$b not found; run cmake --install first" >&2; exit 2; }
done

work=$(mktemp -d -t cohort-custom-aggregator-XXXXXX)
[ -n "$build" ] || build="$work/build"
[ -n "$out" ] || out="$work"
mkdir -p "$out"
pids=()
cleanup() {
  {
    for p in "${pids[@]}"; do kill "$p" || true; done
    sleep 0.2
    for p in "${pids[@]}"; do kill -9 "$p" || true; done
    wait || true  # reaps them; bash's "Killed" notices go to /dev/null with the rest
  } 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Configure and build (a no-op when up to date): find_package(Cohort) finds the prefix.
cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; echo "run.sh: configuring the example failed" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; echo "run.sh: building the example failed" >&2; exit 1; }
"$build/geometric_median_test" >"$work/test.log" ||
  { cat "$work/test.log" >&2; echo "run.sh: geometric_median_test failed" >&2; exit 1; }
"$build/federated_step_demo" >"$work/step.log" ||
  { cat "$work/step.log" >&2; echo "run.sh: federated_step_demo failed" >&2; exit 1; }
cat "$work/step.log"

# run_federation NAME SERVER_COMMAND...: shard 0 plus $clients clients; checks metrics.jsonl.
run_federation() {
  local name=$1; shift
  local dir="$work/$name" metrics="$out/metrics-$name.jsonl"
  mkdir -p "$dir"
  rm -f "$metrics"
  local start=$SECONDS
  # Config keys, not cohort-server's shortcut flags: geomedian-server takes only the former.
  "$@" --config "$here/geomedian.toml" --tls.insecure=true --server.listen='tcp://127.0.0.1:*' \
    --server.port_file="$dir/port" --server.metrics_file="$metrics" --server.rounds="$rounds" \
    --server.clients_per_round="$clients" --server.min_clients="$clients" \
    --server.min_updates="$clients" --log-level warn 2>"$dir/server.log" &
  local server=$!
  pids+=("$server")
  for _ in $(seq 1 200); do [ -s "$dir/port" ] && break; kill -0 "$server" 2>/dev/null || break; sleep 0.05; done
  if [ ! -s "$dir/port" ]; then
    echo "run.sh: [$name] shard 0 did not start:" >&2; cat "$dir/server.log" >&2; return 1
  fi
  local url="tcp://127.0.0.1:$(cat "$dir/port")" i
  # Each client holds 1/20 of the training set: enough to learn, quick to train.
  for ((i = 0; i < clients; i++)); do
    "$prefix/bin/cohort-client" --server "$url" --name "client-$i" --part "$i/20" --insecure \
      --log-level warn 2>"$dir/client-$i.log" &
    pids+=($!)
  done
  while kill -0 "$server" 2>/dev/null && [ $((SECONDS - start)) -lt "$timeout_s" ]; do sleep 0.2; done
  if kill -0 "$server" 2>/dev/null; then
    echo "run.sh: [$name] no result after ${timeout_s}s; logs:" >&2
    tail -n 5 "$dir"/*.log >&2 || true
    return 1
  fi
  local status=0
  wait "$server" || status=$?
  if [ "$status" != 0 ]; then
    echo "run.sh: [$name] shard 0 failed (exit $status); logs:" >&2
    tail -n 5 "$dir"/*.log >&2 || true
    return 1
  fi
  # Every round must be in the metrics, with every client's update.
  local done_rounds full_rounds accuracy
  done_rounds=$(grep -c '"event":"round"' "$metrics" || true)
  full_rounds=$(grep '"event":"round"' "$metrics" | grep -c "\"clients\":$clients[,}]" || true)
  accuracy=$(grep '"event":"round"' "$metrics" | tail -n 1 |
    sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p' | awk '{printf "%.2f%%", $1 * 100}')
  echo "custom_aggregator [$name]: $done_rounds/$rounds rounds with geometric_median," \
    "$full_rounds with all $clients clients, final test accuracy ${accuracy:-?}, $((SECONDS - start)) s"
  if [ "$done_rounds" != "$rounds" ] || [ "$full_rounds" != "$rounds" ]; then
    echo "run.sh: [$name] expected $rounds rounds with $clients clients each in $metrics:" >&2
    cat "$metrics" >&2
    return 1
  fi
}

if [ "$mode" = plugin ] || [ "$mode" = both ]; then
  run_federation plugin "$prefix/bin/cohort-server" --plugin "$build/libgeomedian_plugin.so"
fi
if [ "$mode" = embedded ] || [ "$mode" = both ]; then
  run_federation embedded "$build/geomedian-server"
fi
