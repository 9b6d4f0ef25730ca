#!/usr/bin/env python3
"""deploy/examples are safe and apply as copied (issue 39), checked mechanically.

    check_examples.py

One PASS/FAIL line each:
  - the runner's pod_annotations_overwrite_allowed lets a job set its own
    gpu-warden.io/vram-request-mib=<digits> and nothing else: GitLab Runner matches the
    regular expression (Go's regexp, unanchored search) against "key=value", so hostile
    annotations (an exemption, a key smuggled into a value, a newline, a sign) are tried; the
    example job's overrides pass it; jobs run in one namespace (gitlab-ci);
  - main.tf applies from an empty cluster: every namespaced resource takes its namespace from
    a kubernetes_namespace_v1 of the same file (so OpenTofu orders it after), the job namespace
    exists with a Role bound to the runner's ServiceAccount, the helm provider is 3.x with its
    attribute syntax, and with the scheduler profile on the runner config names the chart's
    scheduler (main.tf's replace() applied here, the result parsed as TOML);
  - every chart value an example sets (OpenTofu's values file and `set`, Argo CD's
    valuesObject) exists in deploy/helm/gpu-warden/values.yaml (a misspelt key would be
    silently ignored by Helm's coalescing where the schema allows free-form maps).
"""
import json
import os
import re
import sys
import tomllib

import yaml

from checklib import report, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EX = os.path.join(ROOT, "deploy", "examples")
CHART_VALUES = os.path.join(ROOT, "deploy", "helm", "gpu-warden", "values.yaml")
JOB_NAMESPACE = "gitlab-ci"
OWN = "gpu-warden.io/vram-request-mib"
# What a job must be able to write.
CUDA = "gpu-warden.io/cuda-min"
ALLOWED = [f"{OWN}=16384", f"{OWN}=0", f"{OWN}=4096", f"{CUDA}=12.8", f"{CUDA}=13.0"]
# What it must not: an exemption, another key, a key hidden in a value or behind a prefix,
# a newline (Go's `$` is end of text only), signs, units, spaces, an empty value.
HOSTILE = [
    "gpu-warden.io/evict=never",
    "x=gpu-warden.io/vram-request-mib=1",
    f"{OWN}=1\nfoo",
    f"{OWN}=1\n",
    f"{OWN}=1\ngpu-warden.io/evict=never",
    f"{OWN}=-1",
    f"{OWN}=1e9",
    f"{OWN}=16Gi",
    f"{OWN}= 1",
    f"{OWN}=1 ",
    f"{OWN}=",
    f"{OWN}x=1",
    "gpu-wardenXio/vram-request-mib=1",
    f"example.com/{OWN}=1",
    f"{OWN.upper()}=1",
    "gpu-warden.io/evict=never,gpu-warden.io/vram-request-mib=1",
    f"{CUDA}=12.8\ngpu-warden.io/evict=never",
    f"{CUDA}=12.8,gpu-warden.io/evict=never",
    f"{CUDA}=12",
    f"{CUDA}=12.8.1",
    f"{CUDA}=v12.8",
    f"x={CUDA}=12.8",
    f"{OWN}=1|{CUDA}=12.8",
]


def go_search(pattern, text):
    """Go's regexp.MatchString: an unanchored search in which `$` (no (?m)) is the end of the
    text. Python's `$` also matches before a final newline, so it becomes `\\Z`."""
    py = re.sub(r"(?<!\\)\$", r"\\Z", pattern)
    return re.search(py, text) is not None


def check_runner():
    p = []
    with open(os.path.join(EX, "gitlab-runner-config.toml"), "rb") as f:
        runner = tomllib.load(f)
    k = runner["runners"][0]["kubernetes"]
    pattern = k.get("pod_annotations_overwrite_allowed", "")
    if not pattern:
        p.append("pod_annotations_overwrite_allowed missing: jobs cannot declare their need")
    for a in ALLOWED:
        if pattern and not go_search(pattern, a):
            p.append(f"refuses what a job must be able to set: {a!r}")
    for a in HOSTILE:
        if pattern and go_search(pattern, a):
            p.append(f"lets a job set {a!r}")
    if k.get("namespace") != JOB_NAMESPACE:
        p.append(f"runner namespace {k.get('namespace')!r}, the examples' job namespace is {JOB_NAMESPACE}")
    for key in k.get("pod_annotations", {}):
        if key.endswith("/evict"):
            p.append(f"the runner exempts every job with {key}")
    with open(os.path.join(EX, "gitlab-runner-config.toml")) as f:
        for n, line in enumerate(f, 1):
            if "KUBERNETES_POD_ANNOTATIONS" in line and "evict" in line:
                p.append(f"line {n} advertises an exemption through an overwrite: {line.strip()}")
    with open(os.path.join(EX, "gitlab-ci-job.yml")) as f:
        job = yaml.safe_load(f)
    overrides = [(name, v) for name, j in job.items() for var, v in (j.get("variables") or {}).items()
                 if var.startswith("KUBERNETES_POD_ANNOTATIONS_")]
    for name, v in overrides:
        if not go_search(pattern, v):
            p.append(f"gitlab-ci-job.yml {name}: {v!r} is refused by the runner's pattern")
    report(not p, f"runner example: a job may set only {OWN}=<digits> and {CUDA}=<major.minor> ({len(HOSTILE)} hostile annotations "
           f"refused, {len(overrides)} example override(s) allowed); jobs in {JOB_NAMESPACE}", p)
    return runner


