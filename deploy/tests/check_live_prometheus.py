#!/usr/bin/env python3
"""A real Prometheus (Debian's `prometheus`) scrapes the running simulated agent, to check
two claims of deploy/ against a live server rather than by reading:

1. honorLabels (components/prometheus-operator/servicemonitor.yaml). Two scrape jobs of the
   same agent carry the target labels prometheus-operator attaches (namespace, pod,
   container of the *agent* pod): with honor_labels the workload's labels of
   gpu_warden_container_* stay as exposed and host processes (empty pod labels) are not
   attributed to the agent pod; without it they become exported_*.
2. The dashboard's queries return data: every query of deploy/grafana/gpu-warden.json, with
   its Grafana variables set to match everything, returns at least one series, except
   queries of families the agent exposes only in some states (check_metric_usage.STATEFUL).
3. The dashboard beside dcgm-exporter (issue 39): a job `dcgm` stands for dcgm-exporter (the
   same GPUs' DCGM_FI_* series only, under another instance), a job `dropped` for gpu-warden
   with serviceMonitor.dropDcgmFamilies (no DCGM_FI_*, instance = the node). With the job and
   node variables on gpu-warden's job, or on "All", every DCGM panel shows each GPU exactly
   once (three jobs write its series) and still has data when gpu-warden's own DCGM series are
   dropped; the GPUs stat counts each GPU once.

    check_live_prometheus.py AGENT_PORT DASHBOARD.json WORK_DIR
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from check_metric_usage import STATEFUL, dashboard_queries, metric_names

AGENT_POD = {"namespace": "gpu-warden", "pod": "gpu-warden-x7k2p", "container": "gpu-warden"}
# Queries that legitimately return nothing from a standalone (--kube off) simulated agent.
EMPTY_OK = {
    # The annotation timestamp stays 0 without a cluster; the panel filters on > 0.
    "gpu_warden_node_annotation_last_success_timestamp_seconds",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


# The dashboard's textbox and constant variables (a GPU's price, replicas per GPU): numbers in
# the queries, so each gets its default value, not the label matcher's ".*".
VALUES = {}


def dashboard_values(dash):
    return {v["name"]: str(v.get("current", {}).get("value", v.get("query", "")))
            for v in dash.get("templating", {}).get("list", []) if v.get("type") in ("textbox", "constant")}


def grafana_to_promql(expr, job="honor"):
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$__interval", "15s")
    expr = re.sub(r'job=~"\$job"', f'job=~"{job}"', expr)
    for name, value in VALUES.items():
        expr = re.sub(r"\$\{?" + re.escape(name) + r"\}?(?!\w)", value, expr)
    return re.sub(r"\$\{?[a-zA-Z_]\w*\}?", ".*", expr)


def beside_dcgm_exporter(port, dash):
    """Claim 3: the DCGM panels with three exporters of the same GPUs' series."""
    gpus = {s["metric"]["UUID"] for s in query(port, 'gpu_warden_gpu_memory_pressure{job="honor"}')}
    p, n = [], 0
    # Grafana's "All" of the job variable: every job with gpu_warden_build_info.
    every = "|".join(sorted({s["metric"]["job"] for s in query(port, "gpu_warden_build_info")}))
    for job, instance in (("honor", ".*"), ("dropped", "gpu-node-a"), (every, ".*")):
        for where, expr in dashboard_queries(dash):
            stat = "'GPUs' " in where
            if "DCGM_FI_" not in expr and not stat:
                continue
            if metric_names(expr) & set(STATEFUL) or "gpu_warden_ci_job" in expr:
                continue
            promql = grafana_to_promql(expr.replace('instance=~"$instance"', f'instance=~"{instance}"'), job)
            try:
                result = query(port, promql)
            except (RuntimeError, OSError) as e:
                p.append(f"{where} ({job}): query failed: {e}")
                continue
            n += 1
            if stat:
                got = [float(s["value"][1]) for s in result]
                if got != [float(len(gpus))]:
                    p.append(f"{where} ({job}): {got}, the scenario has {len(gpus)} GPUs")
                continue
            if "sum(" in expr.split("(", 1)[0] + "(" and len(result) == 1:
                continue  # a total: one series
            uuids = [s["metric"].get("UUID") for s in result]
            if sorted(uuids) != sorted(gpus):
                p.append(f"{where} ({job}): {len(uuids)} series for {len(gpus)} GPUs "
                         f"({len(uuids) - len(set(uuids))} repeated, {len(gpus - set(uuids))} missing)")
    for x in p[:12]:
        print(f"    {x}")
    print(f"{'PASS' if not p else 'FAIL'} beside dcgm-exporter: {n} DCGM queries show each of the {len(gpus)} GPUs "
          "once with three jobs writing their series, also with gpu-warden's DCGM families dropped and with "
          f"every job selected ({every})")
    return not p


