#!/usr/bin/env bash
# Installs every build, test and run dependency of pdserve from Debian 12
# packages. Idempotent: packages already present are skipped by apt.
#   install_deps.sh               everything (build + tests + tools)
#   install_deps.sh --build-only  only what compiling `pdserve` needs (used by
#                                 deploy/docker/Dockerfile's build stage)
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  # gRPC + protobuf + abseil + metrics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  # CPU matrix products
  libdnnl-dev ocl-icd-opencl-dev
  # tokenizer: regex with look-ahead, Unicode normalization, JSON
  libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  # KV checksums
  libxxhash-dev
)
TEST_PACKAGES=(
  git clang-format
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # tests: certificates, process tools, Prometheus
  openssl procps util-linux prometheus python3
  # deployment tests (tests/deploy): podman with runc, a local Debian base image
  podman runc debootstrap uidmap slirp4netns fuse-overlayfs netavark aardvark-dns
)
PACKAGES=("${BUILD_PACKAGES[@]}")
if [ "${1:-}" != "--build-only" ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

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
