#!/usr/bin/env bash
# Fresh-machine rehearsal: runs the README's two commands, exactly as written,
# as root in a pristine Debian 12 root (debootstrap --variant=minbase, the base
# the container test imports too) holding a clean clone of this repository's
# HEAD and nothing else. It proves that scripts/install_deps.sh installs
# everything the build, the demo and every test need; a green run on a
# developer machine can hide a missing install step.
#
#   sudo scripts/fresh_machine_check.sh [--keep] [--tests-only] [--demo-only]
#
# What happens:
#  1. A minbase Debian 12 root is made with debootstrap (the pristine tarball is
#     cached in $PDSERVE_FRESH_CACHE, default /var/cache/pdserve/fresh-root, so
#     that later runs skip the download; each run unpacks a new copy).
#  2. `git clone` of HEAD goes to /root/pdserve inside it (uncommitted changes
#     are NOT part of the rehearsal: commit first).
#  3. In a chroot with /proc, /sys, /dev and the cgroup tree mounted, as root:
#       cd /root/pdserve && bash scripts/build.sh && build/pdserve up --demo_prompt="Once upon a time"
#     then, in a second pristine root,
#       cd /root/pdserve && bash scripts/test.sh
#     Two roots, because each README command is for a fresh machine.
#  4. Podman runs inside the chroot (it shares this machine's kernel, network
#     and cgroups), so the container test runs there too. Its dependencies are
#     also listed from the fresh root (podman, iptables, catatonit, kubectl,
#     node, npm, curl versions), which is what the container test needs when it
#     cannot run (then the script says so).
#  5. The network a fresh machine of this workplace has: its extra CA
#     certificates (/usr/local/share/ca-certificates, which an egress proxy
#     may need) and the CA variables of this environment (NODE_EXTRA_CA_CERTS,
#     SSL_CERT_FILE, ...) pass into the root; nothing else of this machine
#     does.
# Everything it prints goes to $PDSERVE_FRESH_LOG (default
# /tmp/pdserve-fresh-<pid>.log) too. Exit status: 0 when both commands
# succeeded. --keep leaves the roots (under /tmp) for inspection.
set -uo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
KEEP=0
RUN_DEMO=1
RUN_TESTS=1
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    --tests-only) RUN_DEMO=0 ;;
    --demo-only) RUN_TESTS=0 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "run as root (debootstrap and chroot need it)" >&2; exit 2; }
for tool in debootstrap git chroot mount findmnt; do
  command -v "$tool" >/dev/null || { echo "'$tool' is required (apt-get install debootstrap)" >&2; exit 2; }
done

CACHE=${PDSERVE_FRESH_CACHE:-/var/cache/pdserve/fresh-root}
LOG=${PDSERVE_FRESH_LOG:-/tmp/pdserve-fresh-$$.log}
exec > >(tee "$LOG") 2>&1
START=$(date +%s)
log() { echo "[fresh $(($(date +%s) - START))s] $*"; }

