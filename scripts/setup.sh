#!/usr/bin/env bash
# Sets up everything opforge needs on a fresh Debian machine, skipping what is already there:
#   1. Debian packages (apt-get; sudo when not root),
#   2. the Python venv with torch, transformers and ray pinned in python/requirements.lock, kept in
#      ~/.cache/opforge/venv-<hash of the lock> and linked as .venv (a fresh clone reuses it),
#   3. the CMake build in build/ (ccache makes a rebuild of a fresh clone cheap).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { printf '[setup] %s\n' "$*" >&2; }

PKGS=(build-essential cmake ninja-build ccache pkg-config python3-dev python3-venv
      libsqlite3-dev libxxhash-dev libcurl4-openssl-dev nlohmann-json3-dev libgtest-dev
      libcli11-dev libspdlog-dev libfmt-dev libcpp-httplib-dev libssl-dev libfaiss-dev zlib1g-dev
      # opforge eval runs every solution in its own bubblewrap sandbox (evaluator/README.md).
      bubblewrap
      # faiss's exact search is BLAS matrix products: without OpenBLAS, Debian's libblas3 is the
      # netlib reference one, 16x slower in dedup (bench/dedup_scale.cpp).
      libopenblas0-pthread
      # opforge slurm submits through sbatch; its test runs a one-node Slurm on this machine
      # (scripts/local_slurm.sh): slurmctld, slurmd and the munge daemon. About 10 s of apt.
      slurm-wlm munge)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

BASE_PY="${OPFORGE_BASE_PYTHON:-/usr/bin/python3}"
KEY="$( (cat python/requirements.lock; "$BASE_PY" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
CACHE="${OPFORGE_CACHE:-$HOME/.cache/opforge}"
VENV="$CACHE/venv-$KEY"
if [ ! -f "$VENV/.complete" ]; then
  log "creating the venv $VENV (torch, transformers: a few minutes the first time)"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$BASE_PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r python/requirements.lock >&2
  touch "$VENV/.complete"
fi
ln -sfn "$VENV" .venv

if [ ! -f build/build.ninja ]; then
  log "configuring build/"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DOPFORGE_PYTHON="$ROOT/.venv/bin/python3" >&2
fi
log "building"
# Paths inside the clone hash relative to it, so a fresh clone elsewhere reuses the cache.
CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1 cmake --build build >&2
