#!/usr/bin/env python3
"""Checks a rendered kubegrace chart (`helm template` output on stdin).

What `helm lint` cannot see:
- every pod template meets the restricted Pod Security Standard (plus our own
  readOnlyRootFilesystem rule);
- the webhook configuration says what the design says (pods, CREATE only,
  sideEffects None, v1, reinvocation IfNeeded, path /mutate, no caBundle from
  the chart, cert-manager annotation in that mode) and its selectors send each
  pod to the webhook the right number of times (0 or 1), evaluated on a table
  of namespace/pod label combinations;
- the GraceRoute validating webhook (CREATE/UPDATE of graceroutes, path
  /validate, its failurePolicy, the same namespaces) when enabled;
- the names the operator is given as flags are the names the chart creates.

Usage: check-rendered.py --namespace NS --failure-policy Ignore|Fail \
           [--cert-manager] [--expect-prestop] [--namespace-selector JSON] \
           [--route-validation Ignore|Fail|none] < rendered.yaml
Needs PyYAML (Debian: python3-yaml).
"""

import argparse
import json
import sys

import yaml

INJECT = "kubegrace.io/inject"
NS_NAME = "kubernetes.io/metadata.name"

errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind):
    found = by_kind(docs, kind)
    check(len(found) == 1, f"expected exactly one {kind}, found {len(found)}")
    return found[0] if found else {}


def arg_value(args, flag):
    for a in args:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# --- restricted Pod Security Standard -------------------------------------


