#!/usr/bin/env bash
# Boots a single-node Kubernetes v1.35 on this machine without Docker: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, a
# kubelet on containerd + runc (Debian packages, installed if missing) and
# kube-router's NetworkPolicy firewall. The
# node and the control plane share the host; pods get addresses on the
# bridge handoff0 (10.89.0.0/24, the host is 10.89.0.1, where the API
# listens). Every file is under one run directory; e2e/cluster/down.sh stops
# what this started (by PID) and undoes the host changes it recorded.
#
# Usage: e2e/cluster/up.sh [RUN_DIR]     (default $TMPDIR/handoff-e2e)
# Prints the kubeconfig path on stdout when the node is Ready.
#
# HANDOFF_E2E_REGISTRY    the OCI registry the node pulls images from,
#                         127.0.0.1:PORT, plain HTTP (hack/registry.sh
#                         starts one; the e2e tests do). Required.
# HANDOFF_E2E_PAUSE_IMAGE the sandbox (pause) image in that registry, by
#                         digest: any static binary that blocks until a
#                         signal (e2e/cluster/pause, built with ko by the
#                         e2e tests). Required.
# HANDOFF_E2E_WATCH_PID   if set, also leaves a watchdog that runs down.sh
#                         once that process exits (the e2e tests set it, so a
#                         killed test binary does not leave a cluster).
set -euo pipefail
RUN=$(realpath -m "${1:-${HANDOFF_E2E_DIR:-${TMPDIR:-/tmp}/handoff-e2e}}")
cd "$(dirname "$0")/../.."
BRIDGE=handoff0 HOST_IP=10.89.0.1 POD_CIDR=10.89.0.0/24 SERVICE_CIDR=10.96.0.0/24 SERVICE_IP=10.96.0.1
log() { echo "cluster: $*" >&2; }

REGISTRY=${HANDOFF_E2E_REGISTRY:-} PAUSE_IMAGE=${HANDOFF_E2E_PAUSE_IMAGE:-}
[[ "$REGISTRY" =~ ^127\.0\.0\.1:[0-9]+$ ]] || { log "HANDOFF_E2E_REGISTRY \"$REGISTRY\": want the loopback registry the node pulls from, 127.0.0.1:PORT (hack/registry.sh start DIR PORT)"; exit 1; }
[[ "$PAUSE_IMAGE" == "$REGISTRY/"*@sha256:* ]] || { log "HANDOFF_E2E_PAUSE_IMAGE \"$PAUSE_IMAGE\": want the pause image in $REGISTRY by digest ($REGISTRY/...@sha256:...)"; exit 1; }
if [ -f "$RUN/pids" ]; then
  log "$RUN already has a cluster; run e2e/cluster/down.sh $RUN first"
  exit 1
fi
# One cluster per machine: clusters would share the bridge, the ports and
# the kubelet's cgroups, which down.sh clears. $OWNER names the run until
# its down.sh has undone everything.
OWNER=/run/handoff-e2e-cluster
if other=$(cat "$OWNER" 2>/dev/null); then
  if [ -f "$other/pids" ]; then
    log "another e2e cluster runs, or was not stopped, from $other; wait for it, or stop it with e2e/cluster/down.sh $other"
  else
    log "the e2e cluster of $other was not stopped cleanly and its record is gone: stop what is left by hand (kube-*, etcd, containerd and its shims, the bridge $BRIDGE, KUBE-* chains in iptables and ip6tables, mounts under the run directory, kubepods cgroups, /var/lib/kubelet, the sysctls net.ipv4.ip_forward vm.overcommit_memory kernel.panic kernel.panic_on_oops), then remove $OWNER"
  fi
  exit 1
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "the bridge $BRIDGE exists but no e2e cluster owns it (a run that was not stopped cleanly?): stop what is left, then ip link del $BRIDGE"
  exit 1
