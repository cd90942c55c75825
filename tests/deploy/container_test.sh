#!/usr/bin/env bash
# Container test (CTest label `container`, slow): builds the pdserve image with
# podman from deploy/docker/Dockerfile on a locally imported Debian 12 base,
#  1. runs `pdserve up` inside one container with its port published, streams
#     an answer from outside with the host's `pdserve generate` and compares it
#     with the bundled model's reference, and scrapes the router's /metrics;
#  2. runs the Kubernetes manifests (kustomize overlay
#     deploy/k8s/overlays/podman-test over the same base) with
#     `podman play kube`: router, prefill and decode pods on a podman network,
#     and streams the same request through the router's published port.
# Every container, pod, volume and network it creates is removed on exit; the
# base image, the built image and podman's layer cache are kept.
# usage: container_test.sh [PDSERVE_BINARY]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=${1:-$ROOT/build/pdserve}
export CONTAINERS_CONF=$ROOT/tests/deploy/containers.conf
BASE_IMAGE=localhost/debian:bookworm
IMAGE=localhost/pdserve:test
TAG=pdserve-test-$$
START=$(date +%s)

log() { echo "[$(($(date +%s) - START))s] $*"; }
die() {
  echo "FAIL: $*" >&2
  exit 1
}

for tool in podman kubectl node curl; do
  command -v "$tool" >/dev/null || die "'$tool' is required (scripts/install_deps.sh installs podman)"
done
[ -x "$PDSERVE" ] || die "pdserve binary not found at $PDSERVE (build it first)"

WORK=$(mktemp -d)
CONTAINERS=()
PODS=()
VOLUMES=()
NETWORKS=()
cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ]; then
    local all=("${CONTAINERS[@]}")
    for p in "${PODS[@]}"; do
      mapfile -t -O "${#all[@]}" all < <(podman ps -a --filter "pod=$p" --format '{{.Names}}' 2>/dev/null)
    done
    for c in "${all[@]}"; do
      echo "--- logs of $c (last 30 lines)"
      podman logs --tail 30 "$c" 2>&1
    done
  fi
  for c in "${CONTAINERS[@]}"; do podman rm -f -t 5 "$c" >/dev/null 2>&1; done
  for p in "${PODS[@]}"; do podman pod rm -f -t 5 "$p" >/dev/null 2>&1; done
  for v in "${VOLUMES[@]}"; do podman volume rm -f "$v" >/dev/null 2>&1; done
  for n in "${NETWORKS[@]}"; do podman network rm -f "$n" >/dev/null 2>&1; done
  rm -rf "$WORK"
  log "cleaned up (exit $rc)"
}
trap cleanup EXIT