def main(agent_port, dashboard, work):
    prom = shutil.which("prometheus")
    if not prom:
        print("FAIL live Prometheus: `prometheus` not found (apt-get install prometheus)")
        return 1
    os.makedirs(work, exist_ok=True)
    port = free_port()
    labels = json.dumps(AGENT_POD)
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write(f"""global: {{scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}}
scrape_configs:
  - job_name: honor
    honor_labels: true
    static_configs: [{{targets: ['127.0.0.1:{agent_port}'], labels: {labels}}}]
  - job_name: plain
    honor_labels: false
    static_configs: [{{targets: ['127.0.0.1:{agent_port}'], labels: {labels}}}]
  - job_name: dcgm
    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]
    relabel_configs: [{{target_label: instance, replacement: '10.0.3.7:9400'}}]
    metric_relabel_configs: [{{source_labels: [__name__], regex: 'DCGM_FI_.*', action: keep}}]
  - job_name: dropped
    honor_labels: true
    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]
    relabel_configs: [{{target_label: instance, replacement: 'gpu-node-a'}}]
    metric_relabel_configs: [{{source_labels: [__name__], regex: 'DCGM_FI_.*', action: drop}}]
""")
    log = open(os.path.join(work, "prometheus.log"), "w")
    proc = subprocess.Popen([prom, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/data",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    ok = True
    try:
        # Wait for a few scrapes of both jobs: rate() over 1m needs two samples.
        deadline = time.time() + 30
        while True:
            try:
                if len(query(port, 'count_over_time(up{job=~"honor|plain|dcgm|dropped"}[1m]) >= 3')) == 4:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                print(f"FAIL live Prometheus: no scrapes within 30 s (see {work}/prometheus.log)")
                return 1
            time.sleep(0.25)

        fam = "gpu_warden_container_gpu_memory_used_bytes"
        p = []
        honor = query(port, f'{fam}{{job="honor"}}')
        workload = [s["metric"] for s in honor if s["metric"].get("pod")]
        host = [s["metric"] for s in honor if not s["metric"].get("pod")]
        if not workload or any(m["pod"] == AGENT_POD["pod"] or m.get("namespace") == AGENT_POD["namespace"] for m in workload):
            p.append(f"honor_labels: workload series lost their labels: {workload[:2]}")
        if any(k.startswith("exported_") for m in workload + host for k in m):
            p.append("honor_labels: exported_* labels appeared")
        if not host:
            p.append("the scenario should have a host process (empty pod labels) on some GPU")
        if any(m.get("namespace") or m.get("container") for m in host):
            p.append(f"honor_labels: host-process series took the agent pod's labels: {host[:1]}")
        dcgm = query(port, 'DCGM_FI_DEV_FB_USED{job="honor"}')
        if not dcgm or any(s["metric"].get("pod") != AGENT_POD["pod"] for s in dcgm):
            p.append("DCGM families should carry the agent pod's target labels (as with dcgm-exporter)")
        plain = query(port, f'{fam}{{job="plain", exported_pod!=""}}')
        if not plain or any(s["metric"].get("pod") != AGENT_POD["pod"] for s in plain):
            p.append("without honor_labels the workload's pod label should be renamed to exported_pod")
        for x in p:
            print(f"    {x}")
        print(f"{'PASS' if not p else 'FAIL'} honorLabels on a live Prometheus: workload labels kept "
              f"({len(workload)} series), host processes unattributed ({len(host)}), exported_pod without it ({len(plain)})")
        ok &= not p

        with open(dashboard) as f:
            dash = json.load(f)
        VALUES.update(dashboard_values(dash))
        p, checked, skipped = [], 0, 0
        for where, expr in dashboard_queries(dash):
            names = metric_names(expr)
            promql = grafana_to_promql(expr)
            try:
                result = query(port, promql)
            except (RuntimeError, OSError) as e:
                p.append(f"{where}: query failed: {e}")
                continue
            if names & (set(STATEFUL) | EMPTY_OK):
                skipped += 1
                continue
            checked += 1
            if not result:
                p.append(f"{where}: no data for {promql}")
        for x in p:
            print(f"    {x}")
        print(f"{'PASS' if not p else 'FAIL'} dashboard queries return data from a live scrape "
              f"({checked} with data; {skipped} of state-dependent families ran without error)")
        ok &= not p
        ok &= beside_dcgm_exporter(port, dash)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
