#!/usr/bin/env bash
# scripts/install-deps.sh — installs the Debian packages ctrain needs to build, test and run.
# Idempotent: checks each package with dpkg and installs only what is missing (as root, or
# via sudo when available); otherwise prints the apt-get command and fails.
set -euo pipefail

PACKAGES=(
  gcc g++ make pkg-config file   # toolchain (g++: the Gloo adapter, parallel/gloo_adapter.cc)
  libgloo-dev                    # CPU collectives over TCP (process group, parallel/comm.h)
  meson ninja-build              # build system
  libhdf5-dev hdf5-tools         # token datasets, checkpoints (h5dump for inspection)
  libopenblas-openmp-dev         # CPU GEMM (OpenMP build: shares our thread pool)
  libcjson-dev                   # JSON (HF configs, safetensors headers)
  libpcre2-dev libutf8proc-dev   # tokenizer.json: pre-tokenizer regexes, Unicode normalization
  openmpi-bin                    # mpirun, for the `mpirun -np 2 ctrain train` test
  fortunes                       # the bundled default training corpus
  iproute2                       # ip netns: the two "nodes" of tests/integration/multinode.sh
  slurmctld slurmd slurm-client munge  # a private one-node Slurm for tests/integration/slurm.sh
  clang libclang-rt-14-dev       # fuzzing (tests/fuzz/run.sh): libFuzzer, ASan, UBSan runtimes
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  SUDO="sudo"
else
  echo "install-deps: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
