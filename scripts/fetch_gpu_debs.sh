#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian 12 packages that building the
# engine alone needs, into build-gpu-debs/ (ignored by git: /build*/), for a
# GPU session to carry to the device machine, which has no apt and no network:
#   run(command="scripts/gpu_check.sh", carry=["build-gpu-debs"])
# scripts/gpu_check.sh extracts them (dpkg-deb -x, no root) into
# build-gpu-root/ and points CMake, pkg-config and the loader there, only
# when the device machine lacks a dependency; nothing is installed
# system-wide.
# oneDNN (optional for the engine) is left out to stay within the 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=build-gpu-debs
PACKAGES=(
  # libraries the engine links (headers + shared libs + CMake/pkg-config files)
  libabsl-dev libabsl20220623
  nlohmann-json3-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libxxhash-dev libxxhash0
  libgtest-dev libgmock-dev
  # build tools, in case the device machine has none
  cmake cmake-data libjsoncpp25 librhash0 libuv1 ninja-build
  pkgconf pkgconf-bin libpkgconf3 pkg-config
)
mkdir -p "$DEST"
cd "$DEST"
rm -f ./*.deb
apt-get download "${PACKAGES[@]}"
ls -la ./*.deb
du -ch ./*.deb | tail -1
