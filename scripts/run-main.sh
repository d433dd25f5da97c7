#!/usr/bin/env bash
# Installs what Cohort needs, builds it, and runs the main job: a federation of real processes on
# loopback — 2 parameter-server shards + 10 clients, mutual TLS (certificates made by cohort-keygen
# in a temporary folder), FedAvg on Fashion-MNIST for 20 rounds — printing one line per round and
# writing metrics.jsonl into the current folder. Extra arguments go to examples/fedavg/run.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_WITH_CUDA=AUTO
cmake --build "$root/build" -j "$(nproc)" --target cohort-server cohort-client cohort-keygen
exec "$root/examples/fedavg/run.sh" --bin "$root/build/bin" "$@"
