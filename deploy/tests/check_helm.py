#!/usr/bin/env python3
"""The Helm chart, rendered and linted by Helm's own engine (helm-python-sdk: Helm v4's Go SDK).

    check_helm.py KUSTOMIZE_RENDERED_DIR HELM_RENDERED_DIR ARTIFACT_DIR

KUSTOMIZE_RENDERED_DIR holds <overlay>.yaml as `kubectl kustomize` printed them (deploy/check.sh,
step 1). Checks, each printed as one PASS/FAIL line:
  - `helm lint --strict` of the chart with its defaults and with every values file in
    deploy/helm/gpu-warden/ci/, for the oldest and the newest Kubernetes the project supports;
  - renders every ci/<combination>-values.yaml (release gpu-warden in namespace gpu-warden;
    namespace-create in namespace default) into HELM_RENDERED_DIR/helm-<combination>.yaml, for
    check_manifests.py --helm and check_agent_args.py (the same checks the overlays pass);
  - each overlay and its chart combination render the same objects with the same specs
    (labels may differ; the generated ConfigMaps' name hashes — the enforce policy's, the
    scheduler profile's — and the chart's checksum annotations aside, their data compared as
    parsed YAML), so the two install paths cannot drift (the scheduler overlay included); the
    chart renders no Namespace unless namespace.create (Helm creates the release namespace);
  - every values file in deploy/tests/helm-bad-values/ is refused, by render and by lint,
    with the message its `# expect:` line names; the near misses in ACCEPTED render;
  - the values in deploy/examples (OpenTofu's gpu-warden-values.yaml, the Argo CD
    Application's valuesObject) render;
  - `helm package` (the SDK's) writes ARTIFACT_DIR/gpu-warden-<version>.tgz, which holds the
    dashboard and rules as files (not links), leaves ci/ out, and renders as the directory does.
"""
import copy
import glob
import json
import tempfile
import os
import re
import sys
import tarfile

import yaml

import helm_python as helm
from checklib import report, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CHART = os.path.join(ROOT, "deploy", "helm", "gpu-warden")
RELEASE, NAMESPACE = "gpu-warden", "gpu-warden"
KUBE_VERSIONS = ("v1.27.0", "v1.37.0")  # as check_manifests.py validates schemas
# overlay -> chart combination rendering the same objects
PAIRS = {"default": "default", "enforce": "enforce", "no-runtimeclass": "no-runtimeclass",
         "prometheus-operator": "prometheus-operator", "beside-dcgm-exporter": "beside-dcgm-exporter",
         "pod-resources": "pod-resources", "scheduler": "scheduler"}
# Near misses of the refused values: these must render.
ACCEPTED = [
    ({"guard": {"policy": {"hard": "2Gi", "soft": "3%"}}}, "mixed units (ordered per GPU by its total, as the agent does)"),
    ({"guard": {"policy": {"hard": 1024, "soft": "1.5Gi"}}}, "MiB as a number below a size"),
    ({"guard": {"policy": {"soft": "60%", "reclaimMargin": "39%"}}}, "soft + reclaimMargin just below 100%"),
    ({"guard": {"mode": "enforce"}}, "enforce without a policy file"),
    ({"service": {"port": 9401}}, "another port"),
    ({"scheduler": {"enabled": True, "replicas": 1, "leaderElection": False}}, "one scheduler replica without leader election"),
    ({"scheduler": {"enabled": True, "extender": {"policy": {"unknownNeed": {"rule": "reserve", "mib": 4096}, "defaults": [
        {"namespace": "gitlab-ci", "selector": "project.runner.gitlab.com/id=42", "mib": 12288}]}}}},
     "the extender policy's reserve rule and a per-runner default"),
    ({"scheduler": {"enabled": True, "schedulerName": "gpu-ci", "image": {"digest": "sha256:" + "ab" * 32}}},
     "another profile name, the kube-scheduler image by digest"),
    ({"scheduler": {"enabled": False, "schedulerName": "default-scheduler"}}, "the scheduler's rules only apply when it is enabled"),
    ({"scheduler": {"enabled": True, "extender": {"learnedSecret": "prom-creds", "policy": {"learned": {
        "prometheusUrl": "https://prometheus.example.com", "caFile": "/etc/gpu-warden-learned/ca.crt",
        "basicAuth": {"username": "extender", "passwordFile": "/etc/gpu-warden-learned/password"}}}}}},
     "the learned-needs source over https with a CA and basic auth from a mounted Secret"),
]



