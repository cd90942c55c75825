#!/usr/bin/env bash
# Installs every build, test and run dependency of pdserve from Debian 12
# packages (and nothing else: no downloads from other sites). Idempotent:
# what is present is skipped, and a second run changes nothing.
#   install_deps.sh               everything (build + tests + tools)
#   install_deps.sh --build-only  only what compiling `pdserve` needs (used by
#                                 deploy/docker/Dockerfile's build stage)
# scripts/fresh_machine_check.sh proves on a pristine Debian 12 root that this
# list is complete: run it after changing the list.
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  # gRPC + protobuf + abseil + metrics
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  # the router's HTTP API (Boost.Beast/Asio, header-only)
  libboost-dev
  # CPU matrix products
  libdnnl-dev ocl-icd-opencl-dev
  # tokenizer: regex with look-ahead, Unicode normalization, JSON
  libpcre2-dev libutf8proc-dev nlohmann-json3-dev
  # KV checksums
  libxxhash-dev
  # KV data plane: UCX (UCP API; RDMA, shared memory, TCP)
  libucx-dev
)
TEST_PACKAGES=(
  git clang-format ca-certificates curl
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # tests: certificates, process tools, Prometheus, Python
  openssl procps util-linux iproute2 prometheus python3
  # GPTQ/AWQ checkpoint tests: the numpy packer (tests/unit/quant_checkpoint_writer.py)
  python3-numpy
  # bench-kv-transfer: UCX's own ucx_perftest as the reference
  ucx-utils
  # deployment tests (tests/deploy): podman with runc, a local Debian base
  # image; netavark needs iptables, `podman play kube` needs catatonit (pods'
  # pause process). Both are only "recommended" by podman, hence named here.
  podman runc debootstrap uidmap slirp4netns fuse-overlayfs netavark
  aardvark-dns iptables catatonit
)
# Installed only when the command is missing, so that a newer one already on
# the machine (another Node.js, a kubectl from Kubernetes' own repository,
# which would conflict with Debian's files) is kept.
#   command -> Debian package
COMMAND_PACKAGES=(
  "node:nodejs" "npm:npm"
  # kubectl 1.20 with kustomize 2.0.3 (the manifests are written for it too)
  "kubectl:kubernetes-client"
)
# The Kubernetes manifests must render to the same objects with Debian's
# kubectl 1.20 and with a current one (tests/deploy/k8s_manifests_test.sh).
# Where the kubectl on PATH is another version, Debian's is unpacked here
# (not installed: it would clash with the other kubectl's files).
DEBIAN_KUBECTL_DIR=/var/cache/pdserve/kubernetes-client

PACKAGES=("${BUILD_PACKAGES[@]}")
WITH_TESTS=0
if [ "${1:-}" != "--build-only" ]; then
  WITH_TESTS=1
  PACKAGES+=("${TEST_PACKAGES[@]}")
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ "$WITH_TESTS" -eq 1 ]; then
  for pair in "${COMMAND_PACKAGES[@]}"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
APT_UPDATED=0
apt_update() {
  if [ "$APT_UPDATED" -eq 0 ]; then
    $SUDO apt-get update -q
    APT_UPDATED=1
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
else
  echo "install_deps: installing ${missing[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$WITH_TESTS" -eq 1 ] && ! kubectl version --client 2>/dev/null | grep -q 'v1\.20\.' &&
   [ ! -x "$DEBIAN_KUBECTL_DIR/usr/bin/kubectl" ]; then
  echo "install_deps: unpacking Debian's kubernetes-client (kubectl 1.20) into $DEBIAN_KUBECTL_DIR"
  tmp=$(mktemp -d)
  chmod 755 "$tmp"  # apt downloads as the _apt user
  (cd "$tmp" && { apt-get download -q kubernetes-client 2>/dev/null ||
                  { apt_update && apt-get download -q kubernetes-client; }; })
  $SUDO mkdir -p "$DEBIAN_KUBECTL_DIR"
  $SUDO dpkg-deb -x "$tmp"/kubernetes-client_*.deb "$DEBIAN_KUBECTL_DIR"
  rm -rf "$tmp"
  "$DEBIAN_KUBECTL_DIR/usr/bin/kubectl" version --client >/dev/null
fi
