#!/usr/bin/env bash
# Lints the charts as a platform team would before installing them:
# `helm lint --strict` of charts/handoff (defaults, and every knob set:
# deploy/testdata/every-knob.yaml), of charts/handoff-workload (defaults,
# and a workload's values), of an umbrella chart that depends on
# charts/handoff (deploy/testdata/umbrella) and of one with both charts
# (deploy/testdata/umbrella-workload);
# then kubeconform -strict on what each renders, against the schemas of
# every supported Kubernetes version, made offline from that version's
# swagger.json (hack/kubeschemas, kept in $HANDOFF_CACHE/kubeschemas).
#
# Usage: bash hack/chartlint.sh   (make lint runs it)
set -euo pipefail
cd "$(dirname "$0")/.."

# The supported Kubernetes versions: the oldest and the newest (Makefile's
# KUBE_OLDEST and KUBE_NEWEST).
VERSIONS=(v1.35.4 v1.37.2)
CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
SCHEMAS="$CACHE/kubeschemas"

bin=$(bash hack/tools.sh)
export HELM_PLUGINS="$bin/helm-plugins"
helm="$bin/helm"
log() { echo "chartlint: $*" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

workload=(--set serviceAccount.name=orders --set 'leases={orders-leader}' --set shards.prefix=orders- --set shards.count=4)
"$helm" dependency update --skip-refresh deploy/testdata/umbrella >/dev/null
"$helm" dependency update --skip-refresh deploy/testdata/umbrella-workload >/dev/null
for v in "${VERSIONS[@]}"; do
  kv=${v#v}
  "$helm" lint --strict --quiet charts/handoff --kube-version "$kv"
  "$helm" lint --strict --quiet charts/handoff --kube-version "$kv" -f deploy/testdata/every-knob.yaml
  # The monitoring kit (Prometheus Operator kinds: no schema here for
  # kubeconform; helm-unittest and charts/monitoring_test.go check them).
  "$helm" lint --strict --quiet charts/handoff --kube-version "$kv" --set monitoring.podMonitor.enabled=true \
    --set monitoring.serviceMonitor.enabled=true --set 'monitoring.podMonitor.namespaces={shop}' --set monitoring.labels.release=prometheus \
    --set monitoring.prometheusRule.enabled=true --set monitoring.prometheusRule.labels.team=platform --set monitoring.dashboard.enabled=true
  "$helm" lint --strict --quiet charts/handoff-workload --kube-version "$kv"
  "$helm" lint --strict --quiet charts/handoff-workload --kube-version "$kv" "${workload[@]}"
  "$helm" lint --strict --quiet deploy/testdata/umbrella-workload --kube-version "$kv"
  "$helm" lint --strict --quiet deploy/testdata/umbrella --kube-version "$kv"

  go run ./hack/kubeschemas -version "$v" -out "$SCHEMAS"
  "$helm" template handoff charts/handoff -n handoff --kube-version "$kv" --set createNamespace=true >"$work/default.yaml"
  "$helm" template knobs charts/handoff -n knobs --kube-version "$kv" -f deploy/testdata/every-knob.yaml >"$work/every-knob.yaml"
  "$helm" template orders charts/handoff-workload -n shop --kube-version "$kv" "${workload[@]}" >"$work/workload.yaml"
  "$helm" template platform deploy/testdata/umbrella -n platform --kube-version "$kv" >"$work/umbrella.yaml"
  log "kubeconform -strict, Kubernetes $v"
  "$bin/kubeconform" -strict -summary -kubernetes-version "$kv" -schema-location "$SCHEMAS" \
    "$work/default.yaml" "$work/every-knob.yaml" "$work/workload.yaml" "$work/umbrella.yaml" deploy/handoff.yaml
done