fi
missing=()
for p in containerd runc iptables ipset openssl; do command -v "$p" >/dev/null || missing+=("$p"); done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} from Debian"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
BIN=$(bash hack/kube-assets.sh kubectl kube-controller-manager kube-scheduler kube-proxy kubelet)
mkdir -p "$RUN"/{pki,logs,etcd,containerd/certs.d/"$REGISTRY",cni/net.d,cni/ipam,kubelet/root,kubelet/plugins,kubelet/logs}
: >"$RUN/pids"
: >"$RUN/undo"
echo "$RUN" >"$OWNER"
echo "rm -f $OWNER" >>"$RUN/undo"
if [ -n "${HANDOFF_E2E_WATCH_PID:-}" ]; then
  [[ "$HANDOFF_E2E_WATCH_PID" =~ ^[0-9]+$ ]] || { log "HANDOFF_E2E_WATCH_PID $HANDOFF_E2E_WATCH_PID: want a process id"; exit 1; }
  # In a session of its own, so the signal that stops a process group (^C)
  # does not stop it too; down.sh is copied, so it outlives the checkout.
  cp e2e/cluster/down.sh "$RUN/down.sh"
  setsid -f bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done
    [ -f "$2/pids" ] && echo "process $1 is gone; stopping its cluster" && bash "$2/down.sh" "$2"' \
    watchdog "$HANDOFF_E2E_WATCH_PID" "$RUN" </dev/null >>"$RUN/watchdog.log" 2>&1
  log "will stop the cluster when process $HANDOFF_E2E_WATCH_PID exits"
fi

# Host changes, each with its undo, so down.sh can revert them.
[ -e /proc/sys/net/bridge ] || modprobe br_netfilter
for s in vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
  echo "sysctl -qw $s=$(sysctl -n "$s" 2>/dev/null || echo 0)" >>"$RUN/undo"
done
[ -d /var/lib/kubelet ] || echo "rm -rf /var/lib/kubelet" >>"$RUN/undo"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  echo "ip link del $BRIDGE" >>"$RUN/undo"
fi

# Certificates: one CA; the apiserver's serving certificate; one
# system:masters client for every component; the service-account keys.
pki=$RUN/pki
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=handoff-e2e-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() { # name subject [SANs]
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  local ext=$pki/$1.ext
  echo "basicConstraints=CA:FALSE" >"$ext"
  [ -n "${3:-}" ] && echo "subjectAltName=$3" >>"$ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
}
cert apiserver /CN=kube-apiserver "IP:$HOST_IP,IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=admin"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
KUBECONFIG=$RUN/kubeconfig
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://$HOST_IP:6443", certificate-authority: $pki/ca.crt}}]
users: [{name: admin, user: {client-certificate: $pki/admin.crt, client-key: $pki/admin.key}}]
contexts: [{name: e2e, context: {cluster: e2e, user: admin}}]
current-context: e2e
EOF

start() { # name command...
  local name=$1; shift
  "$@" >"$RUN/logs/$name.log" 2>&1 &
  echo "$! $name" >>"$RUN/pids"
}
wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$what not up after ${secs}s; see $RUN/logs"; return 1
}
kctl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

# Feature gates: Kubernetes 1.35 has the RestartAllContainers restart rule
# (KEP-5532) as an alpha gate, with NodeDeclaredFeatures, which it needs;
# 1.36 made it beta, on by default. TestRestartAllContainersResumes uses it.
gates=()
case "$("$BIN/kubelet" --version)" in
  *" v1.35."*) gates=(--feature-gates=RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true) ;;
esac

start etcd "$BIN/etcd" --data-dir "$RUN/etcd" --listen-client-urls http://127.0.0.1:23790 \
  --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 --unsafe-no-fsync
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:23790 \
  --bind-address "$HOST_IP" --advertise-address "$HOST_IP" --secure-port 6443 \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
  --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
  --authorization-mode Node,RBAC --allow-privileged \
  --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
  --kubelet-preferred-address-types Hostname,InternalIP "${gates[@]}"
