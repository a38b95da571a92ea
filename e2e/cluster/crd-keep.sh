# shellcheck shell=bash
# Setting a CRD aside on the shared local cluster and putting it back as it was (sourced by
# charts/kubegrace/hack/test-upgrade and e2e/newcomer/run, which need a cluster without it).
# Needs kubectl and python3; `kubectl` uses $KUBECONFIG.

# crd_save NAME FILE: the CRD as it is, with its managedFields: a replace that carries them
# restores who owns which field (Helm 4 applies server-side, and a field left to another
# field manager is a conflict for it).
crd_save() {
  kubectl get crd "$1" -o json --show-managed-fields | python3 -c '
import json, sys
crd = json.load(sys.stdin)
crd.pop("status", None)
for key in ("resourceVersion", "uid", "creationTimestamp", "generation"):
    crd["metadata"].pop(key, None)
json.dump(crd, sys.stdout)' >"$2"
}

# crd_restore FILE: the saved CRD back (schema, labels, annotations, field managers). A
# create or replace that changes fields is recorded as a field manager of its own, so the
# saved managedFields go back in a second replace that changes nothing else.
crd_restore() {
  local name
  name=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["metadata"]["name"])' "$1")
  if kubectl get crd "$name" >/dev/null 2>&1; then
    kubectl replace -f "$1" >/dev/null || return
  else
    kubectl create -f "$1" >/dev/null || return
  fi
  kubectl get crd "$name" -o json | python3 -c '
import json, sys
live, saved = json.load(sys.stdin), json.load(open(sys.argv[1]))
live["metadata"]["managedFields"] = saved["metadata"]["managedFields"]
json.dump(live, sys.stdout)' "$1" | kubectl replace -f - >/dev/null
}
