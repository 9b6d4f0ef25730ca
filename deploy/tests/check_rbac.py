#!/usr/bin/env python3
"""gpu-warden's RBAC must grant exactly DESIGN §3.6 and nothing more.

    pods: get, list, watch · pods/eviction: create · nodes: get, patch ·
    events (events.k8s.io only: the agent sends no core/v1 Event): create, patch ·
    leases (coordination.k8s.io, the agent's namespace only): get, create, update.

`rbac_problems(objects)` takes the rendered objects of one overlay and returns what is
wrong (empty list: exact). The optional scheduler profile (deploy/components/scheduler,
objects labelled app.kubernetes.io/component=scheduler) is split off first with
`split_scheduler` and judged by `scheduler_rbac_problems`: its extender identity may read
nodes and pods (get, list, watch; DESIGN §3.7) and nothing else, and kube-scheduler gets the
built-in system:kube-scheduler / system:volume-scheduler roles plus its own lease only. Run directly, it checks its own judgement on mutated role sets
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
    + [("events.k8s.io", "events", v) for v in ("create", "patch")]
)
SERVICE_ACCOUNT = ("gpu-warden", "gpu-warden")  # (namespace, name)
RBAC_GROUP = "rbac.authorization.k8s.io"
ALLOWED_RULE_KEYS = {"apiGroups", "resources", "verbs"}
# The agent's Lease (its liveness and figures), in its own namespace: a Role, not a
# ClusterRole. resourceNames cannot narrow it: `create` is never restricted by name, and
# each agent's Lease is named after its node, unknown when the chart is rendered.
AGENT_LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


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
    others = [o for o in rbac if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    for o in others:
        problems.append(f"unexpected RBAC object {o['kind']}/{o['metadata']['name']}")
    ns_roles = [o for o in rbac if o["kind"] == "Role"]
    ns_bindings = [o for o in rbac if o["kind"] == "RoleBinding"]
    if len(ns_roles) != 1 or ns_roles[0].get("rules") != AGENT_LEASE_RULES \
            or ns_roles[0]["metadata"].get("namespace") != SERVICE_ACCOUNT[0]:
        problems.append(f"expected one Role in {SERVICE_ACCOUNT[0]} with exactly the lease rules {AGENT_LEASE_RULES}")
    if len(ns_bindings) != 1:
        problems.append(f"expected exactly one RoleBinding, found {len(ns_bindings)}")
    for b in ns_bindings:
        ref = b.get("roleRef", {})
        want_ref = (RBAC_GROUP, "Role", ns_roles[0]["metadata"]["name"] if ns_roles else None)
        subjects = [{k: s.get(k) for k in ("kind", "namespace", "name")} for s in b.get("subjects") or []]
        if (ref.get("apiGroup"), ref.get("kind"), ref.get("name")) != want_ref or subjects != [
                {"kind": "ServiceAccount", "namespace": SERVICE_ACCOUNT[0], "name": SERVICE_ACCOUNT[1]}] \
                or b["metadata"].get("namespace") != SERVICE_ACCOUNT[0]:
            problems.append(f"RoleBinding {b['metadata']['name']} must bind the lease Role to {SERVICE_ACCOUNT}")
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


SCHEDULER_LABEL = ("app.kubernetes.io/component", "scheduler")
EXTENDER_SA = ("gpu-warden", "gpu-warden-extender")
SCHEDULER_SA = ("gpu-warden", "gpu-warden-scheduler")
EXTENDER_EXPECTED = frozenset(("", r, v) for r in ("nodes", "pods") for v in ("get", "list", "watch"))
# Built-in roles kube-scheduler may be bound to, and nothing else cluster-wide.
SCHEDULER_BUILTIN_ROLES = {"system:kube-scheduler", "system:volume-scheduler"}
LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "resourceNames": ["gpu-warden-scheduler"], "verbs": ["get", "update"]},
]
# The extender reads the agents' Leases (liveness and figures) in their namespace.
EXTENDER_LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch"]},
]
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def split_scheduler(objects):
    """(the agent's objects, the scheduler profile's objects)."""
    k, v = SCHEDULER_LABEL
    sched = [o for o in objects if (o["metadata"].get("labels") or {}).get(k) == v]
    return [o for o in objects if o not in sched], sched


def _subjects(b):
    return [(s.get("kind"), s.get("namespace"), s.get("name")) for s in b.get("subjects") or []]


def scheduler_rbac_problems(objects):
    """Everything that makes the scheduler profile's RBAC differ from the above."""
    problems = []
    by_kind = lambda kind: [o for o in objects if o["kind"] == kind]  # noqa: E731
    roles = by_kind("ClusterRole")
    if [r["metadata"]["name"] for r in roles] != ["gpu-warden-extender"]:
        problems.append(f"expected exactly ClusterRole gpu-warden-extender, found {[r['metadata']['name'] for r in roles]}")
    for role in roles:
        granted = set()
        for i, rule in enumerate(role.get("rules") or []):
            if set(rule) - ALLOWED_RULE_KEYS:
                problems.append(f"extender rule {i} has {sorted(set(rule) - ALLOWED_RULE_KEYS)}")
            for field in ("apiGroups", "resources", "verbs"):
                if "*" in (rule.get(field) or []):
                    problems.append(f"extender rule {i} uses a wildcard in {field}")
            granted |= _triples(rule)
        if role.get("aggregationRule"):
            problems.append("extender ClusterRole has an aggregationRule")
        for t in sorted(granted ^ EXTENDER_EXPECTED):
            problems.append("extender grant differs from DESIGN §3.7 (nodes, pods: get, list, watch): group=%r resource=%r verb=%r" % t)
    for b in by_kind("ClusterRoleBinding"):
        ref = b.get("roleRef", {})
        name = ref.get("name")
        if name == "gpu-warden-extender":
            want = [("ServiceAccount",) + EXTENDER_SA]
        elif name in SCHEDULER_BUILTIN_ROLES:
            want = [("ServiceAccount",) + SCHEDULER_SA]
        else:
            problems.append(f"ClusterRoleBinding {b['metadata']['name']} binds {name}, not an allowed role")
            continue
        if ref.get("kind") != "ClusterRole" or _subjects(b) != want:
            problems.append(f"ClusterRoleBinding {b['metadata']['name']}: subjects {_subjects(b)}, expected {want}")
    ns_roles = by_kind("Role")
    leases = [r for r in ns_roles if r.get("rules") == LEASE_RULES]
    reader = [r for r in ns_roles if r.get("rules") == EXTENDER_LEASE_RULES]
    if len(leases) != 1 or len(reader) != 1 or len(ns_roles) != 2:
        problems.append(f"expected two Roles: the scheduler's lease rules {LEASE_RULES} and the extender's {EXTENDER_LEASE_RULES}")
    role_sa = {r["metadata"]["name"]: SCHEDULER_SA for r in leases}
    role_sa.update({r["metadata"]["name"]: EXTENDER_SA for r in reader})
    for rb in by_kind("RoleBinding"):
        ref = rb.get("roleRef", {})
        sa = role_sa.get(ref.get("name"))
        if ref.get("kind") != "Role" or sa is None or _subjects(rb) != [("ServiceAccount",) + sa]:
            problems.append(f"RoleBinding {rb['metadata']['name']} must bind a lease Role to its one ServiceAccount")
    deps = by_kind("Deployment")
    if len(deps) != 1:
        return problems + [f"expected one scheduler Deployment, found {len(deps)}"]
    spec = deps[0]["spec"]["template"]["spec"]
    if spec.get("serviceAccountName") != SCHEDULER_SA[1]:
        problems.append("the scheduler Deployment must run as ServiceAccount gpu-warden-scheduler")
    secrets = {o["metadata"]["name"]: o for o in by_kind("Secret")}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for c in spec.get("containers") or []:
        token = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == TOKEN_PATH]
        if c["name"] == "extender":
            secret = (volumes.get(token[0]["name"], {}).get("secret") or {}).get("secretName") if token else None
            sa = (secrets.get(secret) or {}).get("metadata", {}).get("annotations", {}).get("kubernetes.io/service-account.name")
            if not token or sa != EXTENDER_SA[1] or not token[0].get("readOnly"):
                problems.append("the extender container must mount gpu-warden-extender's token (read-only) over the default token path")
        elif token:
            problems.append(f"container {c['name']} must keep the pod's own token")
    return problems