wait_for kube-apiserver 60 kctl get --raw /readyz
# Every controller but node IPAM (the bridge plugin assigns pod addresses)
# and, where the version still has it, the cloud node lifecycle (no cloud):
# 1.37 removed it, and an unknown name stops kube-controller-manager.
controllers='*,-nodeipam'
if "$BIN/kube-controller-manager" --help 2>&1 | grep -q cloud-node-lifecycle; then controllers+=',-cloud-node-lifecycle'; fi
start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" --leader-elect=false \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" --use-service-account-credentials \
  --secure-port 0 --controllers "$controllers" "${gates[@]}"
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" --leader-elect=false --secure-port 0 "${gates[@]}"
start kube-proxy "$BIN/kube-proxy" --kubeconfig "$KUBECONFIG" --hostname-override 127.0.0.1 \
  --cluster-cidr "$POD_CIDR" --proxy-mode iptables --conntrack-max-per-core 0 \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
echo "$BIN/kube-proxy --cleanup" >>"$RUN/undo"

# containerd, pulling every image (the sandbox's too) from the loopback
# registry over plain HTTP: a hosts.toml for it under config_path, as on a
# node with a registry mirror.
cat >"$RUN/containerd/config.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$RUN/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$RUN/containerd/certs.d"
EOF
cat >"$RUN/containerd/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "http://$REGISTRY"
[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
cat >"$RUN/cni/net.d/10-handoff.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "handoff", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$HOST_IP"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
start containerd containerd --config "$RUN/containerd/config.toml"
SOCK=$RUN/containerd/containerd.sock
wait_for containerd 30 ctr --address "$SOCK" version

cat >"$RUN/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $pki/ca.crt}}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
volumePluginDir: $RUN/kubelet/plugins
podLogsDir: $RUN/kubelet/logs
readOnlyPort: 0
serializeImagePulls: false
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
# No image garbage collection: on a disk over 85% full the kubelet
# collected the pause image of a CI run halfway (then imported, not
# pulled) and every later pod failed to start; a collected image is pulled
# again now, but a pull in the middle of a timed handover skews it. 100
# turns it off.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
start kubelet "$BIN/kubelet" --config "$RUN/kubelet/config.yaml" --kubeconfig "$KUBECONFIG" \
  --root-dir "$RUN/kubelet/root" --hostname-override 127.0.0.1 "${gates[@]}"
wait_for "node 127.0.0.1 Ready" 90 kctl wait --for=condition=Ready node/127.0.0.1 --timeout=1s
wait_for "the default ServiceAccount" 30 kctl -n default get serviceaccount default

# NetworkPolicy enforced, as on a cluster with a policy plugin: kube-router's
# firewall alone (iptables and ipsets on the bridge; no routing, no service
# proxy), built from the Go module proxy by hack/tools.sh. It admits what
# comes from the node itself (the kubelet's probes, the API server's pod
# proxy, the tests). SIG Network's kube-network-policies, which kind ships,
# needs nftables' queue statement, which this kernel lacks (no NFT_QUEUE).
KUBE_ROUTER=$(bash hack/tools.sh)/kube-router
start kube-router "$KUBE_ROUTER" --run-firewall --run-router=false --run-service-proxy=false \
  --kubeconfig "$KUBECONFIG" --hostname-override 127.0.0.1 --service-cluster-ip-range "$SERVICE_CIDR" \
  --health-port 20244 --metrics-port 0 --iptables-sync-period 1m
echo "kube_router_cleanup" >>"$RUN/undo" # down.sh's
wait_for kube-router 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/20244 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && grep -q "200 OK" <&3'
log "node Ready; kubeconfig $KUBECONFIG; stop with e2e/cluster/down.sh $RUN"
echo "$KUBECONFIG"
