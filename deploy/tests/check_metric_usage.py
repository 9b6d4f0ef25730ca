#!/usr/bin/env python3
"""Every metric the Grafana dashboard and the PrometheusRule query must be one gpu-warden
exports, judged against a live scrape of the agent (simulated GPUs).

    check_metric_usage.py SCRAPE.txt DASHBOARD.json RULES.yaml OUT_DIR

Families the agent exposes only in some states are allow-listed below, each with the reason;
an allow-listed gpu-warden or DCGM name must still appear in the agent's source (src/), so a
typo cannot hide there. Also writes OUT_DIR/dashboard-queries.rules.yaml: every dashboard
query as a recording rule (Grafana variables replaced), for `promtool check rules` to parse.
"""
import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# Exported only in some states, so absent from a fresh simulated scrape.
STATEFUL = {
    # Counters with labels have no series until their first increment.
    "gpu_warden_evictions_total": "appears after the guard's first eviction request (enforce mode)",
    "gpu_warden_guard_decisions_total": "appears after the guard's first decision",
    "gpu_warden_node_annotation_patches_total": "appears after the first Node patch (needs Kubernetes)",
    "gpu_warden_nvml_errors_total": "appears after the first failed NVML call",
    "gpu_warden_ci_job_gpu_memory_peak_bytes_bucket": "a histogram's series appear after the first pod's GPU processes end",
    "gpu_warden_ci_job_gpu_replica_seconds_total": "added when a CI job's record closes (its pod's GPU processes end)",
    "gpu_warden_ci_job_gpu_busy_seconds_total": "added when a CI job's record closes (its pod's GPU processes end)",
    "gpu_warden_gpu_replica_idle_seconds_total": "needs the kubelet's pod-resources socket",
    # The kubelet's pod-resources families: only with a kubelet socket (docs/attribution.md).
    "gpu_warden_gpu_replicas": "needs the kubelet's pod-resources socket",
    "gpu_warden_gpu_replicas_idle": "needs the kubelet's pod-resources socket",
    "gpu_warden_gpu_memory_declared_bytes": "needs the kubelet's pod-resources socket",
    "gpu_warden_gpu_memory_committed_bytes": "needs the kubelet's pod-resources socket",
    "gpu_warden_pod_processes_without_replica": "needs the kubelet's pod-resources socket and a bypassing process",
    # Only on GPUs with NVLink; the simulated A10G demo the check scrapes has none.
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "only on GPUs with NVLink (SXM parts); a PCIe card such as the A10G has none",
    # Hopper and newer only (NVML GPM); the simulated H100 scenario does not model GPM.
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Hopper+ GPM profiling family",
    "DCGM_FI_PROF_SM_ACTIVE": "Hopper+ GPM profiling family",
    "DCGM_FI_PROF_SM_OCCUPANCY": "Hopper+ GPM profiling family",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Hopper+ GPM profiling family",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Hopper+ GPM profiling family",
}
# Not gpu-warden's: Prometheus's own series and kube-state-metrics (kube-prometheus-stack).
EXTERNAL = {
    "up": "Prometheus's scrape health series",
    "kube_daemonset_status_number_unavailable": "kube-state-metrics",
}

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "atan2", "inf", "nan", "start", "end"}
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
                "${__rate_interval}": "1m", "${__range}": "1h",
                # The dashboard's numeric textbox variables, at their defaults (a number in
                # arithmetic, not a label regex).
                "$gpu_price": "1", "$replicas_per_gpu": "4"}


