# shellcheck shell=bash
# shellcheck disable=SC2034 # variables are used by the scripts that source this file
# Common settings of e2e/argo/{build,up,down} (sourced, not run), on top of e2e/cluster/lib.sh.
ARGO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../cluster/lib.sh
source "$ARGO_DIR/../cluster/lib.sh"

ARGO_MODULE=github.com/argoproj/argo-rollouts
ARGO_VERSION=$(awk -v m="$ARGO_MODULE" '$1 == "require" && $2 == m { print $3; exit } $1 == m && $2 ~ /^v[0-9]/ { print $2; exit }' "$ARGO_DIR/go.mod")
[[ $ARGO_VERSION == v* ]] || kg_die "could not read the version of $ARGO_MODULE from $ARGO_DIR/go.mod"
ARGO_BIN=$KG_BIN/rollouts-controller-$ARGO_VERSION
# In a subdirectory: e2e/cluster/images import-cached and e2e/kind/up load every
# $KG_IMAGES/*.tar, and this 90 MB image is only for the tests that ask for Argo Rollouts.
ARGO_ARCHIVE=$KG_IMAGES/argo/argo-rollouts-$ARGO_VERSION.tar
ARGO_REF=$KG_IMAGE_PREFIX/argo-rollouts:$ARGO_VERSION
ARGO_NS=argo-rollouts
# The release's CRDs (manifests/crds); up waits for each to be Established, down deletes them.
ARGO_CRDS=(rollouts.argoproj.io analysisruns.argoproj.io analysistemplates.argoproj.io
  clusteranalysistemplates.argoproj.io experiments.argoproj.io)
# The cluster: the one the cluster tests use (never the shell's KUBECONFIG), else the
# local cluster's admin kubeconfig.
ARGO_KUBECONFIG=${KUBEGRACE_E2E_KUBECONFIG:-$KG_KUBECONFIG}

argo_log() { printf '[kubegrace-argo %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
argo_kubectl() { "$KG_BIN/kubectl" --kubeconfig="$ARGO_KUBECONFIG" "$@"; }

# up and down one at a time (several engineers and tests share the cluster).
argo_lock() {
  mkdir -p /run/lock
  exec 7>/run/lock/kubegrace-argo.lock
  if ! flock -n 7; then
    argo_log "waiting for another e2e/argo/up or down to finish"
    flock -w 900 7 || kg_die "timed out waiting for /run/lock/kubegrace-argo.lock"
  fi
}

# Fails unless kubectl and the cluster's API server are there.
argo_need_cluster() {
  [[ -x $KG_BIN/kubectl ]] || kg_die "no kubectl in $KG_BIN (e2e/cluster/up installs the pinned one)"
  [[ -f $ARGO_KUBECONFIG ]] || kg_die "no kubeconfig at $ARGO_KUBECONFIG (is the local cluster up? e2e/cluster/up)"
  argo_kubectl get --raw /readyz >/dev/null 2>&1 ||
    kg_die "the API server of $ARGO_KUBECONFIG does not answer /readyz"
}
