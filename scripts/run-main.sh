#!/usr/bin/env bash
# Installs what Cohort needs, builds it, and runs the main job.
# Until the federated job lands, the main job is the transport demo: a 64 MiB tensor moved
# between two processes over mutual TLS, with its throughput and an integrity check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOHORT_WITH_CUDA=AUTO
cmake --build build -j "$(nproc)" --target cohort-transport-demo cohort-keygen
exec ./build/bin/cohort-transport-demo "$@"
