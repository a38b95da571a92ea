#!/usr/bin/env bash
# cgroup v2 only (kubelet.service runs it before the kubelet): enable every available
# controller for the root, /kubelet and /kubelet.slice, which the kubelet then manages.
set -euo pipefail
[[ -f /sys/fs/cgroup/cgroup.controllers ]] || { echo "not a cgroup v2 host" >&2; exit 1; }
enable_controllers() {
  local dir=/sys/fs/cgroup/$1 c
  mkdir -p "$dir"
  local controllers
  read -r -a controllers <"$dir/cgroup.controllers"
  for c in "${controllers[@]}"; do echo "+$c" >"$dir/cgroup.subtree_control"; done
}
enable_controllers .
enable_controllers kubelet
enable_controllers kubelet.slice