# A free TCP port on the host, for podman to publish. It is closed again
# before podman binds it, so it is drawn below the kernel's ephemeral range
# (ip_local_port_range): a port from that range could meanwhile become
# another process's outgoing connection or --port=0 listener (the other
# tests run beside this one).
free_port() {
  node -e '
    const net = require("net");
    const low = Number(require("fs").readFileSync(
      "/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    const hi = Math.min(low, 32768), lo = Math.max(1024, hi - 12000);
    const attempt = (n) => {
      const port = lo + Math.floor(Math.random() * (hi - lo));
      const s = net.createServer();
      s.once("error", () => { if (n > 0) attempt(n - 1); else process.exit(1); });
      s.listen(port, "127.0.0.1", () => { console.log(port); s.close(); });
    };
    attempt(100);'
}

# --- 1. The Debian 12 base image, imported from debootstrap (cached). --------
if ! podman image exists "$BASE_IMAGE"; then
  command -v debootstrap >/dev/null || die "debootstrap is required to make $BASE_IMAGE"
  # The Debian mirror apt uses on this machine (deb822 or one-line format;
  # grep exits 2 for a glob that matched no file, as on a debootstrapped
  # machine without sources.list.d/*.sources: not an error here).
  MIRROR=$(grep -hsE '^URIs:.*debian/?$' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | head -n1 || true)
  if [ -z "$MIRROR" ]; then
    MIRROR=$(grep -hsE '^deb .*/debian/? bookworm' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
             awk '{print $2}' | head -n1 || true)
  fi
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  log "making $BASE_IMAGE with debootstrap from $MIRROR"
  ROOTFS="$WORK/rootfs"
  debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
  tar -C "$ROOTFS" -c . | podman import - "$BASE_IMAGE" >/dev/null
  rm -rf "$ROOTFS"
fi

# --- 2. Build the image. -----------------------------------------------------
log "building $IMAGE from deploy/docker/Dockerfile (BASE_IMAGE=$BASE_IMAGE)"
BUILD_START=$(date +%s)
if ! podman build -f "$ROOT/deploy/docker/Dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
     --build-arg BUILD_JOBS=2 -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1; then
  tail -n 40 "$WORK/build.log"
  die "podman build failed"
fi
log "image built in $(($(date +%s) - BUILD_START))s: $(podman image inspect "$IMAGE" --format '{{.Size}}') bytes;" \
    "$(grep -m1 '^runtime packages:' "$WORK/build.log" || echo 'all build steps cached')"
# Images of earlier runs that this build superseded (untagged, older than this
# build); this build's own layers stay as the cache of the next run.
for title in pdserve pdserve-build; do
  podman image prune -f --filter "label=org.opencontainers.image.title=$title" \
    --filter "until=$BUILD_START" >/dev/null 2>&1 || true
done
[ "$(podman image inspect "$IMAGE" --format '{{.Config.User}}')" = "10001:10001" ] ||
  die "the image does not run as the non-root user 10001"

# The reference answer of the bundled model for one prompt.
REF="$ROOT/models/stories260K/reference_greedy.jsonl"
PROMPT=$(node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8").split("\n")[0]);console.log(r.prompt)' "$REF")
MAX_TOKENS=$(node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8").split("\n")[0]);console.log(r.max_new_tokens)' "$REF")

# Streams the reference prompt through TARGET with the host's client and checks
# the output ids against the reference; waits up to 90 s for the cluster.
generate_and_check() {
  local target=$1 what=$2 deadline=$(($(date +%s) + 90))
  until "$PDSERVE" generate "--target=$target" --max_tokens="$MAX_TOKENS" --json "$PROMPT" \
          >"$WORK/gen.json" 2>"$WORK/gen.err"; do
    [ "$(date +%s)" -lt "$deadline" ] || { cat "$WORK/gen.err"; die "$what: no answer from $target"; }
    sleep 2
  done
  node - "$REF" "$WORK/gen.json" "$what" <<'EOF'
const fs = require("fs");
const [refFile, outFile, what] = process.argv.slice(2);
const ref = JSON.parse(fs.readFileSync(refFile, "utf8").split("\n")[0]);
const text = fs.readFileSync(outFile, "utf8").trim();
const out = JSON.parse(text.slice(text.lastIndexOf("\n{") + 1));
const same = JSON.stringify(out.output_ids) === JSON.stringify(ref.output_ids) &&
             out.text === ref.output_text;
console.log(`${what}: ${out.output_ids.length} tokens, ids and text ${same ? "equal to" : "DIFFERENT from"} ` +
            `the reference; text: ${JSON.stringify(out.text)}`);
if (!same) {
  console.error(`expected ${JSON.stringify(ref.output_ids)} ${JSON.stringify(ref.output_text)}\n` +
                `     got ${JSON.stringify(out.output_ids)} ${JSON.stringify(out.text)}`);
  process.exit(1);
}
EOF
}

# The OpenAI-compatible HTTP API on 127.0.0.1:PORT: /health is 200 and a
# greedy /v1/completions of the reference prompt returns the reference text.
http_check() {
  local port=$1 what=$2
  curl -sf --max-time 10 "http://127.0.0.1:$port/health" >/dev/null ||
    die "$what: GET /health on port $port is not 200"
  # The served model's name (the model directory's name unless
  # --served_model_name), as a client learns it.
  local model
  model=$(curl -sf --max-time 10 "http://127.0.0.1:$port/v1/models" |
          node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).data[0].id))') ||
    die "$what: GET /v1/models on port $port failed"
  curl -s --max-time 60 "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' \
    -d "$(node -e 'console.log(JSON.stringify({model: process.argv[3], prompt: process.argv[1],
          max_tokens: Number(process.argv[2]), temperature: 0}))' "$PROMPT" "$MAX_TOKENS" "$model")" \
    >"$WORK/completion.json" || die "$what: POST /v1/completions on port $port failed"
  grep -q '"choices"' "$WORK/completion.json" ||
    die "$what: POST /v1/completions on port $port: $(head -c 400 "$WORK/completion.json")"
  node - "$REF" "$WORK/completion.json" "$what" <<'EOF'
const fs = require("fs");
const [refFile, outFile, what] = process.argv.slice(2);
const ref = JSON.parse(fs.readFileSync(refFile, "utf8").split("\n")[0]);
const out = JSON.parse(fs.readFileSync(outFile, "utf8"));
const text = out.choices[0].text;
console.log(`${what}: HTTP /v1/completions returned ${out.usage.completion_tokens} tokens, ` +
            `text ${text === ref.output_text ? "equal to" : "DIFFERENT from"} the reference`);
if (text !== ref.output_text) {
  console.error(`expected ${JSON.stringify(ref.output_text)}\n     got ${JSON.stringify(text)}`);
  process.exit(1);
}
EOF
}

