#!/usr/bin/env bash
# Cohort's AllReduce against Gloo's, side by side on this machine: alternates
# cohort-bench-allreduce (auto, ring, halving_doubling, recursive_doubling; plaintext and TLS)
# with the Gloo peer (../shared/peers/gloo_allreduce.cpp: ring_chunked and halving_doubling,
# plaintext TCP), ROUNDS times, and prints one JSON line per (n, bytes) with the medians:
#   {"bench":"allreduce_vs_gloo","n":N,"bytes":B,"auto_gbps":..,"picked":"..","gloo_best":"..",
#    "gloo_best_gbps":..,"auto_vs_gloo":..,"tls_auto_vs_gloo_plain":..,"algos":{..},
#    "worst_algo_vs_best":..}
# Build the peer first:
#   g++ -O3 -march=native -o gloo_allreduce ../shared/peers/gloo_allreduce.cpp -lgloo -pthread
# Usage: bench/allreduce_vs_gloo.sh GLOO_BINARY [ROUNDS (3)] [NS (2,4,8)] [SIZES (16777216,67108864)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bin"
[ $# -ge 1 ] || { sed -n '/^# Usage:/p' "$0" | sed 's/^# //' >&2; exit 2; }
gloo=$1 rounds=${2:-3} ns=${3:-2,4,8} sizes=${4:-16777216,67108864}
[ -x "$gloo" ] || { echo "allreduce_vs_gloo: no Gloo peer at $gloo" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
lscpu | sed -n 's/^Model name: *//p' | head -1 > "$out/cpu"
for ((r = 0; r < rounds; r++)); do
  "$bin/cohort-bench-allreduce" --ns "$ns" --modes plain,tls --sizes "$sizes" \
    --algos auto,ring,halving_doubling,recursive_doubling --seconds 1 2>/dev/null >> "$out/cohort"
  for n in ${ns//,/ }; do
    for algo in ring_chunked halving_doubling; do
      "$gloo" "$n" "$algo" 3 2>/dev/null >> "$out/gloo" || true
    done
  done
done
/usr/bin/python3 - "$out" "$sizes" <<'PY'
import json, re, statistics, sys
out, sizes = sys.argv[1], {int(s) for s in sys.argv[2].split(',')}
cpu = open(out + '/cpu').read().strip()
ours, gloo, picked = {}, {}, {}
for line in open(out + '/cohort'):
    j = json.loads(line)
    ours.setdefault((j['n'], j['bytes'], j['mode'], j['algo']), []).append(j['busbw_gbps'])
    if j['algo'] == 'auto':
        picked[(j['n'], j['bytes'])] = j.get('picked', '?')
pat = re.compile(r'np=(\d+) algo=(\S+) bytes=(\d+) .*busbw_GBs=([0-9.]+)')
for line in open(out + '/gloo'):
    m = pat.search(line)
    if m and int(m.group(3)) in sizes:
        gloo.setdefault((int(m.group(1)), int(m.group(3)), m.group(2)), []).append(float(m.group(4)))
med = lambda v: statistics.median(v)
for (n, b) in sorted({(k[0], k[1]) for k in ours}):
    g = {a: med(v) for (gn, gb, a), v in gloo.items() if (gn, gb) == (n, b)}
    algos = {a: med(v) for (on, ob, mode, a), v in ours.items() if (on, ob, mode) == (n, b, 'plain')}
    tls = {a: med(v) for (on, ob, mode, a), v in ours.items() if (on, ob, mode) == (n, b, 'tls')}
    if not g or 'auto' not in algos:
        continue
    best = max(g, key=g.get)
    everyone = dict(algos, **{'gloo_' + k: v for k, v in g.items()})
    print(json.dumps({
        'bench': 'allreduce_vs_gloo', 'cpu': cpu, 'n': n, 'bytes': b,
        'auto_gbps': round(algos['auto'], 3), 'picked': picked.get((n, b)),
        'gloo_best': best, 'gloo_best_gbps': round(g[best], 3),
        'auto_vs_gloo': round(algos['auto'] / g[best], 3),
        'tls_auto_gbps': round(tls.get('auto', 0), 3),
        'tls_auto_vs_gloo_plain': round(tls.get('auto', 0) / g[best], 3),
        'algos': {k: round(v, 3) for k, v in everyone.items()},
        'worst_algo_vs_best': round(min(everyone.values()) / max(everyone.values()), 3),
        'rounds': len(ours.get((n, b, 'plain', 'auto'), []))}))
PY