# The Debian mirror apt uses on this machine (deb822 or one-line format).
MIRROR=$(grep -hsE '^URIs:.*debian/?$' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | head -n1)
if [ -z "$MIRROR" ]; then
  MIRROR=$(grep -hsE '^deb .*/debian/? bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
           awk '{print $2}' | head -n1)
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PRISTINE=$CACHE/bookworm-minbase.tar
if [ ! -s "$PRISTINE" ]; then
  log "making a pristine Debian 12 root with debootstrap --variant=minbase from $MIRROR"
  mkdir -p "$CACHE"
  tmp=$(mktemp -d)
  if ! debootstrap --variant=minbase bookworm "$tmp/root" "$MIRROR" >"$tmp/debootstrap.log" 2>&1; then
    tail -n 20 "$tmp/debootstrap.log"
    rm -rf "$tmp"
    log "FAIL: debootstrap"
    exit 1
  fi
  rm -rf "$tmp"/root/var/cache/apt/archives/*.deb "$tmp"/root/var/lib/apt/lists/*
  tar -C "$tmp/root" -cf "$PRISTINE.part" . && mv "$PRISTINE.part" "$PRISTINE"
  rm -rf "$tmp"
fi
log "pristine root: $PRISTINE ($(du -h "$PRISTINE" | cut -f1))"

ROOTS=()
# Unmounts everything under ROOT (deepest first) and kills what still runs in
# it; refuses to delete a root that still has a mount.
release_root() {
  local root=$1 pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    if [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ]; then
      kill -9 "$pid" 2>/dev/null
    fi
  done
  sleep 1
  findmnt -rn -o TARGET | grep -E "^$root(/|$)" | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null
  done
  if findmnt -rn -o TARGET | grep -qE "^$root(/|$)"; then
    echo "WARNING: mounts remain under $root; not deleting it" >&2
    return 1
  fi
  if [ "$KEEP" -eq 0 ]; then rm -rf --one-file-system "$root"; fi
}
cleanup() {
  local r
  for r in "${ROOTS[@]}"; do release_root "$r"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Unpacks a new pristine root with a clean clone of HEAD at /root/pdserve and
# mounts what a machine has; prints its path.
new_root() {
  local root
  root=$(mktemp -d /tmp/pdserve-fresh-root.XXXXXX)
  chmod 755 "$root"
  tar -C "$root" -xf "$PRISTINE"
  # The root is a mount point, as / is on a machine: podman's storage remounts
  # / while unpacking layers, which fails in a plain directory.
  mount --bind "$root" "$root"
  git clone -q --no-local "$SRC" "$root/root/pdserve"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
  mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
  mount -t tmpfs -o mode=755 tmpfs "$root/run"
  echo "$root"
}

# The CA variables of this environment (see 5. above).
CA_ENV=()
for v in NODE_EXTRA_CA_CERTS SSL_CERT_FILE SSL_CERT_DIR CURL_CA_BUNDLE \
         REQUESTS_CA_BUNDLE GIT_SSL_CAINFO; do
  if [ -n "${!v:-}" ]; then CA_ENV+=("$v=${!v}"); fi
done

# Runs COMMAND as root in ROOT's /root/pdserve with a login-like environment.
in_root() {
  local root=$1
  shift
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "${CA_ENV[@]}" /bin/bash -c "cd /root/pdserve && $*"
}

DEMO_RC=-
TESTS_RC=-
if [ "$RUN_DEMO" -eq 1 ]; then
  ROOT=$(new_root)
  ROOTS+=("$ROOT")
  log "README command 1 in $ROOT (clone of $(git -C "$SRC" rev-parse --short HEAD))"
  t0=$(date +%s)
  in_root "$ROOT" 'bash scripts/build.sh && build/pdserve up --demo_prompt="Once upon a time"'
  DEMO_RC=$?
  log "README command 1 exited $DEMO_RC after $(($(date +%s) - t0))s"
  release_root "$ROOT"
fi
if [ "$RUN_TESTS" -eq 1 ]; then
  ROOT=$(new_root)
  ROOTS+=("$ROOT")
  log "README command 2 in $ROOT (clone of $(git -C "$SRC" rev-parse --short HEAD))"
  t0=$(date +%s)
  in_root "$ROOT" 'bash scripts/test.sh'
  TESTS_RC=$?
  log "README command 2 exited $TESTS_RC after $(($(date +%s) - t0))s"
  log "the container test's dependencies, as installed in the fresh root by scripts/install_deps.sh:"
  in_root "$ROOT" 'for c in "podman --version" "iptables --version" "catatonit --version" \
      "kubectl version --client" "node --version" "npm --version" "curl --version" \
      "debootstrap --version"; do printf "  %-26s " "$c:"; $c 2>&1 | head -n1 || echo MISSING; done'
  if ! grep -q "deploy.container .*Passed" "$LOG"; then
    log "NOTE: the container test did not pass inside the fresh root (see above)"
  fi
fi
log "summary: command 1 (build + demo) rc=$DEMO_RC, command 2 (install + build + all tests) rc=$TESTS_RC; log: $LOG"
[ "$DEMO_RC" != "-" ] && [ "$DEMO_RC" -ne 0 ] && exit 1
[ "$TESTS_RC" != "-" ] && [ "$TESTS_RC" -ne 0 ] && exit 1
exit 0
