#!/usr/bin/env bash
# Fast deployment test (CTest label `deploy`): renders every kustomize target
# under deploy/k8s with `kubectl kustomize` (the kubectl on PATH and, where
# that is not Debian 12's kubectl 1.20 with kustomize 2.0.3, also Debian's,
# kept by scripts/install_deps.sh: both must render the same objects, see
# docs/deploy.md), validates every rendered object
# offline (tests/deploy/schema/validate.js: kubernetes-models schemas plus
# cross-object consistency), proves that the validator rejects broken
# manifests (negative controls), and checks that every flag in the flags
# ConfigMaps is a flag the pdserve binary knows.
# usage: k8s_manifests_test.sh [PDSERVE_BINARY]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDSERVE=${1:-$ROOT/build/pdserve}
SCHEMA=$ROOT/tests/deploy/schema
K8S=$ROOT/deploy/k8s

for tool in kubectl node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is required (kubectl with built-in kustomize, Node.js >= 14 with npm)" >&2
    exit 1
  fi
done

# The schema packages are pinned by package-lock.json; node_modules is not
# committed. The check and the install run under one lock, and the marker is
# written only after npm ci succeeded, so parallel runs never race npm.
(cd "$SCHEMA" && flock "$SCHEMA/package.json" sh -c '
  test -f node_modules/.pdserve-installed && exit 0
  echo "installing the schema packages (npm ci) in $PWD"
  npm ci --no-audit --no-fund --loglevel=error &&
    touch node_modules/.pdserve-installed')

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# 1. Render every target with every kustomize at hand; the first one's render
#    is validated below, the others must hold the same objects.
# kubectl 1.20 prints no "Kustomize Version" line: its kustomize is 2.0.3.
kustomize_version() {
  "$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: //p' | grep . || echo "v2.0.3"
}
RENDERERS=("$(command -v kubectl)")
DEBIAN_KUBECTL=${PDSERVE_DEBIAN_KUBECTL:-/var/cache/pdserve/kubernetes-client/usr/bin/kubectl}
if [ "$(kustomize_version kubectl)" != "v2.0.3" ]; then
  if [ -x "$DEBIAN_KUBECTL" ]; then
    RENDERERS+=("$DEBIAN_KUBECTL")
  else
    fail "Debian 12's kubectl 1.20 (kustomize 2.0.3) is not at $DEBIAN_KUBECTL:" \
         "run scripts/install_deps.sh, which keeps it there when kubectl is another version"
  fi
fi
for r in "${RENDERERS[@]}"; do echo "renderer: $r (kustomize $(kustomize_version "$r"))"; done
if [ "${#RENDERERS[@]}" -eq 1 ]; then
  echo "only one kustomize here: the cross-version comparison runs where a current kubectl is installed too"
fi
TARGETS=(base overlays/cpu overlays/gpu overlays/podman-test
         examples/cpu-model-pvc examples/gpu-model-image-volume
         addons/prometheus-adapter)
for t in "${TARGETS[@]}"; do
  out="$OUT/$(echo "$t" | tr / _).yaml"
  for i in "${!RENDERERS[@]}"; do
    render="$out"
    [ "$i" -eq 0 ] || render="$OUT/alt$i-$(basename "$out")"
    if ! "${RENDERERS[$i]}" kustomize "$K8S/$t" >"$render" 2>"$OUT/err"; then
      fail "${RENDERERS[$i]} kustomize $t: $(cat "$OUT/err")"
    elif [ "$i" -gt 0 ] && [ -s "$out" ]; then
      node "$SCHEMA/same_objects.js" "$out" "$render" >"$OUT/same" 2>&1 ||
        fail "$t: ${RENDERERS[0]} and ${RENDERERS[$i]} render different objects: $(cat "$OUT/same")"
      echo "$t: $(cat "$OUT/same") from kustomize $(kustomize_version "${RENDERERS[0]}") and $(kustomize_version "${RENDERERS[$i]}")"
    fi
  done
done
ADAPTER="$OUT/addons_prometheus-adapter.yaml"
VALIDATE=(node "$SCHEMA/validate.js" "--adapter=$ADAPTER"
          "--metric_defs=$ROOT/common/metrics/metric_defs.cc")

# 2. Validate every render (schema + consistency).
mkdir -p "$OUT/flags"
for t in "${TARGETS[@]}"; do
  out="$OUT/$(echo "$t" | tr / _).yaml"
  [ -s "$out" ] || continue
  extra=()
  if [ "$t" = overlays/podman-test ]; then extra=(--podman); fi
  "${VALIDATE[@]}" "${extra[@]}" "--dump_flagfiles=$OUT/flags" "$out" || fail "validation of $t"
done

# 3. Negative controls: each broken variant of the CPU render must be rejected,
#    so a green run means the checks above really look at these fields.
CPU="$OUT/overlays_cpu.yaml"
negative() {
  local what=$1 expr=$2 broken="$OUT/broken.yaml"
  sed "$expr" "$CPU" >"$broken"
  if cmp -s "$CPU" "$broken"; then
    fail "negative control '$what': the edit '$expr' changed nothing"
  elif "${VALIDATE[@]}" "$broken" >/dev/null 2>"$OUT/neg.err"; then
    fail "negative control '$what' was accepted"
  else
    echo "negative control rejected as expected: $what ($(head -n1 "$OUT/neg.err" | sed 's/^ *//'))"
  fi
}
negative "containerPort is a string" '0,/containerPort: 50053/s//containerPort: "50053"/'
negative "unknown kind" '0,/kind: PodDisruptionBudget/s//kind: PodDisruptionBudgets/'
negative "grace period shorter than the drain" 's/terminationGracePeriodSeconds: 40/terminationGracePeriodSeconds: 25/'
negative "probe on the wrong port" '0,/^            port: 50053$/s//            port: 50063/'
negative "router resolves a Service that does not exist" 's#dns:///pdserve-prefill\.#dns:///pdserve-prefil.#'
negative "HPA metric without an adapter rule" 's/name: pdserve_prefill_queue_depth/name: pdserve_prefill_queue_len/'
negative "Deployment selector does not match its pods" '0,/^      app.kubernetes.io\/component: decode$/s//      app.kubernetes.io\/component: decoder/'
negative "Service targets a port name no pod has" '0,/targetPort: grpc$/s//targetPort: grpc-public/'
negative "one Deployment's shared pod settings drifted" '0,/runAsUser: 10001/s//runAsUser: 10002/'
# The cross-version comparison sees a changed field, and ignores only the
# generated name's hash.
sed '0,/sizeLimit: 256Mi/s//sizeLimit: 512Mi/' "$CPU" >"$OUT/changed.yaml"
if node "$SCHEMA/same_objects.js" "$CPU" "$OUT/changed.yaml" >/dev/null 2>&1; then
  fail "negative control: same_objects.js accepted a changed sizeLimit"
else
  echo "negative control rejected as expected: same_objects.js sees a changed sizeLimit"
fi
sed 's/pdserve-flags-[a-z0-9]\{10\}$/pdserve-flags-abcde12345/' "$CPU" >"$OUT/rehashed.yaml"
cmp -s "$CPU" "$OUT/rehashed.yaml" && fail "control: the ConfigMap hash edit changed nothing"
node "$SCHEMA/same_objects.js" "$CPU" "$OUT/rehashed.yaml" >/dev/null ||
  fail "control: same_objects.js must ignore only the generated ConfigMap hash"

# 4. Every flag in the ConfigMaps is a flag of the role that reads the file
#    (pdserve refuses an unknown or another subcommand's flag, also in a
#    --flagfile, and Kubernetes would crash-loop the pod). device.flags is
#    read by both workers.
if [ ! -x "$PDSERVE" ]; then
  fail "pdserve binary not found at $PDSERVE (build it first)"
else
  n=0
  for f in "$OUT"/flags/*.flags; do
    n=$((n + 1))
    base=$(basename "$f" .flags)
    case "$base" in
      *router*) roles=router ;;
      *prefill*) roles=prefill ;;
      *decode*) roles=decode ;;
      *) roles="prefill decode" ;;
    esac
    for role in $roles; do
      "$PDSERVE" "$role" --help >"$OUT/help.txt" 2>&1 || fail "pdserve $role --help failed"
      for flag in $(grep -oE '^--[a-z0-9_]+' "$f"); do
        grep -q -- "^  $flag " "$OUT/help.txt" ||
          fail "flags $(basename "$f"): $flag is not a flag of pdserve $role"
      done
    done
  done
  echo "checked $n rendered flag files against $PDSERVE"
fi

if [ "$failures" -gt 0 ]; then
  echo "k8s_manifests_test: $failures failure(s)" >&2
  exit 1
fi
echo "k8s_manifests_test: PASS (${#TARGETS[@]} targets rendered and valid)"
