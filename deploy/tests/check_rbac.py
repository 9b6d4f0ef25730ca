#!/usr/bin/env python3
"""gpu-warden's RBAC must grant exactly DESIGN §3.6 and nothing more.

    pods: get, list, watch · pods/eviction: create · nodes: get, patch ·
    events (core and events.k8s.io): create, patch.

`rbac_problems(objects)` takes the rendered objects of one overlay and returns what is
wrong (empty list: exact). Run directly, it checks its own judgement on mutated role sets
(the self-test), then any rendered files given:  check_rbac.py rendered.yaml ...
"""
import copy
import sys

import yaml

# (apiGroup, resource, verb): the whole grant. "" is the core group.
EXPECTED = frozenset(
    [("", "pods", v) for v in ("get", "list", "watch")]
    + [("", "pods/eviction", "create")]
    + [("", "nodes", v) for v in ("get", "patch")]
    + [(g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")]
)
SERVICE_ACCOUNT = ("gpu-warden", "gpu-warden")  # (namespace, name)
RBAC_GROUP = "rbac.authorization.k8s.io"
ALLOWED_RULE_KEYS = {"apiGroups", "resources", "verbs"}


def _triples(rule):
    return {
        (g, r, v)
        for g in rule.get("apiGroups") or []
        for r in rule.get("resources") or []
        for v in rule.get("verbs") or []
    }


def rbac_problems(objects):
    """Everything that makes the RBAC differ from DESIGN §3.6, as readable lines."""
    problems = []
    rbac = [o for o in objects if o.get("apiVersion", "").startswith(RBAC_GROUP + "/")]
    roles = [o for o in rbac if o["kind"] == "ClusterRole"]
    bindings = [o for o in rbac if o["kind"] == "ClusterRoleBinding"]
    others = [o for o in rbac if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    for o in others:
        problems.append(f"unexpected RBAC object {o['kind']}/{o['metadata']['name']}")
    if len(roles) != 1:
        problems.append(f"expected exactly one ClusterRole, found {len(roles)}")
    if len(bindings) != 1:
        problems.append(f"expected exactly one ClusterRoleBinding, found {len(bindings)}")
    if not roles:
        return problems
    role = roles[0]
    if role.get("aggregationRule"):
        problems.append("ClusterRole has an aggregationRule (its rules would come from elsewhere)")
    granted = set()
    for i, rule in enumerate(role.get("rules") or []):
        extra = set(rule) - ALLOWED_RULE_KEYS
        if extra:
            # resourceNames only narrows, but nonResourceURLs grants; refuse both to keep
            # the comparison exact.
            problems.append(f"rule {i} has {sorted(extra)}")
        for field in ("apiGroups", "resources", "verbs"):
            if "*" in (rule.get(field) or []):
                problems.append(f"rule {i} uses a wildcard in {field}")
        granted |= _triples(rule)
    for t in sorted(granted - EXPECTED):
        problems.append("grants more than DESIGN §3.6: group=%r resource=%r verb=%r" % t)
    for t in sorted(EXPECTED - granted):
        problems.append("misses DESIGN §3.6: group=%r resource=%r verb=%r" % t)
    for b in bindings:
        ref = b.get("roleRef", {})
        if (ref.get("apiGroup"), ref.get("kind"), ref.get("name")) != (
            RBAC_GROUP, "ClusterRole", role["metadata"]["name"]):
            problems.append(f"ClusterRoleBinding {b['metadata']['name']} binds {ref}, not the ClusterRole")
        subjects = b.get("subjects") or []
        want = [{"kind": "ServiceAccount", "namespace": SERVICE_ACCOUNT[0], "name": SERVICE_ACCOUNT[1]}]
        got = [{k: s.get(k) for k in ("kind", "namespace", "name")} for s in subjects]
        if got != want or any(set(s) - {"kind", "namespace", "name", "apiGroup"} for s in subjects):
            problems.append(f"ClusterRoleBinding subjects are {got}, expected exactly {want}")
    sas = [o for o in objects if o["kind"] == "ServiceAccount"]
    if [(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in sas] != [SERVICE_ACCOUNT]:
        problems.append(f"expected one ServiceAccount {SERVICE_ACCOUNT}")
    for o in objects:
        if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Pod"):
            spec = o["spec"]["template"]["spec"] if o["kind"] != "Pod" else o["spec"]
            if spec.get("serviceAccountName") != SERVICE_ACCOUNT[1]:
                problems.append(f"{o['kind']}/{o['metadata']['name']} does not run as ServiceAccount gpu-warden")
    return problems


def self_test(objects):
    """The checker must accept the real set and refuse each kind of widening or narrowing."""
    failures = []
    cases = []

    def expect(name, mutate, ok):
        cases.append(name)
        objs = copy.deepcopy(objects)
        mutate(objs)
        got = rbac_problems(objs)
        if bool(got) == ok:
            failures.append(f"{name}: expected {'no problem' if ok else 'a problem'}, got {got}")

    role = lambda objs: next(o for o in objs if o["kind"] == "ClusterRole")  # noqa: E731
    binding = lambda objs: next(o for o in objs if o["kind"] == "ClusterRoleBinding")  # noqa: E731
    expect("as rendered", lambda o: None, ok=True)
    expect("rules reordered and split", lambda o: role(o).update(rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch", "get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]), ok=True)
    expect("extra verb", lambda o: role(o)["rules"][0]["verbs"].append("delete"), ok=False)
    expect("pods/exec", lambda o: role(o)["rules"].append(
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}), ok=False)
    expect("secrets", lambda o: role(o)["rules"].append(
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}), ok=False)
    expect("wildcard verb", lambda o: role(o)["rules"][2].update(verbs=["*"]), ok=False)
    expect("wildcard group", lambda o: role(o)["rules"][0].update(apiGroups=["*"]), ok=False)
    expect("nonResourceURLs", lambda o: role(o)["rules"].append(
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}), ok=False)
    expect("nodes update", lambda o: role(o)["rules"].append(
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["update"]}), ok=False)
    expect("missing eviction", lambda o: role(o)["rules"].pop(1), ok=False)
    expect("extra Role", lambda o: o.append({"apiVersion": RBAC_GROUP + "/v1", "kind": "Role",
                                             "metadata": {"name": "x", "namespace": "gpu-warden"}, "rules": []}),
           ok=False)
    expect("binding to another subject", lambda o: binding(o)["subjects"].append(
        {"kind": "Group", "name": "system:authenticated", "apiGroup": RBAC_GROUP}), ok=False)
    expect("binding to cluster-admin", lambda o: binding(o)["roleRef"].update(name="cluster-admin"), ok=False)
    return failures, len(cases)


def main(paths):
    status = 0
    for path in paths:
        with open(path) as f:
            objects = [o for o in yaml.safe_load_all(f) if o]
        problems = rbac_problems(objects)
        for p in problems:
            print(f"  {path}: {p}")
        fails, cases = self_test(objects) if not problems else ([], 0)
        for p in fails:
            print(f"  {path}: self-test: {p}")
        ok = not problems and not fails
        print(f"{'PASS' if ok else 'FAIL'} rbac: exactly DESIGN §3.6 ({cases} self-test cases): {path}")
        status |= 0 if ok else 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
