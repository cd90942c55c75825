#!/usr/bin/env bash
# Prints, one per line, the Debian packages that own the shared libraries a
# binary links against (found with ldd), so that the runtime image installs
# exactly those and nothing else. Fails if a library belongs to no package.
# usage: runtime-packages.sh BINARY
set -euo pipefail
binary=$1
mapfile -t libs < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
for lib in "${libs[@]}"; do
  real=$(readlink -f "$lib")
  pkg=""
  # Debian 12 is usr-merged: a file may be registered under /lib or /usr/lib.
  for path in "$lib" "$real" "/usr${lib}" "${lib#/usr}" "/usr${real}" "${real#/usr}"; do
    pkg=$(dpkg-query -S "$path" 2>/dev/null | head -n1 | cut -d: -f1) || true
    if [ -n "$pkg" ]; then break; fi
  done
  if [ -z "$pkg" ]; then
    echo "runtime-packages.sh: no Debian package owns $lib" >&2
    exit 1
  fi
  echo "$pkg"
done | sort -u