def load_values(path):
    # Helm's own -f parsing, not PyYAML's.
    with open(path) as f:
        return helm.values_from_yaml(f.read())


# runtimeClassName: auto renders `nvidia` only where Helm's `lookup` finds that RuntimeClass
# in a live cluster; offline (here, `helm template`, Argo CD) it finds none and renders no
# runtimeClassName. The combinations stand for an install on a cluster that has it (the
# overlays name it), unless they set runtimeClassName themselves; check_runtime_class checks
# the offline render of auto.
LIVE_CLUSTER = {"runtimeClassName": "nvidia"}
# image.repository has no default (the chart refuses to render without it, checked by
# check_image_required); every render here names the kustomize manifests' image.
INSTALL = {"image": {"repository": "ghcr.io/gpu-warden/gpu-warden"}}


def merge(base, over):
    """Helm's coalescing of user values over others: maps merge, the rest replaces."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def combinations():
    out = {}
    for path in sorted(glob.glob(os.path.join(CHART, "ci", "*-values.yaml"))):
        out[os.path.basename(path)[: -len("-values.yaml")]] = merge(LIVE_CLUSTER, load_values(path))
    return out


def check_runtime_class(chart):
    """auto, offline: no runtimeClassName, and NOTES.txt says why; a name is used as given."""
    p = []
    try:
        objects, notes = render(chart, {})
        pod = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        if "runtimeClassName" in pod:
            p.append(f"auto rendered runtimeClassName {pod['runtimeClassName']!r} with no cluster to look up")
        if "no RuntimeClass \"nvidia\"" not in notes:
            p.append(f"NOTES.txt does not explain the runtimeClassName chosen: {notes[-600:]!r}")
        objects, notes = render(chart, {"runtimeClassName": "nvidia"})
        pod = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        if pod.get("runtimeClassName") != "nvidia":
            p.append(f"runtimeClassName: nvidia rendered {pod.get('runtimeClassName')!r}")
    except (helm.HelmError, StopIteration) as e:
        p.append(repr(e))
    report(not p, "runtimeClassName auto: none rendered offline (lookup sees no cluster), NOTES.txt says why; "
           "a name is rendered as given", p)


def check_image_required(chart):
    """No placeholder image: a render without image.repository stops with a message naming it."""
    try:
        render(chart, {}, install=False)
        report(False, "image.repository required", ["the defaults rendered without an image repository"])
    except helm.HelmError as e:
        msg = " ".join(str(e).split())
        ok = "image.repository is required" in msg and "scripts/release.sh" in msg
        report(ok, f"image.repository required: {msg[msg.find('image.repository'):][:120]}",
               [] if ok else [f"unclear refusal: {msg}"])


def check_release_names(chart):
    """The alert rules and the extender's scrape objects follow the release's names."""
    p = []
    values = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}, "scheduler": {"enabled": True}}
    try:
        out = chart.render(merge(INSTALL, values), name="gpuw", namespace="gpu", is_install=True)
    except helm.HelmError as e:
        report(False, "release gpuw: alert rules and extender scrape objects", [str(e)])
        return
    objects = [o for path in sorted(out) if not path.endswith("NOTES.txt") for o in yaml.safe_load_all(out[path]) if o]
    ds = [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"]
    exprs = [r["expr"] for o in objects if o["kind"] == "PrometheusRule"
             for g in o["spec"]["groups"] for r in g["rules"]]
    if ds != ["gpuw-gpu-warden"]:
        p.append(f"DaemonSets {ds}")
    if not any('daemonset="gpuw-gpu-warden"' in e for e in exprs):
        p.append("no rule names the DaemonSet gpuw-gpu-warden")
    stale = [e for e in exprs if 'daemonset="gpu-warden"' in e]
    if stale:
        p.append(f"rules still name the kustomize DaemonSet: {stale}")
    svc = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    sms = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceMonitor"}
    deploy = next((o for o in objects if o["kind"] == "Deployment"), None)
    ext = svc.get("gpuw-gpu-warden-scheduler")
    sm = sms.get("gpuw-gpu-warden-scheduler")
    if ext is None or sm is None or deploy is None:
        p.append(f"extender Service/ServiceMonitor missing: Services {sorted(svc)}, ServiceMonitors {sorted(sms)}")
    else:
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        if any(pod_labels.get(k) != v for k, v in ext["spec"]["selector"].items()):
            p.append("the extender Service does not select the scheduler pods")
        ports = [pt for c in deploy["spec"]["template"]["spec"]["containers"] for pt in c.get("ports", [])]
        if ext["spec"]["ports"][0]["targetPort"] not in [pt.get("name") for pt in ports]:
            p.append("the extender Service targets no named container port")
        labels = ext["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in sm["spec"]["selector"]["matchLabels"].items()):
            p.append("the extender ServiceMonitor does not select its Service")
        agent_sm = sms.get("gpuw-gpu-warden")
        if agent_sm and all(labels.get(k) == v for k, v in agent_sm["spec"]["selector"]["matchLabels"].items()):
            p.append("the agents' ServiceMonitor selects the extender's Service too (scraped twice)")
        if sm["spec"]["endpoints"][0]["port"] not in [pt["name"] for pt in ext["spec"]["ports"]]:
            p.append("the extender ServiceMonitor names no port of its Service")
    report(not p, "release gpuw: alerts name DaemonSet gpuw-gpu-warden; the extender's Service and ServiceMonitor "
           "select its pods and port", p)


def render(chart, values, namespace=NAMESPACE, install=True):
    """Rendered objects (NOTES.txt apart) in template order, and the NOTES. install: the
    values merged over INSTALL (the image repository)."""
    out = chart.render(merge(INSTALL, values) if install else values, name=RELEASE, namespace=namespace,
                       is_install=True)
    objects, notes = [], ""
    for path in sorted(out):
        if path.endswith("NOTES.txt"):
            notes = out[path]
            continue
        objects += [o for o in yaml.safe_load_all(out[path]) if o]
    return objects, notes


def lint_problems(values, kube_version):
    rep = helm.lint(CHART, values, strict=True, kube_version=kube_version)
    # severity: 1 info, 2 warning, 3 error; --strict fails on warnings too.
    return [f"{m['path']}: {m['error'].strip()}" for m in rep["messages"] if m["severity"] >= 2] + \
        [e.strip() for e in rep["errors"] if e.strip() and not any(e.strip() in m["error"] for m in rep["messages"])]


# ---------------------------------------------------------------- equivalence

POLICY_CM = re.compile(r"^gpu-warden-policy(-[a-z0-9]{10})?$")
SCHEDULER_CM = re.compile(r"^gpu-warden-scheduler-config(-[a-z0-9]{10})?$")


def generated_cm(name):
    """The unhashed name of a kustomize-generated ConfigMap (the chart's name), else None."""
    for pattern, plain in ((POLICY_CM, "gpu-warden-policy"), (SCHEDULER_CM, "gpu-warden-scheduler-config")):
        if pattern.match(name):
            return plain
    return None


def normalize(objects):
    """Objects keyed by (kind, name), without what may legitimately differ between the two
    install paths: metadata labels (Helm's own), the order of the name-keyed lists env,
    volumes and volumeMounts (a strategic merge patch puts its entries first), the kustomize
    hash in the policy ConfigMap's name and the chart's checksum annotation standing in for it."""
    out = {}
    for o in objects:
        o = copy.deepcopy(o)
        md = o["metadata"]
        md.pop("labels", None)
        if o["kind"] == "ConfigMap" and generated_cm(md["name"]):
            md["name"] = generated_cm(md["name"])
            o["data"] = {k: yaml.safe_load(v) for k, v in o.get("data", {}).items()}
        if o["kind"] == "Deployment":
            tmpl = o["spec"]["template"]
            ann = tmpl["metadata"].get("annotations", {})
            ann.pop("checksum/scheduler-config", None)
            if not ann:
                tmpl["metadata"].pop("annotations", None)
            for v in tmpl["spec"].get("volumes", []):
                if "configMap" in v and generated_cm(v["configMap"]["name"]):
                    v["configMap"]["name"] = generated_cm(v["configMap"]["name"])
        if o["kind"] == "DaemonSet":
            tmpl = o["spec"]["template"]
            ann = tmpl["metadata"].get("annotations", {})
            ann.pop("checksum/guard-policy", None)
            if not ann:
                tmpl["metadata"].pop("annotations", None)
            for v in tmpl["spec"].get("volumes", []):
                if "configMap" in v and POLICY_CM.match(v["configMap"]["name"]):
                    v["configMap"]["name"] = "gpu-warden-policy"
            by_name = lambda items: sorted(items, key=lambda x: x["name"])  # noqa: E731
            if "volumes" in tmpl["spec"]:
                tmpl["spec"]["volumes"] = by_name(tmpl["spec"]["volumes"])
            for c in tmpl["spec"].get("containers", []):
                for k in ("env", "volumeMounts"):
                    if k in c:
                        c[k] = by_name(c[k])
        out[(o["kind"], md["name"])] = o
    return out


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: only in the chart: {json.dumps(b[k])[:200]}")
            elif k not in b:
                out.append(f"{path}.{k}: only in kustomize: {json.dumps(a[k])[:200]}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    if a != b:
        return [f"{path}: kustomize {json.dumps(a)[:200]} != chart {json.dumps(b)[:200]}"]
    return []


def equivalence(kustomize_objects, chart_objects, namespace_expected):
    k, c = normalize(kustomize_objects), normalize(chart_objects)
    p = []
    for key in sorted(set(k) | set(c)):
        if key not in c:
            if key[0] == "Namespace" and not namespace_expected:
                continue  # Helm's --create-namespace (or namespace.create) makes it
            p.append(f"{key[0]}/{key[1]}: only in kustomize")
        elif key not in k:
            p.append(f"{key[0]}/{key[1]}: only in the chart")
        else:
            p += [f"{key[0]}/{key[1]}{d}" for d in differences(k[key], c[key])]
    return p


# ---------------------------------------------------------------- package

def check_package(chart, default_objects, artifact_dir):
    p = []
    os.makedirs(artifact_dir, exist_ok=True)
    for old in glob.glob(os.path.join(artifact_dir, "gpu-warden-*.tgz")):
        os.remove(old)
    path = helm.package(CHART, destination=artifact_dir)
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in ("gpu-warden/files/gpu-warden.json", "gpu-warden/files/prometheusrule.yaml"):
            m = members.get(name)
            if m is None or not m.isfile():
                p.append(f"{name} missing or not a regular file in the package")
        if "gpu-warden/files/gpu-warden.json" in members:
            with open(os.path.join(ROOT, "deploy", "grafana", "gpu-warden.json"), "rb") as f:
                if tar.extractfile("gpu-warden/files/gpu-warden.json").read() != f.read():
                    p.append("the packaged dashboard differs from deploy/grafana/gpu-warden.json")
        leaked = [n for n in members if n.startswith("gpu-warden/ci/")]
        if leaked:
            p.append(f".helmignore lets the CI values into the package: {leaked}")
    with helm.Chart.load(path) as packaged:
        objects, _ = render(packaged, dict(LIVE_CLUSTER))
        if objects != default_objects:
            p.append("the packaged chart renders differently from deploy/helm/gpu-warden")
    size = os.path.getsize(path)
    report(not p, f"helm package: {os.path.relpath(path, ROOT)} ({size} bytes, {helm.digest(path)}), "
           f"{len(members)} entries, renders as the directory", p)


def main(kustomize_dir, helm_dir, artifact_dir):
    helm.disable_logging()
    print(f"helm-python-sdk {helm.__version__}: Helm SDK {helm.helm_sdk_version()}")
    os.makedirs(helm_dir, exist_ok=True)
    combos = combinations()
    chart = helm.Chart.load(CHART)
    meta = chart.metadata
    p = []
    if meta.get("apiVersion") != "v2":
        p.append(f"Chart.yaml apiVersion {meta.get('apiVersion')}, expected v2")
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        import tomllib
        # The workspace's one version: every crate of it says `version.workspace = true`.
        version = tomllib.load(f)["workspace"]["package"]["version"]
    if meta.get("appVersion") != version:
        p.append(f"appVersion {meta.get('appVersion')} != the agent's version {version} (Cargo.toml)")
    if chart.schema is None:
        p.append("no values.schema.json")
    report(not p, f"Chart.yaml: {meta.get('name')} {meta.get('version')}, appVersion {meta.get('appVersion')}, with a values schema", p)

    # lint
    for name, values in [("defaults", None)] + list(combos.items()):
        problems = []
        for kv in KUBE_VERSIONS:
            problems += [f"Kubernetes {kv}: {x}" for x in lint_problems(merge(INSTALL, values), kv)]
        report(not problems, f"helm lint --strict: {name} (Kubernetes {' and '.join(KUBE_VERSIONS)})", problems)

    # render
    rendered = {}
    for name, values in combos.items():
        ns = "default" if (values.get("namespace") or {}).get("create") else NAMESPACE
        try:
            objects, notes = render(chart, values, ns)
        except helm.HelmError as e:
            report(False, f"helm render: {name}", [str(e)])
            continue
        rendered[name] = objects
        with open(os.path.join(helm_dir, f"helm-{name}.yaml"), "w") as f:
            yaml.safe_dump_all(objects, f, sort_keys=False)
        kinds = sorted({o["kind"] for o in objects})
        p = [] if "rollout status" in notes else ["NOTES.txt rendered without the rollout command"]
        report(not p, f"helm render: {name}: {len(objects)} objects ({', '.join(kinds)}), NOTES.txt", p)

    check_runtime_class(chart)
    check_image_required(chart)
    check_release_names(chart)

    # Turning the ServiceMonitor on or off (scrape discovery) must not change the agents'
    # pod template: a changed template rolls every agent and resets the guard's state.
    p = []
    templates = []
    for sm in (False, True):
        try:
            objs, _ = render(chart, {"serviceMonitor": {"enabled": sm}})
            templates.append([o["spec"]["template"] for o in objs if o["kind"] == "DaemonSet"])
        except helm.HelmError as e:
            p.append(f"serviceMonitor.enabled={sm}: {e}")
    if len(templates) == 2 and templates[0] != templates[1]:
        p += differences(templates[0], templates[1], "DaemonSet.spec.template")
    report(not p, "serviceMonitor.enabled true/false renders the same DaemonSet pod template (no rollout)", p)

    # equivalence with kustomize
    for overlay, combo in PAIRS.items():
        kpath = os.path.join(kustomize_dir, f"{overlay}.yaml")
        if combo not in rendered or not os.path.exists(kpath):
            report(False, f"chart {combo} equivalent to overlay {overlay}: a render is missing")
            continue
        with open(kpath) as f:
            kobjs = [o for o in yaml.safe_load_all(f) if o]
        p = equivalence(kobjs, rendered[combo], namespace_expected=False)
        if any(o["kind"] == "Namespace" for o in rendered[combo]):
            p.append("the chart renders a Namespace although namespace.create is false")
        report(not p, f"chart ci/{combo}-values.yaml renders what `kubectl kustomize deploy/overlays/{overlay}` does "
               f"({len(kobjs)} objects; labels aside; the Namespace is Helm's)", p)
    if "namespace-create" in rendered and os.path.exists(os.path.join(kustomize_dir, "default.yaml")):
        with open(os.path.join(kustomize_dir, "default.yaml")) as f:
            kobjs = [o for o in yaml.safe_load_all(f) if o]
        p = equivalence(kobjs, rendered["namespace-create"], namespace_expected=True)
        report(not p, "chart with namespace.create renders exactly `kubectl kustomize deploy/overlays/default`, Namespace included", p)
    # The enforce combination carries the enforce overlay's policy, key for key.
    with open(os.path.join(ROOT, "deploy", "overlays", "enforce", "policy.yaml")) as f:
        policy = yaml.safe_load(f)
    enforce = combos.get("enforce", {}).get("guard", {}).get("policy")
    report(enforce == policy, "ci/enforce-values.yaml guard.policy == deploy/overlays/enforce/policy.yaml",
           [] if enforce == policy else [f"chart {enforce}", f"overlay {policy}"])

    # refused values
    bad = sorted(glob.glob(os.path.join(HERE, "helm-bad-values", "*.yaml")))
    for path in bad:
        with open(path) as f:
            text = f.read()
        m = re.search(r"^# expect: (.+)$", text, re.M)
        rel = os.path.relpath(path, ROOT)
        if not m:
            report(False, f"refused: {rel}: no '# expect: <message>' line")
            continue
        want = m.group(1).strip()
        p = []
        shown = want
        try:
            render(chart, load_values(path))
            p.append("rendered without an error")
        except helm.HelmError as e:
            msg = str(e)
            if want not in msg:
                p.append(f"refused with {msg!r}, which does not say {want!r}")
            shown = msg.strip().splitlines()[-1]
            # Schema refusals show in `helm lint` too. The cross-field checks are template
            # `fail`s, which Helm's lint mode deliberately turns into log lines (as it does
            # `required`); `helm install`/`template`/`upgrade` refuse them, as render does here.
            if isinstance(e, helm.HelmValuesError):
                lint = lint_problems(merge(INSTALL, load_values(path)), KUBE_VERSIONS[-1])
                if not any(want in x for x in lint):
                    p.append(f"helm lint does not report {want!r}: {lint}")
        report(not p, f"refused: {rel}: {shown if not p else want}", p)
    report(len(bad) >= 10, f"{len(bad)} refused values files (at least 10 expected)")
    for values, why in ACCEPTED:
        try:
            render(chart, values)
            report(True, f"accepted: {json.dumps(values)} ({why})")
        except helm.HelmError as e:
            report(False, f"accepted: {json.dumps(values)} ({why})", [str(e)])

    # the examples' values
    ex = os.path.join(ROOT, "deploy", "examples")
    p = []
    try:
        render(chart, load_values(os.path.join(ex, "opentofu", "gpu-warden-values.yaml")))
    except (helm.HelmError, OSError) as e:
        p.append(f"deploy/examples/opentofu/gpu-warden-values.yaml: {e}")
    # The OpenTofu release names this chart, its version and that values file.
    with open(os.path.join(ex, "opentofu", "main.tf")) as f:
        tf = f.read()
    block = re.search(r'resource "helm_release" "gpu_warden" \{(.*?)\n\}', tf, re.S)
    body = block.group(1) if block else ""
    for key, want in (("chart", "gpu-warden"), ("version", meta.get("version"))):
        got = re.search(rf'^\s*{key}\s*=\s*"([^"]*)"', body, re.M)
        if not got or got.group(1) != want:
            p.append(f"main.tf helm_release.gpu_warden {key} = {got.group(1) if got else None!r}, expected {want!r}")
    if 'file("${path.module}/gpu-warden-values.yaml")' not in body:
        p.append("main.tf helm_release.gpu_warden does not take its values from gpu-warden-values.yaml")
    try:
        with open(os.path.join(ex, "argocd-application.yaml")) as f:
            app = yaml.safe_load(f)
        src = app["spec"]["source"]
        if src.get("chart") != "gpu-warden" or src.get("targetRevision") != meta.get("version"):
            p.append(f"Argo CD Application source {src.get('chart')} {src.get('targetRevision')}, "
                     f"expected gpu-warden {meta.get('version')}")
        render(chart, src["helm"]["valuesObject"])
    except (helm.HelmError, OSError, KeyError, TypeError) as e:
        p.append(f"deploy/examples/argocd-application.yaml: {e!r}")
    report(not p, "deploy/examples: OpenTofu and Argo CD name this chart and version, and their values render", p)

    if "default" in rendered:
        check_package(chart, rendered["default"], artifact_dir)
    chart.close()
    return summary("check_helm")


def quiet_symlink_notes(fn, *args):
    """Runs fn with file descriptor 2 captured: the Go side logs one INFO line per files/ link
    at every chart load, straight to stderr. Everything else it (or Python) wrote is shown."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            return fn(*args)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines():
                if "found symbolic link in path" not in line:
                    print(line, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(quiet_symlink_notes(main, sys.argv[1], sys.argv[2], sys.argv[3]))