def scheduler_self_test(objects):
    """The scheduler checker must accept the real set and refuse each widening."""
    failures = []
    cases = []
    expect = _case_runner(scheduler_rbac_problems, objects, failures, cases)

    find = lambda objs, kind: next(o for o in objs if o["kind"] == kind)  # noqa: E731
    expect("as rendered", lambda o: None, ok=True)
    expect("extender may list secrets", lambda o: find(o, "ClusterRole")["rules"].append(
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}), ok=False)
    expect("extender may patch nodes", lambda o: find(o, "ClusterRole")["rules"][0]["verbs"].append("patch"), ok=False)
    expect("scheduler bound to cluster-admin", lambda o: find(o, "ClusterRoleBinding")["roleRef"].update(name="cluster-admin"), ok=False)
    sched_lease = lambda objs: next(r for r in objs if r["kind"] == "Role" and r["rules"] == LEASE_RULES)  # noqa: E731
    expect("any lease", lambda o: sched_lease(o)["rules"][1].pop("resourceNames"), ok=False)
    expect("extender may update leases", lambda o: [r["rules"][0]["verbs"].append("update") for r in o
        if r["kind"] == "Role" and r["rules"] == EXTENDER_LEASE_RULES], ok=False)
    expect("extender uses the scheduler's token", lambda o: [
        c.update(volumeMounts=[m for m in c["volumeMounts"] if m["mountPath"] != TOKEN_PATH])
        for c in find(o, "Deployment")["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"], ok=False)
    return failures, len(cases)


def _case_runner(checker, objects, failures, cases):
    """`expect(name, mutate, ok)`: `checker` on a mutated copy of `objects` must find a
    problem exactly when `ok` is False."""
    def expect(name, mutate, ok):
        cases.append(name)
        objs = copy.deepcopy(objects)
        mutate(objs)
        got = checker(objs)
        if bool(got) == ok:
            failures.append(f"{name}: expected {'no problem' if ok else 'a problem'}, got {got}")
    return expect


def self_test(objects):
    """The checker must accept the real set and refuse each kind of widening or narrowing."""
    failures = []
    cases = []
    expect = _case_runner(rbac_problems, objects, failures, cases)

    role = lambda objs: next(o for o in objs if o["kind"] == "ClusterRole")  # noqa: E731
    binding = lambda objs: next(o for o in objs if o["kind"] == "ClusterRoleBinding")  # noqa: E731
    expect("as rendered", lambda o: None, ok=True)
    expect("rules reordered and split", lambda o: role(o).update(rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch", "get"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
    ]), ok=True)
    expect("core events back", lambda o: role(o)["rules"].append(
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}), ok=False)
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
    lease_role = lambda objs: next(o for o in objs if o["kind"] == "Role")  # noqa: E731
    expect("lease delete", lambda o: lease_role(o)["rules"][0]["verbs"].append("delete"), ok=False)
    expect("leases cluster-wide", lambda o: role(o)["rules"].append(
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"]}), ok=False)
    expect("lease Role bound to everyone", lambda o: next(b for b in o if b["kind"] == "RoleBinding")["subjects"].append(
        {"kind": "Group", "name": "system:authenticated", "apiGroup": RBAC_GROUP}), ok=False)
    return failures, len(cases)


def main(paths):
    status = 0
    for path in paths:
        with open(path) as f:
            objects = [o for o in yaml.safe_load_all(f) if o]
        objects, sched = split_scheduler(objects)
        problems = rbac_problems(objects)
        if sched:
            sproblems = scheduler_rbac_problems(sched)
            sfails, scases = scheduler_self_test(sched) if not sproblems else ([], 0)
            for p in sproblems + sfails:
                print(f"  {path}: scheduler: {p}")
            print(f"{'PASS' if not sproblems and not sfails else 'FAIL'} rbac: scheduler profile exactly DESIGN §3.7 ({scases} self-test cases): {path}")
            status |= 1 if sproblems or sfails else 0
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
