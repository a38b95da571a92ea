# shellcheck shell=bash
# shellcheck disable=SC2034 # variables are used by the scripts that source this file
# Settings for the kind path (sourced after e2e/cluster/lib.sh, whose versions it follows).
# Everything built lives in $KIND_CACHE, keyed by version, and is built once.

KIND_VERSION=$("$KG_REPO/hack/tool-version" sigs.k8s.io/kind) # hack/tools/go.mod
KIND_CACHE=${KIND_CACHE:-$KG_CACHE/kind}
KIND_BIN_DIR=$KIND_CACHE/bin        # kind and the node's Go binaries (not on the default PATH)
KIND_BIN=$KIND_BIN_DIR/kind-$KIND_VERSION

# Docker of our own (Debian's docker.io), on the default socket so that `docker` and kind find
# it; data and state under $KIND_CACHE and /run/kubegrace-docker, started by e2e/kind/docker.
KIND_DOCKER_ROOT=$KIND_CACHE/docker
KIND_DOCKER_RUN=/run/kubegrace-docker
KIND_DOCKER_SOCK=/var/run/docker.sock
KIND_DOCKERD=${KIND_DOCKERD:-/usr/sbin/dockerd}
# Debian's CLI, not whatever `docker` comes first on PATH (the daemon is 20.10).
KIND_DOCKER=${KIND_DOCKER:-/usr/bin/docker}
# Address pool of docker's bridges (the default bridge and kind's "kind" network).
KIND_DOCKER_BIP=172.29.0.1/24
KIND_DOCKER_POOL=172.29.0.0/16
# kind's pod range, not its default 10.244.0.0/16: the host routes it to the nodes (tests
# connect to pod IPs), and the local cluster (e2e/cluster) uses 10.244.0.0/24 on this host.
KIND_POD_SUBNET=10.245.0.0/16
KIND_SERVICE_SUBNET=10.96.0.0/16
# Nodes of a kind cluster: one control plane, the rest workers (`make kind-test KIND_NODES=3`).
KIND_NODES=${KIND_NODES:-1}

# What kind v0.30.0's own node image carries for Kubernetes v1.34 (kubeadm's defaults:
# `kubeadm config images list`), rebuilt here from source at the same versions.
KIND_NODE_K8S=$KG_K8S_VERSION
KIND_ETCD_VERSION=v3.6.5            # kubeadm v1.34's DefaultEtcdVersion (image tag 3.6.5-0)
KIND_COREDNS_VERSION=v1.12.1        # kubeadm v1.34's CoreDNSVersion
KIND_PAUSE_TAG=3.10.1               # kubeadm v1.34's PauseVersion
# kind v0.30.0's storage images (pkg/build/nodeimage/const_storage.go): local-path-provisioner
# at the release kind's image builds. (Its CNI image, kindnetd, is replaced: e2e/kind/kindnet-lite.)
KIND_LPP_VERSION=v0.0.30
KIND_LPP_TAG=v20250214-acbabc1a
KIND_LPH_TAG=v20241212-8ac705d0

KIND_NODE_IMAGE_LOCAL=localhost/kubegrace/kind-node:$KG_K8S_VERSION
KIND_NODE_DIR=$KIND_CACHE/node-$KG_K8S_VERSION   # rootfs, image archives, the saved node image

kind_log() { printf '[kubegrace-kind %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
kind_die() { kind_log "ERROR: $*"; exit 1; }

# Bounded where it enters: each node is a container with its own kubelet on these 2 cores.
[[ $KIND_NODES =~ ^[1-9]$ ]] || kind_die "KIND_NODES must be 1 to 9, not '$KIND_NODES'"