# Scrapes http://127.0.0.1:PORT/metrics and checks that the router counted the
# generated tokens of the request(s) sent so far.
check_metrics() {
  local port=$1 what=$2 expected=$3
  curl -sf --max-time 5 "http://127.0.0.1:$port/metrics" >"$WORK/metrics.txt" ||
    die "$what: /metrics on port $port does not answer"
  local got
  got=$(awk '$1 == "pdserve_generation_tokens_total" {print $2}' "$WORK/metrics.txt")
  log "$what: /metrics answers ($(grep -c '^pdserve_' "$WORK/metrics.txt") pdserve_ samples)," \
      "pdserve_generation_tokens_total=$got"
  [ -n "$got" ] && [ "$(printf '%.0f' "$got")" = "$expected" ] ||
    die "$what: pdserve_generation_tokens_total is '$got', expected $expected"
}

# --- 3. `pdserve up` in one container. ----------------------------------------
PORT=$(free_port)
MPORT=$(free_port)
HPORT=$(free_port)
NAME="$TAG-up"
CONTAINERS+=("$NAME")
# The image's default command: `pdserve up` with the router on 0.0.0.0:50051
# its /metrics on 9090 and its OpenAI-compatible HTTP API on 8000.
log "running $IMAGE (default command: $(podman image inspect "$IMAGE" --format '{{.Config.Cmd}}'))" \
    "as $NAME, router on 127.0.0.1:$PORT, metrics on 127.0.0.1:$MPORT"
podman run -d --name "$NAME" -p "127.0.0.1:$PORT:50051" -p "127.0.0.1:$MPORT:9090" \
  -p "127.0.0.1:$HPORT:8000" "$IMAGE" >/dev/null
generate_and_check "127.0.0.1:$PORT" "pdserve up in a container"
check_metrics "$MPORT" "pdserve up in a container" "$MAX_TOKENS"
http_check "$HPORT" "pdserve up in a container"
# SIGTERM stops the whole process tree and `up` exits cleanly.
podman stop -t 30 "$NAME" >/dev/null
code=$(podman inspect "$NAME" --format '{{.State.ExitCode}}')
[ "$code" = "0" ] || die "pdserve up exited with $code after SIGTERM"
log "pdserve up stopped on SIGTERM with exit code 0"

# --- 4. The Kubernetes manifests with podman play kube. ------------------------
PORT=$(free_port)
MPORT=$(free_port)
HPORT=$(free_port)
NET="$TAG-net"
KUBE="$WORK/podman-test.yaml"
kubectl kustomize "$ROOT/deploy/k8s/overlays/podman-test" >"$WORK/rendered.yaml"
# The overlay publishes the router on 127.0.0.1:50051/9090/8000: use free ports.
sed -e "s/hostPort: 50051$/hostPort: $PORT/" -e "s/hostPort: 9090$/hostPort: $MPORT/" \
  -e "s/hostPort: 8000$/hostPort: $HPORT/" "$WORK/rendered.yaml" >"$KUBE"
