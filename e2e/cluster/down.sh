#!/usr/bin/env bash
# Stops the cluster e2e/cluster/up.sh started in RUN_DIR, by the PIDs it
# recorded, with the containers' shims and mounts, and undoes its host
# changes (sysctls, the bridge, iptables chains, /var/lib/kubelet).
#
# Usage: e2e/cluster/down.sh [RUN_DIR] [--keep]   (--keep leaves RUN_DIR's logs)
set -uo pipefail
RUN=$(realpath -m "${1:-${HANDOFF_E2E_DIR:-${TMPDIR:-/tmp}/handoff-e2e}}")
log() { echo "cluster: $*" >&2 || true; } # stderr may be a closed pipe (go test gone)
[ -f "$RUN/pids" ] || { log "no cluster in $RUN"; exit 0; }

# Newest first: the kubelet and containerd before the control plane.
tac "$RUN/pids" | while read -r pid name; do
  kill -TERM "$pid" 2>/dev/null || continue
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null && log "killed $name ($pid)"
done
# The shims and the containers outlive containerd: kill every process in
# the pods' cgroups (the kubelet's kubepods, in each hierarchy), then the
# shims, then remove the cgroups, deepest first.
for round in 1 2 3; do
  pids=$(find /sys/fs/cgroup -path '*/kubepods*' -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
  [ -z "$pids" ] && break
  kill -KILL $pids 2>/dev/null
  sleep 0.5
done
for pid in $(pgrep -f "containerd-shim.*$RUN/containerd" || true); do kill -KILL "$pid" 2>/dev/null; done
sleep 0.5
find /sys/fs/cgroup -depth -type d -path '*/kubepods*' -exec rmdir {} \; 2>/dev/null
grep " $RUN/" /proc/mounts | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done

# The chains the kubelet and kube-proxy leave in both families, which
# kube-proxy --cleanup (in the undo list) does not remove.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for t in filter nat mangle; do
    for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
      for parent in INPUT OUTPUT PREROUTING POSTROUTING; do
        while "$ipt" -t "$t" -D "$parent" -j "$c" 2>/dev/null; do :; done
      done
      "$ipt" -t "$t" -F "$c" 2>/dev/null && "$ipt" -t "$t" -X "$c" 2>/dev/null
    done
  done
done
# kube-router's firewall (up.sh records this in its undo): the jumps it
# added to INPUT, FORWARD and OUTPUT, its chains, and its ipsets. Its own
# --cleanup-config leaves them (and then crashes in its IPVS cleanup).
kube_router_cleanup() {
  local ipt chains c
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    "$ipt-save" -t filter 2>/dev/null | grep -- '--comment "kube-router netpol' | grep '^-A ' | sed 's/^-A /-D /' |
      while read -r rule; do eval "$ipt -t filter $rule" || true; done
    chains=$("$ipt-save" -t filter 2>/dev/null | sed -n 's/^:\(KUBE-\(ROUTER\|POD-FW\|NWPLCY\|SRC\|DST\)[-A-Z0-9]*\) .*/\1/p')
    for c in $chains; do "$ipt" -t filter -F "$c"; done
    for c in $chains; do "$ipt" -t filter -X "$c"; done
  done
  if command -v ipset >/dev/null; then
    ipset list -n 2>/dev/null | grep -E '^(KUBE-(DST|SRC)-|kube-router-)' | while read -r set; do ipset destroy "$set"; done
  fi
  return 0
}
tac "$RUN/undo" | while read -r line; do eval "$line" >/dev/null 2>&1 || log "could not undo: $line"; done
rm -f "$RUN/pids"
if [ "${2:-}" != --keep ]; then rm -rf "$RUN"; fi
log "stopped"
exit 0