def hcl_blocks(text, kind):
    """`kind "type" "name" { … }` blocks of an HCL file, in order, by brace matching (enough for
    this example: no braces inside its strings but ${…} interpolations, which balance)."""
    out = []
    for m in re.finditer(rf'^{kind} "([^"]+)" "([^"]+)" \{{', text, re.M):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append((m.group(1), m.group(2), text[m.end():i - 1]))
    return out


def set_names(body):
    """helm provider 3.x: `set = [ { name = "a.b", value = … }, … ]`."""
    m = re.search(r"^\s*set\s*=\s*\[(.*?)^\s*\]", body, re.M | re.S)
    return re.findall(r'name\s*=\s*"([^"]+)"', m.group(1)) if m else []


def check_opentofu(runner_toml_text, chart):
    p = []
    with open(os.path.join(EX, "opentofu", "main.tf")) as f:
        tf = f.read()
    provider = re.search(r'helm\s*=\s*\{[^}]*version\s*=\s*"([^"]+)"', tf)
    if not provider or not re.match(r"~>\s*3\.", provider.group(1)):
        p.append(f"helm provider version {provider.group(1) if provider else None!r}: written for 3.x")
    if re.search(r"^\s*kubernetes\s*\{", tf, re.M) or re.search(r"^\s*set\s*\{", tf, re.M):
        p.append("helm provider 2.x block syntax (3.x: `kubernetes = {…}`, `set = [{…}]`)")
    resources = hcl_blocks(tf, "resource")
    names = {f"{t}.{n}" for t, n, _ in resources}
    namespaces = {}
    for t, n, body in resources:
        if t == "kubernetes_namespace_v1":
            namespaces[n] = re.search(r'name\s*=\s*"([^"]+)"', body).group(1)
    for t, n, body in resources:
        if "create_namespace" in body:
            p.append(f"{t}.{n}: create_namespace (no Pod Security labels; nothing may precede it)")
        for ns in re.findall(r"^\s*namespace\s*=\s*(.+)$", body, re.M):
            ref = re.fullmatch(r"kubernetes_namespace_v1\.(\w+)\.metadata\[0\]\.name", ns.strip())
            if not ref or ref.group(1) not in namespaces:
                p.append(f"{t}.{n}: namespace = {ns.strip()} is not a kubernetes_namespace_v1 of this file "
                         "(no ordering: it may be applied before its namespace exists)")
        for dep in re.findall(r"\b(kubernetes_\w+|helm_release)\.(\w+)\b", body):
            if f"{dep[0]}.{dep[1]}" not in names:
                p.append(f"{t}.{n} refers to {dep[0]}.{dep[1]}, which main.tf does not define")
    if JOB_NAMESPACE not in namespaces.values():
        p.append(f"no kubernetes_namespace_v1 creates the job namespace {JOB_NAMESPACE}")
    roles = [(n, b) for t, n, b in resources if t == "kubernetes_role_v1"]
    bindings = [(n, b) for t, n, b in resources if t == "kubernetes_role_binding_v1"]
    job_ns_ref = [f"kubernetes_namespace_v1.{n}.metadata[0].name" for n, v in namespaces.items() if v == JOB_NAMESPACE]
    if not any(job_ns_ref and job_ns_ref[0] in b and re.search(r'"pods"', b) and '"create"' in b for _, b in roles):
        p.append(f"no Role in {JOB_NAMESPACE} lets the runner create pods")
    if not any(job_ns_ref and job_ns_ref[0] in b and 'kind      = "ServiceAccount"' in b for _, b in bindings):
        p.append(f"no RoleBinding in {JOB_NAMESPACE} for the runner's ServiceAccount")
    # The scheduler profile: main.tf's replace() on the runner config, as OpenTofu applies it.
    gw = next((b for t, n, b in resources if t == "helm_release" and n == "gpu_warden"), "")
    sets = set_names(gw)
    sched = re.search(r'scheduler_name\s*=\s*"([^"]+)"', tf)
    anchor = re.search(r'replace\(local\.runner_toml,\s*"((?:[^"\\]|\\.)*)",\s*"((?:[^"\\]|\\.)*)"\)', tf)
    if "scheduler.enabled" not in sets or not sched or not anchor:
        p.append("main.tf does not tie scheduler.enabled, the profile's name and the runner's scheduler_name together")
    else:
        unq = lambda s: s.replace("${local.scheduler_name}", sched.group(1)).encode().decode("unicode_escape")  # noqa: E731
        old, new = unq(anchor.group(1)), unq(anchor.group(2))
        if runner_toml_text.count(old) != 1:
            p.append(f"replace() anchor {old!r} occurs {runner_toml_text.count(old)} times in the runner config")
        else:
            k = tomllib.loads(runner_toml_text.replace(old, new))["runners"][0]["kubernetes"]
            if k.get("scheduler_name") != sched.group(1):
                p.append(f"runner config after replace(): scheduler_name {k.get('scheduler_name')!r}")
            if sched.group(1) != chart["scheduler"]["schedulerName"] and "scheduler.schedulerName" not in sets:
                p.append("the runner names another scheduler than the chart's profile")
    if "scheduler_name" in tomllib.loads(runner_toml_text)["runners"][0]["kubernetes"]:
        p.append("the runner config names the scheduler profile unconditionally (Pending pods without it)")
    report(not p, f"OpenTofu main.tf: {len(resources)} resources, every namespace created first "
           f"({', '.join(sorted(namespaces.values()))}), runner RBAC in {JOB_NAMESPACE}, helm provider 3.x, "
           "scheduler_name with the profile", p)
    return sets


