#!/usr/bin/env bash
# promtool check config for deploy/prometheus/prometheus-kubernetes.yml.
# Debian's prometheus/promtool are built without Kubernetes service discovery,
# so the two-line `kubernetes_sd_configs: [- role: pod]` stanza is swapped for
# an equivalent static one in a temporary copy; everything else (relabelling
# regexes, rule files, globals) is checked by promtool as written.
set -euo pipefail
repo="${1:-$(pwd)}"
src="$repo/deploy/prometheus/prometheus-kubernetes.yml"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -r "$repo/deploy/prometheus/rules" "$tmp/rules"
grep -q '^    kubernetes_sd_configs:$' "$src" || { echo "no kubernetes_sd_configs in $src"; exit 1; }
grep -q '^      - role: pod$' "$src" || { echo "kubernetes_sd_configs is not role: pod"; exit 1; }
sed -e 's/^    kubernetes_sd_configs:$/    static_configs:/' \
    -e 's/^      - role: pod$/      - targets: ["10.0.0.1:9090"]/' "$src" > "$tmp/prometheus.yml"
promtool check config "$tmp/prometheus.yml"
