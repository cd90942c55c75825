#!/usr/bin/env bash
# Installs dependencies (Debian 12) and builds build/pdserve and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
