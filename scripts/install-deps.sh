#!/usr/bin/env bash
# Installs Cohort's build, test and run dependencies from Debian's packages.
# Idempotent: packages already present are skipped, apt-get update runs only when needed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  procps util-linux  # scripts/test.sh: pgrep, and chrt for the builds it runs beside the tests
  libzmq3-dev cppzmq-dev
  capnproto libcapnp-dev
  libssl-dev openssl
  libeigen3-dev
  doctest-dev
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  zlib1g-dev
  # The HTTP endpoint (observe/): cpp-httplib, and Chart.js embedded in the dashboard.
  libcpp-httplib-dev libjs-chart.js
  dataset-fashion-mnist
  iproute2 nftables
  clang libclang-rt-14-dev clang-format
  python3-yaml
  python3-sklearn python3-numpy  # tests: a CSV data set that is not Fashion-MNIST (digits)
  gnuplot-nox
  # The cohort Python module (python/) and its tests and examples: Debian's interpreter with
  # pybind11, NumPy, pytest and PyTorch (CPU).
  python3-dev pybind11-dev python3-pytest python3-torch
  # Tests of what the operator sees and deploys: the dashboard in headless Chromium, the test venvs
  # (PyPI's tensorboard, prometheus_client, kubernetes-validate), YAML lint, the container image
  # (debootstrap + podman, nothing pulled from a registry), and a real single-host Slurm.
  chromium chromium-driver python3-selenium python3-venv yamllint
  podman buildah runc crun debootstrap containernetworking-plugins fuse-overlayfs uidmap
  slurmctld slurmd slurm-client munge
)
# Intel's ipsec-mb: a faster AES-GCM for the transport (Debian ships it for amd64 only).
if [ "$(dpkg --print-architecture)" = amd64 ]; then packages+=(libipsec-mb-dev); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