grep -q "hostPort: $PORT" "$KUBE" && grep -q "hostPort: $MPORT" "$KUBE" &&
  grep -q "hostPort: $HPORT" "$KUBE" ||
  die "the podman-test overlay no longer publishes the router's ports 50051/9090/8000"
for d in $(awk '/^kind: Deployment/{d=1} d && /^  name: /{print $2; d=0}' "$KUBE"); do
  PODS+=("$d-pod-0")
done
for v in $(awk '/^kind: ConfigMap/{c=1} c && /^  name: /{print $2; c=0}' "$KUBE") \
         $(grep -oE 'name: pdserve-test-[a-z]+-(model|tmp)$' "$KUBE" | awk '{print $2}' | sort -u); do
  VOLUMES+=("$v")
done
[ "${#PODS[@]}" -eq 3 ] || die "expected 3 Deployments in the podman-test render, got ${PODS[*]}"
# Left over by an interrupted earlier run (the names are this test's own).
for p in "${PODS[@]}"; do
  if podman pod exists "$p"; then log "removing stale pod $p"; podman pod rm -f -t 0 "$p" >/dev/null; fi
done
for v in "${VOLUMES[@]}"; do
  if podman volume exists "$v"; then log "removing stale volume $v"; podman volume rm -f "$v" >/dev/null; fi
done
NETWORKS+=("$NET")
podman network create "$NET" >/dev/null
log "podman play kube: pods ${PODS[*]} on network $NET, router on 127.0.0.1:$PORT"
podman play kube --network "$NET" "$KUBE" >"$WORK/play.log" 2>&1 ||
  { cat "$WORK/play.log"; die "podman play kube failed"; }
for p in "${PODS[@]}"; do
  [ "$(podman pod inspect "$p" --format '{{.State}}')" = "Running" ] || die "pod $p is not running"
done
generate_and_check "127.0.0.1:$PORT" "podman play kube (router -> prefill -> decode pods)"
check_metrics "$MPORT" "podman play kube router" "$MAX_TOKENS"
# The router found the workers through DNS: its healthy endpoints are exactly
# the prefill and decode pods' addresses on the podman network. (Scraped
# again for up to 20 s: on a loaded machine a health poll can answer late,
# and the gauge reads 0 until the next one.)
for role in prefill decode; do
  infra=$(podman pod inspect "pdserve-$role-pod-0" --format '{{.InfraContainerID}}') ||
    die "podman pod inspect pdserve-$role-pod-0 failed"
  ip=$(podman inspect "$infra" --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}') ||
    die "podman inspect of $role's infra container failed"
  port=$([ "$role" = prefill ] && echo 50052 || echo 50053)
  healthy=""
  for try in $(seq 1 20); do
    healthy=$(awk -v pool="pool=\"$role\"" 'index($0, "pdserve_worker_healthy{") == 1 && index($0, pool) && $2 == 1' \
                "$WORK/metrics.txt" | { grep -oE 'endpoint="[^"]*"' || true; } | tr '\n' ' ')
    [ "$healthy" = "endpoint=\"$ip:$port\" " ] && break
    sleep 1
    curl -sf --max-time 5 "http://127.0.0.1:$MPORT/metrics" >"$WORK/metrics.txt" ||
      die "podman play kube router: /metrics on port $MPORT does not answer"
  done
  [ "$healthy" = "endpoint=\"$ip:$port\" " ] ||
    die "router's healthy $role endpoints are '$healthy', expected the pod at $ip:$port"
  log "router routes $role to pod pdserve-$role-pod-0 at $ip:$port (resolved by DNS)"
done
http_check "$HPORT" "podman play kube router"
log "PASS in $(($(date +%s) - START))s"
