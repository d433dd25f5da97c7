#!/usr/bin/env bash
# The parameter server against raw ZeroMQ, side by side on this machine: alternates
# cohort-bench-ps (one shard, one client, plaintext, 16 and 64 MiB, push and pull) with the
# ZeroMQ peer (../shared/peers/zmq_bench.cpp, tcp, zero-copy: 64 messages of 16 MiB, 16 of
# 64 MiB) ROUNDS times, and prints one JSON line per (op, size) with the medians and the ratio:
#   {"bench":"ps_vs_zmq","op":"push|pull","bytes":B,"cohort_gbps":..,"zmq_gbps":..,"ratio":..}
# Build the peer first:
#   g++ -O3 -march=native -o zmq_bench ../shared/peers/zmq_bench.cpp -lzmq -pthread
# Usage: bench/ps_vs_zmq.sh ZMQ_BENCH_BINARY [ROUNDS (5)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bin"
[ $# -ge 1 ] || { sed -n '/^# Usage:/p' "$0" | sed 's/^# //' >&2; exit 2; }
zmq=$1 rounds=${2:-5}
[ -x "$zmq" ] || { echo "ps_vs_zmq: no ZeroMQ peer at $zmq" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lscpu | sed -n 's/^Model name: *//p' | head -1 > "$out/cpu"
for ((r = 0; r < rounds; r++)); do
  "$bin/cohort-bench-ps" --layouts 1x1 --modes plain --sizes-mib 16 64 --repeats 7 \
    2>/dev/null >> "$out/cohort"
  "$zmq" tcp 16777216 64 zc 2>/dev/null | tail -1 >> "$out/zmq"
  "$zmq" tcp 67108864 16 zc 2>/dev/null | tail -1 >> "$out/zmq"
done
/usr/bin/python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
cpu = open(out + '/cpu').read().strip()
ours, zmq = {}, {}
for line in open(out + '/cohort'):
    j = json.loads(line)
    ours.setdefault((j['op'], j['bytes']), []).append(j['gbps'])
for line in open(out + '/zmq'):
    m = re.search(r'bytes=(\d+) .*GBps=([0-9.]+)', line)
    if m:
        zmq.setdefault(int(m.group(1)), []).append(float(m.group(2)))
for (op, b), v in sorted(ours.items()):
    if b not in zmq:
        continue
    c, z = statistics.median(v), statistics.median(zmq[b])
    print(json.dumps({'bench': 'ps_vs_zmq', 'cpu': cpu, 'op': op, 'bytes': b,
                      'cohort_gbps': round(c, 3), 'zmq_gbps': round(z, 3),
                      'ratio': round(c / z, 3), 'rounds': len(v),
                      'cohort_all': v, 'zmq_all': zmq[b]}))
PY
