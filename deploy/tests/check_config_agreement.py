#!/usr/bin/env python3
"""The chart and the programs agree on every policy of deploy/tests/config-agreement.yaml.

    check_config_agreement.py GPU_WARDEN_BIN WORK_DIR

Each case goes to the Helm chart (Helm's own engine, helm-python-sdk: values.schema.json and
the template checks) and to `gpu-warden check-config` (the agent's and the extender's own
parsers, the code they run at start). The file check-config reads is the one the chart
renders into its ConfigMap (policy.yaml, extender.yaml); where the chart refuses, the policy
as the chart would have merged it over its defaults. One PASS/FAIL line per case: FAIL when
one accepts what the other refuses, when a refusal does not name the key, or when both differ
from the verdict the table states. Then a line checking that every key of the schema's
policies appears in some case.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

import yaml

import helm_python as helm
from checklib import report, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CHART = os.path.join(ROOT, "deploy", "helm", "gpu-warden")
TABLE = os.path.join(HERE, "config-agreement.yaml")
RELEASE = NAMESPACE = "gpu-warden"

# table -> (values path of the policy, check-config flag, rendered ConfigMap and key)
KINDS = {
    "guard": (("guard", "policy"), "--guard-policy", ("gpu-warden-policy", "policy.yaml")),
    "extender": (("scheduler", "extender", "policy"), "--extender-config",
                 ("gpu-warden-scheduler-config", "extender.yaml")),
}


def merge(base, over):
    """Helm's coalescing of user values over the chart's: maps merge, the rest replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def nested(path, leaf):
    out = leaf
    for k in reversed(path):
        out = {k: out}
    return out


def chart_values(kind, case):
    # image.repository has no default (deploy/tests/check_helm.py checks the refusal).
    values = {"image": {"repository": "registry.example.com/platform/gpu-warden"}}
    values = merge(values, nested(KINDS[kind][0], case.get("policy") or {}))
    if kind == "extender":
        values = merge(values, {"scheduler": {"enabled": True}})
    return merge(values, case.get("values") or {})


def chart_verdict(chart, values):
    """(None, rendered objects) or (error message, None)."""
    try:
        out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    except helm.HelmError as e:
        return " ".join(str(e).split()), None
    objects = []
    for path in sorted(out):
        if not path.endswith("NOTES.txt"):
            objects += [o for o in yaml.safe_load_all(out[path]) if o]
    return None, objects


def policy_file(kind, case, objects, chart_defaults):
    """The text the program would read: the rendered ConfigMap's, else the merged policy."""
    cm_name, key = KINDS[kind][2]
    for o in objects or []:
        if o.get("kind") == "ConfigMap" and o["metadata"]["name"] == cm_name:
            return o["data"][key]
    if kind == "guard" and not case.get("policy") and objects is not None:
        return ""  # no policy: the chart passes no --guard-config, the agent takes its defaults
    policy = case.get("policy") or {}
    if kind == "extender":
        policy = merge(chart_defaults["scheduler"]["extender"]["policy"], policy)
    return yaml.safe_dump(policy, sort_keys=False)


def names_key(message, kind, key):
    """Whether a chart message names the key: the schema's /a/b path or the template's a.b."""
    dotted = ".".join(KINDS[kind][0]) + "." + key
    slashed = "/" + dotted.replace(".", "/").replace("[", "/").replace("]", "")
    # An unknown key: "at '/guard/policy': additional properties 'sotf' not allowed".
    parent, _, leaf = slashed.rpartition("/")
    unknown = f"at '{parent}'" in message and f"'{leaf}'" in message
    return dotted in message or slashed in message or unknown


def check_config(binary, kind, text, prefix, work, i):
    path = os.path.join(work, f"{kind}-{i}.yaml")
    with open(path, "w") as f:
        f.write(text)
    args = [binary, "check-config", KINDS[kind][1], path]
    if prefix:
        args += ["--annotation-prefix", prefix]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WARDEN_")}
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=30)
    line = (r.stdout.strip().splitlines() or [""])[-1]
    message = line[len(path) + 2:] if line.startswith(path + ": ") else line
    if r.returncode not in (0, 1) or (r.returncode == 0) != (message == "ok"):
        raise RuntimeError(f"check-config exit {r.returncode}: {r.stdout.strip()} {r.stderr.strip()}")
    return None if r.returncode == 0 else message


def schema_keys(schema, kind):
    node = schema
    for k in KINDS[kind][0]:
        node = node["properties"][k]
    out = set()
    for k, v in node["properties"].items():
        out.add(k)
        for nk in (v.get("properties") or {}):
            out.add(f"{k}.{nk}")
    return out


def case_keys(policy):
    out = set()
    for k, v in (policy or {}).items():
        out.add(k)
        if isinstance(v, dict):
            out |= {f"{k}.{nk}" for nk in v}
    return out


def main(binary, work):
    helm.disable_logging()
    os.makedirs(work, exist_ok=True)
    with open(TABLE) as f:
        table = yaml.safe_load(f)
    chart = helm.Chart.load(CHART)
    with open(os.path.join(CHART, "values.yaml")) as f:
        chart_defaults = yaml.safe_load(f)
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    counts = {"agree": 0, "pending": 0}
    for kind in KINDS:
        covered = set()
        for i, case in enumerate(table.get(kind) or []):
            covered |= case_keys(case.get("policy"))
            key = case.get("refused")
            want = f"refused naming {key}" if key else "accepted"
            title = f"agreement: {kind}: {case['name']}: {json.dumps(case.get('policy'))} {want}"
            values = chart_values(kind, case)
            chart_err, objects = chart_verdict(chart, values)
            prefix = ((values.get("nodeAnnotations") or {}).get("prefix")) or None
            try:
                agent_err = check_config(binary, kind, policy_file(kind, case, objects, chart_defaults),
                                         prefix, work, i)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                report(False, title, [str(e)])
                continue
            pending = case.get("pending")
            if pending and agent_err and "unknown field" in agent_err:
                print(f"SKIP {title}: {pending}; check-config says: {agent_err}")
                counts["pending"] += 1
                continue
            p = []
            if (chart_err is None) != (agent_err is None):
                p.append(f"they disagree: the chart {'accepts' if chart_err is None else 'refuses: ' + chart_err}; "
                         f"check-config {'accepts' if agent_err is None else 'refuses: ' + agent_err}")
            elif key is None and chart_err is not None:
                p.append(f"both refuse what the table says is good: chart: {chart_err}; check-config: {agent_err}")
            elif key is not None and chart_err is None:
                p.append("both accept what the table says is refused")
            elif key is not None:
                if not names_key(chart_err, kind, key):
                    p.append(f"the chart's refusal does not name {'.'.join(KINDS[kind][0])}.{key}: {chart_err}")
                if case.get("names", key) not in agent_err:
                    p.append(f"check-config's refusal does not name {case.get('names', key)}: {agent_err}")
            if not p:
                counts["agree"] += 1
            report(not p, title, p)
        missing = sorted(schema_keys(schema, kind) - covered)
        report(not missing, f"agreement: every {'.'.join(KINDS[kind][0])} key of values.schema.json is in a {kind} case",
               [f"no case sets {m}" for m in missing])
    print(f"agreement: {counts['agree']} cases agree, {counts['pending']} pending")
    chart.close()
    return summary("check_config_agreement")


if __name__ == "__main__":
    from check_helm import quiet_symlink_notes
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(quiet_symlink_notes(main, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tmp))