def paths(values, prefix=()):
    """Every leaf of a values tree as a tuple of keys (keys may hold dots: nodeSelector's)."""
    for k, v in values.items():
        if isinstance(v, dict) and v:
            yield from paths(v, prefix + (k,))
        else:
            yield prefix + (k,)


def missing_in_chart(path, chart, schema):
    """The first part of a path values.yaml lacks, or None. A map the schema leaves open
    (no additionalProperties: false: labels, nodeSelector, …) takes any key below it; below an
    empty map (guard.policy) the schema's properties are the keys."""
    node, sch = chart, schema
    for i, part in enumerate(path):
        closed = sch.get("additionalProperties") is False
        if not closed and i > 0:
            return None
        in_schema = part in (sch.get("properties") or {})
        # An empty map in values.yaml (guard.policy: {}) documents its keys in the schema.
        if not isinstance(node, dict) or (part not in node and not (node == {} and in_schema)):
            return ".".join(path[: i + 1])
        node, sch = node.get(part, {}), (sch.get("properties") or {}).get(part, {})
    return None


def check_values(chart, schema, sets):
    p = []
    with open(os.path.join(EX, "opentofu", "gpu-warden-values.yaml")) as f:
        tofu = yaml.safe_load(f)
    with open(os.path.join(EX, "argocd-application.yaml")) as f:
        argo = yaml.safe_load(f)["spec"]["source"]["helm"]["valuesObject"]
    count = 0
    for where, keys in (("opentofu/gpu-warden-values.yaml", list(paths(tofu))),
                        ("opentofu/main.tf set", [tuple(s.split(".")) for s in sets]),
                        ("argocd-application.yaml valuesObject", list(paths(argo)))):
        for key in keys:
            count += 1
            bad = missing_in_chart(key, chart, schema)
            if bad:
                p.append(f"{where}: {'.'.join(key)}: the chart has no value {bad}")
    report(not p and count > 0, f"every chart value the examples set exists in values.yaml ({count} values)", p)


def main():
    with open(CHART_VALUES) as f:
        chart = yaml.safe_load(f)
    try:
        check_runner()
        with open(os.path.join(EX, "gitlab-runner-config.toml")) as f:
            toml_text = f.read()
        sets = check_opentofu(toml_text, chart)
        with open(CHART_VALUES.replace("values.yaml", "values.schema.json")) as f:
            check_values(chart, json.load(f), sets)
    except (OSError, KeyError, IndexError, TypeError, AttributeError, ValueError, yaml.YAMLError) as e:
        report(False, "deploy/examples readable", [repr(e)])
    return summary("check_examples")


if __name__ == "__main__":
    sys.exit(main())
