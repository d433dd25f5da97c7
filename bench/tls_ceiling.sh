#!/usr/bin/env bash
# How close TLS can come to plaintext on this machine: for one benchmark configuration, measures
# the CPU time (all cores, from /proc/stat) and the wall time of its timed loops in plaintext and
# in TLS, and prints one JSON line:
#   {"bench":"tls_ceiling","target":"ps|allreduce","config":...,"bytes":B,"op":"push|pull|both|allreduce",
#    "plain_cpu_s":..,"tls_cpu_s":..,"plain_wall_s":..,"tls_wall_s":..,"plain_busy":..,
#    "tls_busy":..,"measured_ratio":..,"ceiling_ratio":..}
# Startup (process launch, handshakes, first touch of the model) is cancelled by running each
# configuration twice, with few and with many timed operations, and taking the differences.
#   measured_ratio = plain_wall / tls_wall over the same operations;
#   ceiling_ratio  = (plain_cpu / plain_busy) / tls_cpu: the ratio TLS would reach if it kept
#                    every core busy while plaintext keeps its measured share busy. TLS cannot
#                    go above it without doing less work per byte.
# plain_busy and tls_busy are the fractions of all cores busy during the timed loops. The machine
# must otherwise be idle: anything else running counts as benchmark CPU time.
#
# Usage: bench/tls_ceiling.sh [--bin DIR] ps SHARDSxCLIENTS MIB [push|pull]
#        bench/tls_ceiling.sh [--bin DIR] allreduce N BYTES
#   ps times its push and pull loops both, or only the one named (their costs per byte differ: a
#   plaintext push copies nothing in user space, a plaintext pull copies on both sides).
#   e.g. bench/tls_ceiling.sh ps 1x2 16 push; bench/tls_ceiling.sh allreduce 4 16777216
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bin"
usage() { sed -n '/^# Usage:/,/^#   e.g./p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] && usage
if [ "${1:-}" = "--bin" ]; then bin=$2; shift 2; fi
# Raise the benchmark's priority where allowed (root), so stray work on the machine counts less.
prio=(); if nice -n -20 true 2>/dev/null; then prio=(nice -n -20); fi
[ $# -eq 3 ] || { [ $# -eq 4 ] && [ "$1" = ps ]; } || usage
target=$1 config=$2 size=$3 op=${4:-}
case "$target" in
  ps)
    [[ "$config" =~ ^[1-8]x[1-8]$ ]] || { echo "tls_ceiling: layout '$config' is not SxC" >&2; exit 2; }
    [[ "$size" =~ ^[0-9]+$ ]] || { echo "tls_ceiling: size '$size' is not a number of MiB" >&2; exit 2; }
    bytes=$((size << 20)) few=20 many=200
    case "${op:=both}" in
      push|pull) ops=("$op") ;;
      both) ops=(push pull) ;;
      *) echo "tls_ceiling: op '$op' is not push or pull" >&2; exit 2 ;;
    esac
    run() { "${prio[@]}" "$bin/cohort-bench-ps" --layouts "$config" --sizes-mib "$size" --modes "$1" \
              --ops "${ops[@]}" --repeats "$2" --min-mib 0; }
    ;;
  allreduce)
    [[ "$config" =~ ^[0-9]+$ ]] || { echo "tls_ceiling: n '$config' is not a number" >&2; exit 2; }
    [[ "$size" =~ ^[0-9]+$ ]] || { echo "tls_ceiling: bytes '$size' is not a number" >&2; exit 2; }
    bytes=$size few=10 many=100 op=allreduce
    # --seconds 1000 makes --max-iters the iteration count.
    run() { "${prio[@]}" "$bin/cohort-bench-allreduce" --ns "$config" --sizes "$size" --algos ring \
              --modes "$1" --seconds 1000 --max-iters "$2"; }
    ;;
  *) usage ;;
esac

ticks_per_s=$(getconf CLK_TCK)
# busy and idle ticks of all cores, from the aggregate "cpu" line (iowait counts as idle)
stat_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }

# measure MODE REPEATS -> "busy_ticks idle_ticks wall_ns"
measure() {
  local s0 s1 t0 t1
  s0=$(stat_ticks); t0=$(date +%s%N)
  run "$1" "$2" >/dev/null 2>&1 || { echo "tls_ceiling: the $1 benchmark failed" >&2; exit 1; }
  t1=$(date +%s%N); s1=$(stat_ticks)
  set -- $s0 $s1
  echo "$(($3 - $1)) $(($4 - $2)) $((t1 - t0))"
}

declare -A cpu wall busy
for mode in plain tls; do
  read -r b1 i1 w1 < <(measure "$mode" "$few")
  read -r b2 i2 w2 < <(measure "$mode" "$many")
  db=$((b2 - b1)) di=$((i2 - i1)) dw=$((w2 - w1))
  if [ "$db" -le 0 ] || [ "$dw" -le 0 ] || [ $((db + di)) -le 0 ]; then
    echo "tls_ceiling: the $mode runs did not grow with the repeats (machine busy?); try again" >&2
    exit 1
  fi
  cpu[$mode]=$(awk -v t="$db" -v h="$ticks_per_s" 'BEGIN{printf "%.3f", t / h}')
  wall[$mode]=$(awk -v w="$dw" 'BEGIN{printf "%.3f", w / 1e9}')
  busy[$mode]=$(awk -v b="$db" -v i="$di" 'BEGIN{printf "%.3f", b / (b + i)}')
done
awk -v target="$target" -v config="$config" -v bytes="$bytes" -v op="$op" \
    -v pc="${cpu[plain]}" -v tc="${cpu[tls]}" -v pw="${wall[plain]}" -v tw="${wall[tls]}" \
    -v pb="${busy[plain]}" -v tb="${busy[tls]}" 'BEGIN {
  printf "{\"bench\":\"tls_ceiling\",\"target\":\"%s\",\"config\":\"%s\",\"bytes\":%d,\"op\":\"%s\",", target, config, bytes, op
  printf "\"plain_cpu_s\":%s,\"tls_cpu_s\":%s,\"plain_wall_s\":%s,\"tls_wall_s\":%s,", pc, tc, pw, tw
  printf "\"plain_busy\":%s,\"tls_busy\":%s,", pb, tb
  printf "\"measured_ratio\":%.3f,\"ceiling_ratio\":%.3f}\n", pw / tw, (pc / pb) / tc
}'
