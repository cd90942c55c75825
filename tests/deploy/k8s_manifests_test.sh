#!/usr/bin/env bash
# Fast deployment test (CTest label `deploy`): renders every kustomize target
# under deploy/k8s with `kubectl kustomize`, validates every rendered object
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
# committed. A lock directory keeps parallel test runs from racing npm.
if [ ! -d "$SCHEMA/node_modules/kubernetes-models" ]; then
  echo "installing the schema packages (npm ci) in $SCHEMA"
  (cd "$SCHEMA" && flock "$SCHEMA/package.json" npm ci --no-audit --no-fund --loglevel=error)
fi

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# 1. Render every target.
TARGETS=(base overlays/cpu overlays/gpu overlays/podman-test
         examples/cpu-model-pvc examples/gpu-model-image-volume
         addons/prometheus-adapter)
for t in "${TARGETS[@]}"; do
  out="$OUT/$(echo "$t" | tr / _).yaml"
  if ! kubectl kustomize "$K8S/$t" >"$out" 2>"$OUT/err"; then
    fail "kubectl kustomize $t: $(cat "$OUT/err")"
  fi
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

# 4. Every flag in the ConfigMaps exists in the binary (absl rejects an unknown
#    flag in a --flagfile, and Kubernetes would crash-loop the pod).
if [ ! -x "$PDSERVE" ]; then
  fail "pdserve binary not found at $PDSERVE (build it first)"
else
  n=0
  for f in "$OUT"/flags/*.flags; do
    n=$((n + 1))
    if ! "$PDSERVE" version "--flagfile=$f" >/dev/null 2>"$OUT/flag.err"; then
      fail "flags $(basename "$f") rejected by $PDSERVE: $(grep -m1 -i error "$OUT/flag.err" || head -n1 "$OUT/flag.err")"
    fi
  done
  echo "checked $n rendered flag files against $PDSERVE"
fi

if [ "$failures" -gt 0 ]; then
  echo "k8s_manifests_test: $failures failure(s)" >&2
  exit 1
fi
echo "k8s_manifests_test: PASS (${#TARGETS[@]} targets rendered and valid)"
