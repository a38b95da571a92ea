#!/usr/bin/env bash
# Run before each start of the kubelet (11-kind.conf). The node's hostNetwork pods (kube-proxy,
# kindnet-lite) reach the API server by the name in kind's kubeadm config
# (`<cluster>-control-plane:6443`), but they resolve names through the pods' resolv.conf,
# which has no resolver (the entrypoint says why), and through the kubelet's copy of this
# node's /etc/hosts, made when the pod starts. On a worker that copy lacks the control plane,
# so the name is written into /etc/hosts here, as Docker's resolver on the node answers it,
# before the kubelet starts any pod. The control plane's own node has its name already.
set -euo pipefail
conf=/kind/kubeadm.conf
# Before kind wrote its config (the first starts at boot) there is nothing to resolve.
[[ -f $conf ]] || exit 0
endpoint=$(awk '$1 == "controlPlaneEndpoint:" || $1 == "apiServerEndpoint:" {print $2; exit}' "$conf" | tr -d '"')
host=${endpoint%:*}
[[ -n $host && ! $host =~ ^[0-9.]+$ ]] || exit 0
awk -v h="$host" '{for (i = 2; i <= NF; i++) if ($i == h) found = 1} END {exit !found}' /etc/hosts && exit 0
ip=$(getent ahostsv4 "$host" | awk '{print $1; exit}')
[[ -n $ip ]] || { echo "hosts-control-plane: $host does not resolve yet" >&2; exit 0; }
echo "$ip $host" >>/etc/hosts
echo "hosts-control-plane: $ip $host written to /etc/hosts"