def metric_names(expr):
    """Metric names a PromQL expression selects (functions, labels and keywords dropped)."""
    s = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'|`[^`]*`', '""', expr)   # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)                                        # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                                       # ranges, subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\b(offset)\s+-?[0-9a-zA-Z_$]+", " ", s)
    s = re.sub(r"@\s*[0-9.]+|@\s*(start|end)\(\)", " ", s)
    names = set()
    for m in re.finditer(r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\$\{?\w+\}?|([a-zA-Z_:][a-zA-Z0-9_:]*)", s):
        name = m.group(1)
        if not name or name in KEYWORDS:
            continue
        if re.match(r"\s*\(", s[m.end():]):  # a function or aggregation
            continue
        names.add(name)
    return names


def self_test():
    cases = {
        'sum by (namespace, pod) (rate(foo_total{job=~"$job", a="x{y}"}[$__rate_interval]))': {"foo_total"},
        'histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) * 1e6': {"h_bucket"},
        'a > 0 and changes(a[10m]) > 0 or b offset 5m unless on (x) group_left (y) c': {"a", "b", "c"},
        '(time() - t) and t > 0': {"t"},
        'count(x >= 1) or vector(0)': {"x"},
        'topk(25, m{pod!=""}) / 3600000': {"m"},
        'absent(up{job=~".*gpu-warden.*"})': {"up"},
        'sum(x) without (instance)': {"x"},
    }
    bad = [(e, metric_names(e), want) for e, want in cases.items() if metric_names(e) != want]
    return bad, len(cases)


def scrape_names(path):
    names = set()
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def source_names():
    text = []
    for d, _, files in os.walk(os.path.join(ROOT, "src")):
        for f in files:
            if f.endswith(".rs"):
                with open(os.path.join(d, f)) as fh:
                    text.append(fh.read())
    return "\n".join(text)


def dashboard_queries(dash):
    """(where, expr) for every panel target and variable query."""
    out = []

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel {p.get('id')} {p.get('title')!r} {t.get('refId')}", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
            m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", q)
            out.append((f"variable {v['name']}", m.group(1) if m else q))
    return out


def dashboard_structure(dash):
    p = []
    if not dash.get("uid") or not dash.get("title"):
        p.append("dashboard needs uid and title")
    ids = []
    variables = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        p.append("a datasource variable is expected (no hard-coded data source uid)")
    for panel in dash.get("panels", []):
        ids.append(panel.get("id"))
        g = panel.get("gridPos", {})
        if not {"h", "w", "x", "y"} <= set(g) or g["x"] + g["w"] > 24:
            p.append(f"panel {panel.get('id')} has a bad gridPos {g}")
        if panel.get("type") != "row":
            ds = panel.get("datasource", {})
            if ds.get("uid") != "${datasource}":
                p.append(f"panel {panel.get('id')} does not use the datasource variable")
            refs = [t.get("refId") for t in panel.get("targets", [])]
            if not refs or len(refs) != len(set(refs)):
                p.append(f"panel {panel.get('id')} needs targets with unique refIds")
        for t in panel.get("targets", []):
            for var in re.findall(r"\$\{?([a-zA-Z_]\w*)", t.get("expr", "")):
                if var not in variables and not var.startswith("__"):
                    p.append(f"panel {panel.get('id')} uses undefined variable ${var}")
    if len(ids) != len(set(ids)):
        p.append("panel ids are not unique")
    return p


def substitute(expr):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return re.sub(r"\$\{?[a-zA-Z_]\w*\}?", ".*", expr)


def main(scrape, dashboard, rules, out_dir):
    ok = True
    bad, n = self_test()
    for e, got, want in bad:
        print(f"    metric_names({e!r}) = {got}, expected {want}")
    print(f"{'PASS' if not bad else 'FAIL'} PromQL metric-name extraction self-test ({n} cases)")
    ok &= not bad

    exported = scrape_names(scrape)
    src = source_names()
    p = []
    if not any(n.startswith("DCGM_FI_DEV_") for n in exported) or "gpu_warden_build_info" not in exported:
        p.append(f"the scrape looks wrong: {sorted(exported)[:10]}")
    for name, why in STATEFUL.items():
        # A histogram's _bucket/_sum/_count series are written from its family name.
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        if f'"{name}"' not in src and f'"{family}"' not in src:
            p.append(f"allow-listed {name} ({why}) is not in src/: remove it or fix the name")
    print(f"{'PASS' if not p else 'FAIL'} live scrape has {len(exported)} series names; allow-list names exist in src/")
    for x in p:
        print(f"    {x}")
    ok &= not p

    with open(dashboard) as f:
        dash = json.load(f)
    structure = dashboard_structure(dash)
    for x in structure:
        print(f"    {x}")
    print(f"{'PASS' if not structure else 'FAIL'} dashboard JSON parses and is well-formed ({len(dash.get('panels', []))} panels)")
    ok &= not structure

    checks = [("dashboard", dashboard_queries(dash), {})]
    if os.path.exists(rules):
        with open(rules) as f:
            groups = yaml.safe_load(f)["groups"]
        rule_queries = [(f"rule {r.get('alert') or r.get('record')}", str(r["expr"])) for g in groups for r in g["rules"]]
        checks.append(("PrometheusRule", rule_queries, EXTERNAL))
    else:
        print(f"FAIL PrometheusRule metrics: no rule file {rules} (the prometheus-operator overlay did not render)")
        ok = False

    for label, queries, allowed in checks:
        unknown, used_stateful, used = [], set(), set()
        for where, expr in queries:
            for name in metric_names(expr):
                used.add(name)
                if name in exported:
                    continue
                if name in STATEFUL:
                    used_stateful.add(name)
                elif name not in allowed:
                    unknown.append(f"{where}: {name} is not exported by gpu-warden")
        for x in unknown:
            print(f"    {x}")
        print(f"{'PASS' if not unknown else 'FAIL'} {label}: every queried metric is exported ({len(queries)} queries, {len(used)} metrics; "
              f"state-dependent, allow-listed: {', '.join(sorted(used_stateful)) or 'none'})")
        ok &= not unknown

    rules_out = [{"record": f"dashboard:query_{i}", "expr": substitute(expr)}
                 for i, (_, expr) in enumerate(dashboard_queries(dash))]
    with open(os.path.join(out_dir, "dashboard-queries.rules.yaml"), "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules_out}]}, f, sort_keys=False, width=1000)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
