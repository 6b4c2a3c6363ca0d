#!/usr/bin/env bash
# Installs the Debian dependencies, configures (Release, Ninja; CUDA when nvcc is present) and
# builds dtr into build/. Extra arguments go to cmake (e.g. -DDTR_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
ninja -C build -j"$(nproc)"