def check_pod_security(where, spec):
    psc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(not spec.get(key), f"{where}: {key} is set")
    for vol in spec.get("volumes") or []:
        check("hostPath" not in vol, f"{where}: hostPath volume {vol.get('name')}")
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    check(containers, f"{where}: no containers")
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        run_as_non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        check(run_as_non_root is True, f"{cw}: runAsNonRoot is not true")
        check(sc.get("runAsUser", psc.get("runAsUser")) != 0, f"{cw}: runs as UID 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        check(seccomp in ("RuntimeDefault", "Localhost"), f"{cw}: seccompProfile is {seccomp!r}")
        check(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation is not false")
        check(not sc.get("privileged"), f"{cw}: privileged")
        caps = sc.get("capabilities") or {}
        check("ALL" in (caps.get("drop") or []), f"{cw}: capabilities do not drop ALL")
        check(set(caps.get("add") or []) <= {"NET_BIND_SERVICE"}, f"{cw}: adds capabilities {caps.get('add')}")
        check(sc.get("readOnlyRootFilesystem") is True, f"{cw}: readOnlyRootFilesystem is not true")
        for p in c.get("ports") or []:
            check("hostPort" not in p, f"{cw}: hostPort {p.get('hostPort')}")


# --- webhook selectors ------------------------------------------------------


def matches(selector, labels):
    """Evaluates a LabelSelector the way the API server does."""
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def labels_matching(selector):
    """Namespace labels that satisfy the chart's extra namespaceSelector."""
    labels = dict((selector or {}).get("matchLabels") or {})
    for e in (selector or {}).get("matchExpressions") or []:
        if e["operator"] == "In":
            labels[e["key"]] = e["values"][0]
        elif e["operator"] == "Exists":
            labels[e["key"]] = "any"
    return labels


def times_sent(webhooks, ns_name, ns_inject, pod_inject, extra_ns_labels):
    ns_labels = dict(extra_ns_labels)
    ns_labels[NS_NAME] = ns_name
    if ns_inject is not None:
        ns_labels[INJECT] = ns_inject
    pod_labels = {"app": "web"}
    if pod_inject is not None:
        pod_labels[INJECT] = pod_inject
    return sum(
        1
        for w in webhooks
        if matches(w.get("namespaceSelector"), ns_labels) and matches(w.get("objectSelector"), pod_labels)
    )


PROBE_ENTRY = "check.inject.kubegrace.io"


def check_probe_entry(webhooks, opts):
    """The install check's entry: only without watchNamespaces; only the
    release namespace's pods labelled kubegrace.io/webhook-check=true and
    kubegrace.io/inject=enabled; never blocks (Ignore)."""
    probes = [w for w in webhooks if w.get("name") == PROBE_ENTRY]
    if opts.watch_namespaces:
        check(not probes, f"{PROBE_ENTRY} rendered with watchNamespaces (the probe uses a watched namespace)")
        return
    check(len(probes) == 1, f"expected one {PROBE_ENTRY} entry, found {len(probes)}")
    for w in probes:
        check(w.get("failurePolicy") == "Ignore", f"{PROBE_ENTRY}: failurePolicy {w.get('failurePolicy')}")
        check(w.get("sideEffects") == "None", f"{PROBE_ENTRY}: sideEffects")
        probe = {"app": "web", INJECT: "enabled", "kubegrace.io/webhook-check": "true"}
        ns = {NS_NAME: opts.namespace}
        check(matches(w.get("namespaceSelector"), ns) and matches(w.get("objectSelector"), probe),
              f"{PROBE_ENTRY}: the probe pod in {opts.namespace} is not sent")
        check(not matches(w.get("namespaceSelector"), {NS_NAME: "shop", INJECT: "enabled"}),
              f"{PROBE_ENTRY}: sent for another namespace")
        check(not matches(w.get("objectSelector"), {"app": "web", INJECT: "enabled"}),
              f"{PROBE_ENTRY}: sent for a pod without the check label")


def check_ca_injection(config, opts, names, which):
    """cert-manager injects the CA into a webhook configuration only when told to by
    its annotation, which must name the chart's Certificate, and only then."""
    annotations = (config.get("metadata") or {}).get("annotations") or {}
    got = annotations.get("cert-manager.io/inject-ca-from")
    if opts.cert_manager:
        want = f"{opts.namespace}/{names['certificate']}"
        check(got == want, f"{which}: cert-manager.io/inject-ca-from is {got!r}, want {want!r}")
    else:
        check("cert-manager.io/inject-ca-from" not in annotations, f"{which}: inject-ca-from set without cert-manager")


def check_webhook(docs, opts, names):
    mwc = one(docs, "MutatingWebhookConfiguration")
    webhooks = mwc.get("webhooks") or []
    check_probe_entry(webhooks, opts)
    webhooks = [w for w in webhooks if w.get("name") != PROBE_ENTRY]
    check(len(webhooks) == 2, f"expected 2 webhook entries, found {len(webhooks)}")
    check_ca_injection(mwc, opts, names, "mutating")
    for w in webhooks:
        ww = f"webhook {w.get('name')}"
        check(w.get("admissionReviewVersions") == ["v1"], f"{ww}: admissionReviewVersions")
        check(w.get("sideEffects") == "None", f"{ww}: sideEffects")
        check(w.get("failurePolicy") == opts.failure_policy, f"{ww}: failurePolicy {w.get('failurePolicy')}")
        check(w.get("reinvocationPolicy") == "IfNeeded", f"{ww}: reinvocationPolicy")
        check(isinstance(w.get("timeoutSeconds"), int), f"{ww}: timeoutSeconds")
        rules = w.get("rules") or []
        check(
            [(r.get("operations"), r.get("resources"), r.get("apiGroups")) for r in rules]
            == [(["CREATE"], ["pods"], [""])],
            f"{ww}: rules must be pods CREATE only, got {rules}",
        )
        svc = (w.get("clientConfig") or {}).get("service") or {}
        check(svc.get("name") == names["service"], f"{ww}: service {svc.get('name')}")
        check(svc.get("namespace") == opts.namespace, f"{ww}: service namespace {svc.get('namespace')}")
        check(svc.get("path") == "/mutate", f"{ww}: path {svc.get('path')}")
        # helm template has no cluster to look up: a caBundle here was
        # written by hand and would fight the operator or cainjector.
        check("caBundle" not in (w.get("clientConfig") or {}), f"{ww}: chart renders a caBundle")

    # (namespace, namespace label, pod label) -> times the pod is sent.
    table = [
        ("shop", "enabled", None, 1),
        ("shop", "enabled", "enabled", 1),  # both opt in: still once
        ("shop", "enabled", "disabled", 0),
        ("shop", None, "enabled", 1),
        ("shop", None, None, 0),
        ("shop", None, "disabled", 0),
        ("shop", "disabled", "enabled", 1),  # the more specific setting wins
        ("shop", "disabled", None, 0),
        ("shop", "bogus", None, 0),
        ("kube-system", "enabled", "enabled", 0),
        ("kube-public", "enabled", None, 0),
        ("kube-node-lease", None, "enabled", 0),
        (opts.namespace, "enabled", "enabled", 0),  # never the operator itself
    ]
    # The table holds for namespaces the extra namespaceSelector selects; a
    # namespace it does not select is never sent anything.
    extra = labels_matching(opts.namespace_selector)
    for ns, ns_inject, pod_inject, want in table:
        got = times_sent(webhooks, ns, ns_inject, pod_inject, extra)
        check(
            got == want,
            f"selectors: pod labelled {INJECT}={pod_inject} in namespace {ns} ({INJECT}={ns_inject}) "
            f"is sent {got} time(s), want {want}",
        )
    if opts.namespace_selector:
        for w in webhooks:
            sel = w.get("namespaceSelector") or {}
            for k, v in (opts.namespace_selector.get("matchLabels") or {}).items():
                check((sel.get("matchLabels") or {}).get(k) == v,
                      f"webhook {w.get('name')}: namespaceSelector.matchLabels lacks {k}={v}")
            for e in opts.namespace_selector.get("matchExpressions") or []:
                check(e in (sel.get("matchExpressions") or []),
                      f"webhook {w.get('name')}: namespaceSelector lacks the expression {e}")
        # Drop (or contradict) each extra requirement in turn: not sent.
        for k in opts.namespace_selector.get("matchLabels") or {}:
            without = {key: v for key, v in extra.items() if key != k}
            got = times_sent(webhooks, "shop", "enabled", "enabled", without)
            check(got == 0, f"selectors: a namespace without the extra label {k} is sent {got} time(s), want 0")
        for e in opts.namespace_selector.get("matchExpressions") or []:
            broken = dict(extra)
            if e["operator"] in ("In", "Exists"):
                broken.pop(e["key"], None)
            else:
                broken[e["key"]] = (e.get("values") or ["any"])[0]
            got = times_sent(webhooks, "shop", "enabled", "enabled", broken)
            check(got == 0, f"selectors: a namespace failing the extra expression {e} is sent {got} time(s), want 0")


def check_route_validation(docs, opts, names):
    """The GraceRoute ValidatingWebhookConfiguration, when enabled."""
    vwcs = by_kind(docs, "ValidatingWebhookConfiguration")
    if opts.route_validation == "none":
        check(not vwcs, "ValidatingWebhookConfiguration rendered with routeValidation disabled")
        return
    vwc = one(docs, "ValidatingWebhookConfiguration")
    names["vwc"] = (vwc.get("metadata") or {}).get("name")
    check_ca_injection(vwc, opts, names, "validating")
    webhooks = vwc.get("webhooks") or []
    check(len(webhooks) == 1, f"expected 1 validating webhook entry, found {len(webhooks)}")
    for w in webhooks:
        ww = f"validating webhook {w.get('name')}"
        check(w.get("admissionReviewVersions") == ["v1"], f"{ww}: admissionReviewVersions")
        check(w.get("sideEffects") == "None", f"{ww}: sideEffects")
        check(w.get("failurePolicy") == opts.route_validation, f"{ww}: failurePolicy {w.get('failurePolicy')}")
        rules = w.get("rules") or []
        check(
            [(sorted(r.get("operations") or []), r.get("resources"), r.get("apiGroups")) for r in rules]
            == [(["CREATE", "UPDATE"], ["graceroutes"], ["kubegrace.io"])],
            f"{ww}: rules must be graceroutes CREATE and UPDATE only (never status, never DELETE), got {rules}",
        )
        svc = (w.get("clientConfig") or {}).get("service") or {}
        check(svc.get("name") == names["service"], f"{ww}: service {svc.get('name')}")
        check(svc.get("path") == "/validate", f"{ww}: path {svc.get('path')}")
        check("caBundle" not in (w.get("clientConfig") or {}), f"{ww}: chart renders a caBundle")
        # Same namespaces as injection: excluded ones never, the extra
        # selector narrows.
        extra = labels_matching(opts.namespace_selector)
        for ns, want in (("shop", True), ("kube-system", False), (opts.namespace, False)):
            labels = dict(extra)
            labels[NS_NAME] = ns
            got = matches(w.get("namespaceSelector"), labels)
            check(got == want, f"{ww}: GraceRoutes in namespace {ns} sent: {got}, want {want}")
        for k in (opts.namespace_selector or {}).get("matchLabels") or {}:
            labels = {key: v for key, v in extra.items() if key != k}
            labels[NS_NAME] = "shop"
            check(not matches(w.get("namespaceSelector"), labels),
                  f"{ww}: a namespace without the extra label {k} is sent")


# --- watchNamespaces and the NetworkPolicy ------------------------------------

WORK_RESOURCES = {"graceroutes", "configmaps", "deployments", "statefulsets", "rollouts", "pods"}


def check_scope(docs, opts):
    """watchNamespaces: Roles there, nothing namespaced in the ClusterRole,
    the flag wired, both webhooks scoped to the list."""
    dep = one(docs, "Deployment")
    op = next((c for c in dep["spec"]["template"]["spec"]["containers"] if c.get("name") == "operator"), {})
    args = op.get("args") or []
    watch = opts.watch_namespaces
    flag = arg_value(args, "--watch-namespaces")
    op_cr = next((cr for cr in by_kind(docs, "ClusterRole") if cr["metadata"]["name"] == dep["metadata"]["name"]), {})
    cluster_resources = {res for r in op_cr.get("rules") or [] for res in r.get("resources") or []}
    # The heal probe's and the install check's Roles (pods create in the
    # probe's namespace) are checked with the operator's own Role.
    foreign_roles = [r for r in by_kind(docs, "Role") if r["metadata"].get("namespace") != opts.namespace
                     and not r["metadata"].get("name", "").endswith(("-webhook-probe", "-webhook-check"))]
    if not watch:
        check(flag is None, f"--watch-namespaces={flag} rendered without watchNamespaces")
        check(WORK_RESOURCES <= cluster_resources, f"ClusterRole lacks {WORK_RESOURCES - cluster_resources}")
        check(not foreign_roles, "Roles outside the release namespace without watchNamespaces")
        return
    check(flag is not None and sorted(flag.split(",")) == sorted(watch), f"--watch-namespaces={flag}, want {watch}")
    check(not (WORK_RESOURCES & cluster_resources),
          f"watchNamespaces set, but the ClusterRole still grants {WORK_RESOURCES & cluster_resources} cluster-wide")
    ns_rules = [r for r in op_cr.get("rules") or [] if "namespaces" in (r.get("resources") or [])]
    check([sorted(r.get("resourceNames") or []) for r in ns_rules] == [sorted(watch)]
          and all(r.get("verbs") == ["get", "list", "watch"] for r in ns_rules),
          f"namespaces rule must be get/list/watch (the webhook's cache) on {watch} only: {ns_rules}")
    sa = dep["spec"]["template"]["spec"].get("serviceAccountName")
    for ns in watch:
        roles = [r for r in foreign_roles if r["metadata"]["namespace"] == ns]
        check(len(roles) == 1, f"expected one Role in watched namespace {ns}, found {len(roles)}")
        res = {x for r in roles for rule in r.get("rules") or [] for x in rule.get("resources") or []}
        check(WORK_RESOURCES <= res, f"Role in {ns} lacks {WORK_RESOURCES - res}")
        rbs = [b for b in by_kind(docs, "RoleBinding") if b["metadata"].get("namespace") == ns]
        check(any(b["roleRef"]["name"] == (roles[0]["metadata"]["name"] if roles else None)
                  and any(s.get("name") == sa and s.get("namespace") == opts.namespace for s in b.get("subjects") or [])
                  for b in rbs), f"no RoleBinding in {ns} binds the operator's ServiceAccount")
    # Both webhooks: a namespace outside the list is never sent anything.
    webhooks = list(one(docs, "MutatingWebhookConfiguration").get("webhooks") or [])
    webhooks += [w for v in by_kind(docs, "ValidatingWebhookConfiguration") for w in v.get("webhooks") or []]
    extra = labels_matching(opts.namespace_selector)
    for w in webhooks:
        for ns, want in (("not-watched-" + watch[0], False), (watch[0], True)):
            labels = dict(extra)
            labels[NS_NAME] = ns
            labels[INJECT] = "enabled"
            got = matches(w.get("namespaceSelector"), labels)
            check(got == want, f"webhook {w.get('name')}: namespace {ns} selected {got}, want {want}")


def check_network_policy(docs, opts):
    nps = by_kind(docs, "NetworkPolicy")
    if opts.network_policy is None:
        check(not nps, "NetworkPolicy rendered while webhook.networkPolicy.enabled is false")
        return
    np = one(docs, "NetworkPolicy")
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    check(matches(np["spec"].get("podSelector"), pod_labels), "NetworkPolicy does not select the operator pods")
    check(np["spec"].get("policyTypes") == ["Ingress"], "NetworkPolicy policyTypes must be [Ingress]")
    op = next((c for c in dep["spec"]["template"]["spec"]["containers"] if c.get("name") == "operator"), {})
    ports = {p["name"]: p["containerPort"] for p in op.get("ports") or []}
    rules = np["spec"].get("ingress") or []
    to_webhook = [r for r in rules if any(p.get("port") == ports.get("webhook") for p in r.get("ports") or [])]
    check(len(to_webhook) == 1, f"expected one ingress rule for the webhook port, found {len(to_webhook)}")
    for r in to_webhook:
        peers = r.get("from") or []
        check(peers and all(set(p) == {"ipBlock"} for p in peers),
              "the webhook port must admit ipBlock peers only (never everyone)")
        check(sorted(p["ipBlock"]["cidr"] for p in peers) == sorted(opts.network_policy),
              f"webhook port peers {peers} != apiServerCIDRs {opts.network_policy}")
        check(len(r.get("ports") or []) == 1, "the webhook rule must open the webhook port only")


# --- names shared with the operator ----------------------------------------


def check_wiring(docs, opts, names):
    dep = one(docs, "Deployment")
    tmpl = ((dep.get("spec") or {}).get("template")) or {}
    pod_labels = (tmpl.get("metadata") or {}).get("labels") or {}
    spec = tmpl.get("spec") or {}
    check_pod_security(f"Deployment {dep.get('metadata', {}).get('name')}", spec)
    check(pod_labels.get(INJECT) == "disabled", "operator pods are not labelled kubegrace.io/inject=disabled")

    op = next((c for c in spec.get("containers") or [] if c.get("name") == "operator"), {})
    args = op.get("args") or []
    check(args[:1] == ["run"], f"operator args must start with 'run': {args[:1]}")
    check(arg_value(args, "--webhook-service") == names["service"], "--webhook-service != Service name")
    check(arg_value(args, "--webhook-config") == names["mwc"], "--webhook-config != webhook configuration name")
    check(arg_value(args, "--validating-webhook-config") == (names.get("vwc") or ""),
          "--validating-webhook-config != validating webhook configuration name (empty when disabled)")
    check(arg_value(args, "--namespace") == "$(POD_NAMESPACE)", "--namespace is not the downward-API namespace")
    env = {e["name"]: e for e in op.get("env") or []}
    check(
        ((env.get("POD_NAMESPACE") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        == "metadata.namespace",
        "POD_NAMESPACE is not from the downward API",
    )
    for flag in ("--webhook-addr", "--admin-addr", "--sidecar-image", "--sidecar-image-pull-policy",
                 "--sidecar-cpu-request", "--sidecar-memory-request", "--sidecar-cpu-limit",
                 "--sidecar-memory-limit", "--leader-election-lease", "--log-format"):
        check(arg_value(args, flag) is not None, f"operator flag {flag} missing")
    ports = {p["name"]: p["containerPort"] for p in op.get("ports") or []}
    check(arg_value(args, "--webhook-addr") == f"0.0.0.0:{ports.get('webhook')}", "--webhook-addr != webhook port")
    check(arg_value(args, "--admin-addr") == f"0.0.0.0:{ports.get('admin')}", "--admin-addr != admin port")
    has_prestop = bool(((op.get("lifecycle") or {}).get("preStop") or {}).get("sleep"))
    check(has_prestop == opts.expect_prestop, f"preStop sleep rendered: {has_prestop}, want {opts.expect_prestop}")

    # The operator's own Role (the heal probe's and the install check's Roles
    # are checked below).
    own_roles = [r for r in by_kind(docs, "Role") if (r.get("metadata") or {}).get("namespace") == opts.namespace
                 and r["metadata"].get("name") == dep["metadata"]["name"]]
    for r in by_kind(docs, "Role"):
        if r["metadata"].get("name", "").endswith(("-webhook-probe", "-webhook-check")):
            check(r.get("rules") == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
                  f"Role {r['metadata']['name']} grants more than pods create: {r.get('rules')}")
    if arg_value(args, "--heal") == "true":
        check(any("pods/eviction" in (r.get("resources") or []) and r.get("verbs") == ["create"]
                  for cr in by_kind(docs, "ClusterRole") + by_kind(docs, "Role") for r in cr.get("rules") or []),
              "--heal=true without pods/eviction create")
    check(len(own_roles) == 1, f"expected one Role in the release namespace, found {len(own_roles)}")
    role = own_roles[0] if own_roles else {}
    rules = role.get("rules") or []

    def named(resource):
        return [n for r in rules if resource in (r.get("resources") or []) for n in r.get("resourceNames") or []]

    check(named("leases") == [arg_value(args, "--leader-election-lease")], "Lease name in Role != --leader-election-lease")
    cluster_rules = [r for cr in by_kind(docs, "ClusterRole") for r in cr.get("rules") or []]
    for r in rules + cluster_rules:
        check("*" not in (r.get("verbs") or []) + (r.get("resources") or []) + (r.get("apiGroups") or []),
              f"RBAC wildcard in {r}")
    op_cr = next((cr for cr in by_kind(docs, "ClusterRole")
                  if cr["metadata"]["name"] == dep["metadata"]["name"]), {})
    op_cluster_rules = op_cr.get("rules") or []
    check(op_cluster_rules, "no ClusterRole for the operator")
    check(not any("secrets" in (r.get("resources") or []) for r in op_cluster_rules),
          "the ClusterRole grants secrets (cluster-wide)")
    mwc_rules = [r for r in op_cluster_rules if "mutatingwebhookconfigurations" in (r.get("resources") or [])]
    vwc_rules = [r for r in op_cluster_rules if "validatingwebhookconfigurations" in (r.get("resources") or [])]

    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = {m["mountPath"]: m for m in op.get("volumeMounts") or []}
    if opts.cert_manager:
        cert = one(docs, "Certificate")
        check(arg_value(args, "--cert-secret") is None, "--cert-secret set in cert-manager mode")
        cert_dir = arg_value(args, "--cert-dir")
        check(cert_dir in mounts, f"--cert-dir {cert_dir} is not mounted")
        vol = volumes.get((mounts.get(cert_dir) or {}).get("name"), {})
        check((vol.get("secret") or {}).get("secretName") == cert.get("spec", {}).get("secretName"),
              "the mounted Secret is not the Certificate's")
        dns = cert.get("spec", {}).get("dnsNames") or []
        check(f"{names['service']}.{opts.namespace}.svc" in dns, f"Certificate dnsNames {dns}")
        check(named("secrets") == [], "secrets granted in cert-manager mode")
        # Healing reads the selectors (get, by name); nothing may write it.
        check(all(r.get("verbs") == ["get"] for r in mwc_rules),
              "webhook configuration patch granted in cert-manager mode")
        check(vwc_rules == [], "validating webhook configuration patch granted in cert-manager mode")
    else:
        check(not by_kind(docs, "Certificate") and not by_kind(docs, "Issuer"), "cert-manager objects rendered")
        check(arg_value(args, "--cert-dir") is None, "--cert-dir set without cert-manager")
        check(named("secrets") == [arg_value(args, "--cert-secret")], "Secret name in Role != --cert-secret")
        check([n for r in mwc_rules for n in r.get("resourceNames") or []] == [names["mwc"]],
              "webhook configuration rule is not restricted to the chart's configuration")
        want_vwc = [names["vwc"]] if names.get("vwc") else []
        check([n for r in vwc_rules for n in r.get("resourceNames") or []] == want_vwc,
              "validating webhook configuration rule is not restricted to the chart's configuration")

    svc = next((s for s in by_kind(docs, "Service") if s["metadata"]["name"] == names["service"]), {})
    sel = (svc.get("spec") or {}).get("selector") or {}
    check(sel and all(pod_labels.get(k) == v for k, v in sel.items()), "webhook Service does not select the operator pods")
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        check(matches(pdb["spec"]["selector"], pod_labels), "PDB does not select the operator pods")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--namespace", required=True)
    p.add_argument("--failure-policy", required=True)
    p.add_argument("--cert-manager", action="store_true")
    p.add_argument("--expect-prestop", action="store_true")
    p.add_argument("--route-validation", default="Ignore",
                   help="failurePolicy of the GraceRoute validating webhook, or 'none' when disabled")
    p.add_argument("--namespace-selector", type=json.loads, default={},
                   help="the values' webhook.namespaceSelector, as JSON")
    p.add_argument("--watch-namespaces", type=json.loads, default=[],
                   help="the values' watchNamespaces, as JSON")
    p.add_argument("--network-policy", type=json.loads, default=None,
                   help="webhook.networkPolicy.apiServerCIDRs as JSON when enabled; absent: disabled")
    opts = p.parse_args()

    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    for d in docs:
        md = d.get("metadata") or {}
        cluster_scoped = d.get("kind") in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                                           "ValidatingWebhookConfiguration", "CustomResourceDefinition")
        watched_rbac = d.get("kind") in ("Role", "RoleBinding") and md.get("namespace") in opts.watch_namespaces
        check(cluster_scoped or watched_rbac or md.get("namespace") == opts.namespace,
              f"{d.get('kind')} {md.get('name')} is not in the release namespace")

    # The CRD is a template so `helm upgrade` applies schema changes; without
    # keep, `helm uninstall` would delete it and every GraceRoute with it.
    for crd in by_kind(docs, "CustomResourceDefinition"):
        policy = ((crd.get("metadata") or {}).get("annotations") or {}).get("helm.sh/resource-policy")
        check(policy == "keep", f"CRD {crd['metadata'].get('name')}: helm.sh/resource-policy is {policy!r}, want keep")

    mwc = one(docs, "MutatingWebhookConfiguration")
    svc = (((mwc.get("webhooks") or [{}])[0]).get("clientConfig") or {}).get("service") or {}
    names = {
        "mwc": (mwc.get("metadata") or {}).get("name"),
        "service": svc.get("name"),
        "certificate": (one(docs, "Certificate").get("metadata") or {}).get("name") if opts.cert_manager else None,
    }
    check_webhook(docs, opts, names)
    check_route_validation(docs, opts, names)
    check_wiring(docs, opts, names)
    check_scope(docs, opts)
    check_network_policy(docs, opts)

    if errors:
        for e in errors:
            print(f"  FAIL {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
