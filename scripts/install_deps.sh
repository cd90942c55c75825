#!/usr/bin/env bash
# Installs every build, test and run dependency of pdserve from Debian 12
# packages. Idempotent: packages already present are skipped by apt.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang-format
  # gRPC + protobuf + abseil + metrics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # CPU matrix products
  libdnnl-dev ocl-icd-opencl-dev
  # tokenizer: regex with look-ahead, Unicode normalization, JSON
  libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  # KV checksums
  libxxhash-dev
  # tests: certificates, process tools, Prometheus
  openssl procps util-linux prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
