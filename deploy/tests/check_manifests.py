#!/usr/bin/env python3
"""Offline checks of the rendered kustomize overlays, of the Helm chart's renders and of deploy/examples.

    check_manifests.py RENDERED_DIR OUT_DIR
    check_manifests.py --helm RENDERED_DIR OUT_DIR

RENDERED_DIR holds <overlay>.yaml, one per deploy/overlays/<overlay>, as `kubectl kustomize`
printed them; with --helm, helm-<combination>.yaml, one per values file
deploy/helm/gpu-warden/ci/<combination>-values.yaml, as Helm's engine rendered them
(check_helm.py), each judged against its expectations in HELM below. Checks, each printed as
one PASS/FAIL line:
  - every object validates against the Kubernetes OpenAPI schemas of kubernetes-validate
    (strict: unknown fields refused), for every Kubernetes minor version from MIN_K8S to the
    newest the package ships; ServiceMonitor and PrometheusRule (CRDs, not in those schemas)
    against deploy/tests/schemas/*.json;
  - RBAC is exactly DESIGN §3.6 (check_rbac.py);
  - the DaemonSet keeps its contract (hostPID, non-root, no privilege, probes, env, …) and
    each overlay does what its name says;
  - Service, ServiceMonitor and pod labels and ports line up;
  - the dashboard ConfigMap carries deploy/grafana/gpu-warden.json byte for byte;
  - deploy/examples parse, validate, and agree with the enforce policy.
Writes OUT_DIR/gpu-warden.rules.yaml (the PrometheusRule's groups) for promtool, and
OUT_DIR/<overlay>.container.json (helm-<combination>.container.json with --helm: env, args,
mounted ConfigMaps and Secrets, guard mode) for check_agent_args.py.
"""
import json
import os
import re
import sys
import tomllib

import importlib_resources
import jsonschema
import yaml
from referencing import Registry, Resource

from check_rbac import rbac_problems, scheduler_rbac_problems, split_scheduler
from checklib import report, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MIN_K8S = (1, 27)  # oldest minor still in any managed offering's extended support window
NAMESPACE = "gpu-warden"
IMAGE = "ghcr.io/gpu-warden/gpu-warden:0.1.0"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("argoproj.io/v1alpha1", "Application"): "application-argoproj-v1alpha1.json",
}
OVERLAYS = {
    # overlay: guard mode, runtimeClassName expected, prometheus-operator objects, port
    "default": dict(mode="dry-run", runtime_class=True, prom=False, port=9400),
    # UID 0 with CAP_KILL only: the guard stops the victim's GPU processes (onDecision: stop).
    "enforce": dict(mode="enforce", runtime_class=True, prom=False, port=9400, kill=True),
    "no-runtimeclass": dict(mode="dry-run", runtime_class=False, prom=False, port=9400),
    "prometheus-operator": dict(mode="dry-run", runtime_class=True, prom=True, port=9400),
    "beside-dcgm-exporter": dict(mode="dry-run", runtime_class=True, prom=False, port=9401),
    # UID 0 (no capabilities) so the agent may connect to the kubelet's root-owned socket.
    "pod-resources": dict(mode="dry-run", runtime_class=True, prom=False, port=9400, root=True),
    # The default install plus the gpu-warden-scheduler profile (kube-scheduler + extender).
    "scheduler": dict(mode="dry-run", runtime_class=True, prom=False, port=9400, scheduler=True),
}
# The one host path the agent mounts: the kubelet's pod-resources directory, read-only.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
# Optional expectation keys and their defaults (an overlay states only what differs).
DEFAULTS = dict(image=IMAGE, node_selector={"nvidia.com/gpu.present": "true"}, policy=None,
                namespace_object=True, tls=False, auth=None, drop_dcgm=False, web_config=False)
# Families a drop rule for dcgm-exporter's duplicates must drop, and must keep.
DCGM_NAMES = ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
OWN_NAMES = ["gpu_warden_container_gpu_memory_used_bytes", "gpu_warden_gpu_memory_pressure", "up"]
# The Helm chart's CI value combinations (deploy/helm/gpu-warden/ci/<name>-values.yaml).
# Helm creates the release namespace (--create-namespace), so the chart renders no
# Namespace unless told to (namespace-create).
HELM = {
    "default": dict(mode="dry-run", runtime_class=True, prom=False, port=9400, namespace_object=False),
    "enforce": dict(mode="enforce", runtime_class=True, prom=False, port=9400, namespace_object=False, policy=True,
                    kill=True),
    "no-runtimeclass": dict(mode="dry-run", runtime_class=False, prom=False, port=9400, namespace_object=False),
    "prometheus-operator": dict(mode="dry-run", runtime_class=True, prom=True, port=9400, namespace_object=False),
    "beside-dcgm-exporter": dict(mode="dry-run", runtime_class=True, prom=False, port=9401, namespace_object=False),
    "beside-dcgm-exporter-prometheus-operator": dict(mode="dry-run", runtime_class=True, prom="servicemonitor",
                                                     port=9401, namespace_object=False, drop_dcgm=True),
    "namespace-create": dict(mode="dry-run", runtime_class=True, prom=False, port=9400),
    "pod-resources": dict(mode="dry-run", runtime_class=True, prom=False, port=9400, namespace_object=False,
                          root=True),
    "scheduler": dict(mode="dry-run", runtime_class=True, prom=False, port=9400, namespace_object=False,
                      scheduler=True),
    "scheduler-prometheus-operator": dict(mode="dry-run", runtime_class=True, prom=True, port=9400,
                                          namespace_object=False, scheduler=True),
    "annotations-off": dict(mode="off", runtime_class=True, prom=False, port=9400, namespace_object=False),
    "tls-auth": dict(mode="dry-run", runtime_class=True, prom="servicemonitor", port=9400, namespace_object=False,
                     tls=True, auth="bearer"),
    "basic-auth": dict(mode="dry-run", runtime_class=True, prom="servicemonitor", port=9400, namespace_object=False,
                       auth="basic"),
    # exporter-toolkit's web config file from a Secret; it holds a tls_server_config (https: true).
    "web-config": dict(mode="dry-run", runtime_class=True, prom="servicemonitor", port=9400, namespace_object=False,
                       tls=True, web_config=True),
    "dcgm-exporter-style": dict(
        mode="dry-run", runtime_class=True, prom="servicemonitor", port=9400, namespace_object=False,
        image="123456789012.dkr.ecr.eu-west-1.amazonaws.com/platform/gpu-warden@sha256:"
              "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        # Helm merges maps: the default nvidia.com/gpu.present stays unless set to null.
        node_selector={"eks.amazonaws.com/nodegroup": "gpu-ci", "nvidia.com/gpu.present": "true"}),
}
EXPECT = OVERLAYS  # the table main() judges renders by (HELM with --helm)
TAG = ""  # "helm " in the PASS/FAIL lines of Helm renders



def load(path):
    with open(path) as f:
        return [o for o in yaml.safe_load_all(f) if o]


# ---------------------------------------------------------------- schemas

class K8sSchemas:
    """kubernetes-validate's bundled JSON schemas, loaded once per version."""

    def __init__(self):
        self.base = importlib_resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
        versions = []
        for d in self.base.iterdir():
            name = d.name
            if name.endswith("-local-strict"):
                major, minor = name[1:].split("-")[0].split(".")[:2]
                versions.append((int(major), int(minor)))
        self.versions = sorted(v for v in versions if v >= MIN_K8S)
        self.cache = {}

    def validator(self, version, api_version, kind):
        d = self.base.joinpath(f"v{version[0]}.{version[1]}.0-local-strict")
        group_version = api_version.split("/")
        if len(group_version) == 2:
            group = group_version[0].split(".")[0]
            fname = f"{kind.lower()}-{group}-{group_version[1]}.json"
        else:
            fname = f"{kind.lower()}-{api_version}.json"
        key = (version, fname)
        if key not in self.cache:
            path = d.joinpath(fname)
            if not path.is_file():
                self.cache[key] = None
            else:
                if version not in self.cache:
                    self.cache[version] = Resource.from_contents(json.loads(d.joinpath("_definitions.json").read_text()))
                schema = json.loads(path.read_text())
                registry = Resource.from_contents(schema) @ (self.cache[version] @ Registry())
                self.cache[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self.cache[key]


def crd_validator(api_version, kind):
    fname = CRD_SCHEMAS.get((api_version, kind))
    if not fname:
        return None
    with open(os.path.join(HERE, "schemas", fname)) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors_of(validator, obj):
    out = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(map(str, e.absolute_path)) or "(root)"
        out.append(f"{path}: {e.message[:300]}")
    return out


def check_schemas(label, objects, k8s):
    details = []
    for o in objects:
        ident = f"{o.get('kind')}/{o.get('metadata', {}).get('name')}"
        crd = crd_validator(o.get("apiVersion"), o.get("kind"))
        if crd is not None:
            details += [f"{ident} (CRD subset schema): {e}" for e in errors_of(crd, o)]
            continue
        found = False
        for v in k8s.versions:
            val = k8s.validator(v, o.get("apiVersion", ""), o.get("kind", ""))
            if val is None:
                continue
            found = True
            details += [f"{ident} against Kubernetes {v[0]}.{v[1]}: {e}" for e in errors_of(val, o)]
        if not found:
            details.append(f"{ident}: no schema for {o.get('apiVersion')} {o.get('kind')}")
    lo, hi = k8s.versions[0], k8s.versions[-1]
    report(not details, f"schemas: {label}: {len(objects)} objects, Kubernetes {lo[0]}.{lo[1]}..{hi[0]}.{hi[1]} strict + CRD subsets", details)


# ---------------------------------------------------------------- contract

def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found[0] if len(found) == 1 else None


def check_daemonset(overlay, objects, out_dir):
    exp = {**DEFAULTS, **EXPECT[overlay]}
    mode, runtime_class = exp["mode"], exp["runtime_class"]
    p = []
    ds = one(objects, "DaemonSet", "gpu-warden")
    if ds is None:
        report(False, f"daemonset contract: {overlay}", ["no single DaemonSet gpu-warden"])
        return
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    containers = pod.get("containers", [])
    c = containers[0] if len(containers) == 1 else {}
    if len(containers) != 1:
        p.append("expected exactly one container")
    if pod.get("initContainers"):
        p.append("no init containers expected")
    sel = spec.get("selector", {}).get("matchLabels", {})
    tmpl_labels = spec["template"]["metadata"].get("labels", {})
    if sel != {"app.kubernetes.io/name": "gpu-warden"}:
        p.append(f"selector changed to {sel} (immutable on a live DaemonSet)")
    if any(tmpl_labels.get(k) != v for k, v in sel.items()):
        p.append("pod template labels do not match the selector")
    us = spec.get("updateStrategy", {})
    if us.get("type") != "RollingUpdate" or not us.get("rollingUpdate", {}).get("maxUnavailable"):
        p.append(f"updateStrategy must be RollingUpdate with maxUnavailable: {us}")
    if pod.get("nodeSelector") != exp["node_selector"]:
        p.append(f"nodeSelector: {pod.get('nodeSelector')}")
    if {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} not in pod.get("tolerations", []):
        p.append("missing toleration nvidia.com/gpu Exists NoSchedule")
    if pod.get("hostPID") is not True:
        p.append("hostPID must be true (NVML reports host PIDs)")
    for k in ("hostNetwork", "hostIPC"):
        if pod.get(k):
            p.append(f"{k} must not be set")
    if runtime_class and pod.get("runtimeClassName") != "nvidia":
        p.append(f"runtimeClassName must be nvidia, is {pod.get('runtimeClassName')}")
    if not runtime_class and "runtimeClassName" in pod:
        p.append("runtimeClassName must be absent in this overlay")
    if pod.get("priorityClassName") != "system-node-critical":
        p.append("priorityClassName must be system-node-critical")
    if pod.get("serviceAccountName") != "gpu-warden" or pod.get("automountServiceAccountToken") is False:
        p.append("must run as ServiceAccount gpu-warden with its token")
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    if exp.get("root") or exp.get("kill"):
        # Root without any capability (but KILL, for stop at decision): it owns the
        # kubelet's socket, or may signal the victim's processes; nothing more.
        if uid != 0 or csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not False:
            p.append(f"runAsUser must be 0 with runAsNonRoot false in this overlay, is {uid}")
    elif not (psc.get("runAsNonRoot") and csc.get("runAsNonRoot", True)):
        p.append("runAsNonRoot must be true")
    elif not isinstance(uid, int) or uid == 0:
        p.append(f"runAsUser must be a non-zero UID, is {uid}")
    if csc.get("allowPrivilegeEscalation") is not False:
        p.append("allowPrivilegeEscalation must be false")
    if csc.get("readOnlyRootFilesystem") is not True:
        p.append("readOnlyRootFilesystem must be true")
    if csc.get("privileged"):
        p.append("privileged must not be set")
    caps = csc.get("capabilities", {})
    if exp.get("kill"):
        if caps.get("drop") != ["ALL"] or caps.get("add") != ["KILL"]:
            p.append(f"capabilities must drop ALL and add only KILL (stop at decision): {caps}")
    elif caps.get("drop") != ["ALL"] or caps.get("add"):
        p.append(f"capabilities must drop ALL and add nothing: {caps}")
    if c.get("image") != exp["image"]:
        p.append(f"image {c.get('image')} != {exp['image']}")
    env = {e["name"]: e for e in c.get("env", [])}
    for name, want in (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
                       ("GPU_WARDEN_BACKEND", "nvml"), ("GPU_WARDEN_GUARD_MODE", mode)):
        if env.get(name, {}).get("value") != want:
            p.append(f"env {name} must be {want!r}, is {env.get(name)}")
    if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        p.append("env NODE_NAME must come from fieldRef spec.nodeName")
    ports = {x.get("name"): x for x in c.get("ports", [])}
    if ports.get("metrics", {}).get("containerPort") != exp["port"]:
        p.append(f"container port 'metrics' must be {exp['port']}: {ports}")
    listen = env.get("GPU_WARDEN_LISTEN", {}).get("value", "0.0.0.0:9400")
    if not listen.endswith(f":{exp['port']}"):
        p.append(f"GPU_WARDEN_LISTEN {listen} disagrees with the metrics port {exp['port']}")
    web_config = env.get("GPU_WARDEN_WEB_CONFIG_FILE", {}).get("value")
    if bool(web_config) != exp["web_config"]:
        p.append(f"GPU_WARDEN_WEB_CONFIG_FILE {'expected' if exp['web_config'] else 'not expected'}: {web_config}")
    if web_config:
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        folder = os.path.dirname(web_config)
        if "secret" not in vols.get(mounts.get(folder, ""), {}):
            p.append(f"the web config file's folder {folder} must be a Secret mounted whole (no subPath: it is re-read)")
        old_flags = [n for n in env if n.startswith(("GPU_WARDEN_WEB_TLS_", "GPU_WARDEN_WEB_AUTH_"))]
        if old_flags:
            p.append(f"the agent refuses --web.config.file beside {old_flags}")
    # With a web config file the chart cannot read whether it serves TLS: its `https` value says so.
    tls = "GPU_WARDEN_WEB_TLS_CERT" in env or bool(web_config and exp["tls"])
    if tls != exp["tls"]:
        p.append(f"HTTPS (GPU_WARDEN_WEB_TLS_CERT) {'expected' if exp['tls'] else 'not expected'}")
    if ("GPU_WARDEN_WEB_TLS_CERT" in env) != ("GPU_WARDEN_WEB_TLS_KEY" in env):
        p.append("GPU_WARDEN_WEB_TLS_CERT and GPU_WARDEN_WEB_TLS_KEY go together")
    auth = {"GPU_WARDEN_WEB_AUTH_BEARER_FILE": "bearer", "GPU_WARDEN_WEB_AUTH_BASIC_FILE": "basic"}
    got_auth = [kind for name, kind in auth.items() if name in env]
    if got_auth != ([exp["auth"]] if exp["auth"] else []):
        p.append(f"authentication {got_auth or 'none'}, expected {exp['auth'] or 'none'}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        hg = c.get(probe, {}).get("httpGet", {})
        if hg.get("path") != path or hg.get("port") not in ("metrics", ports.get("metrics", {}).get("containerPort")):
            p.append(f"{probe} must GET {path} on the metrics port: {hg}")
        if hg.get("scheme", "HTTP") != ("HTTPS" if tls else "HTTP"):
            p.append(f"{probe} scheme {hg.get('scheme', 'HTTP')} but the agent serves {'HTTPS' if tls else 'HTTP'}")
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(res.get(kind, {})):
            p.append(f"resources.{kind} must set cpu and memory")
    # Mounted ConfigMaps must exist in the render; the enforce overlay passes its policy.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    configmaps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    files = {}
    pod_resources = False
    secrets = {}
    for m in c.get("volumeMounts", []):
        v = volumes.get(m["name"])
        if v is None:
            p.append(f"volumeMount {m['name']} has no volume")
        elif "hostPath" in v:
            # The directory (the kubelet recreates the socket on restart), read-only, at the
            # same path so the default --pod-resources-socket finds it; no other host path.
            if (v["hostPath"].get("path") != POD_RESOURCES_DIR or m.get("mountPath") != POD_RESOURCES_DIR
                    or m.get("readOnly") is not True or v["hostPath"].get("type") not in (None, "", "Directory")):
                p.append(f"the only host path is {POD_RESOURCES_DIR} (the directory), mounted read-only at the same path: {m} {v}")
            pod_resources = True
        elif "configMap" in v:
            cm = configmaps.get(v["configMap"]["name"])
            if cm is None:
                p.append(f"volume {m['name']} names ConfigMap {v['configMap']['name']}, not in the render")
            else:
                for key, text in cm.get("data", {}).items():
                    files[os.path.join(m["mountPath"], key)] = text
        elif "secret" in v and set(v) == {"name", "secret"}:
            secrets[m["mountPath"]] = v["secret"].get("secretName")
        elif set(v) - {"name", "emptyDir"}:
            p.append(f"volume {m['name']} is not a ConfigMap, Secret, emptyDir or the pod-resources host path")
    if not pod_resources:
        p.append(f"the kubelet's pod-resources directory {POD_RESOURCES_DIR} must be mounted read-only")
    for name in ("GPU_WARDEN_WEB_TLS_CERT", "GPU_WARDEN_WEB_TLS_KEY", "GPU_WARDEN_WEB_AUTH_BEARER_FILE",
                 "GPU_WARDEN_WEB_AUTH_BASIC_FILE"):
        path = env.get(name, {}).get("value")
        if path is not None and os.path.dirname(path) not in secrets:
            p.append(f"env {name}={path} is not in a mounted Secret ({sorted(secrets)})")
    args = c.get("args", [])
    if exp["policy"] if exp["policy"] is not None else overlay == "enforce":
        cfg = [a.split("=", 1)[1] for a in args if a.startswith("--guard-config=")]
        if len(cfg) != 1 or cfg[0] not in files:
            p.append(f"--guard-config must name a file mounted from a ConfigMap: args={args}")
        else:
            policy = yaml.safe_load(files[cfg[0]])
            if "mode" in policy:
                p.append("policy.yaml must not set mode (GPU_WARDEN_GUARD_MODE does)")
    elif any(a.startswith("--guard-config") for a in args):
        p.append("only the enforce overlay passes a policy file")
    with open(os.path.join(out_dir, f"{TAG.replace(' ', '-')}{overlay}.container.json"), "w") as f:
        json.dump({"env": c.get("env", []), "args": args, "files": files, "secrets": secrets,
                   "command": c.get("command"), "mode": mode}, f, indent=1)
    report(not p, f"daemonset contract: {TAG}{overlay} (guard {mode}, runtimeClassName {'nvidia' if runtime_class else 'absent'}, port {exp['port']})", p)


def check_wiring(overlay, objects):
    exp = {**DEFAULTS, **EXPECT[overlay]}
    p = []
    for o in objects:
        ns = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED:
            if ns:
                p.append(f"{o['kind']}/{o['metadata']['name']} is cluster-scoped but has namespace {ns}")
        elif ns != NAMESPACE:
            p.append(f"{o['kind']}/{o['metadata']['name']} is in namespace {ns!r}, not {NAMESPACE}")
        # Client-side `kubectl apply` copies each object into an annotation (256 KiB limit).
        size = len(json.dumps(o, separators=(",", ":")))
        if size > 200 * 1024:
            p.append(f"{o['kind']}/{o['metadata']['name']} is {size} bytes: too large for kubectl apply's last-applied annotation")
    ns = one(objects, "Namespace", NAMESPACE)
    if not exp["namespace_object"]:
        if any(o["kind"] == "Namespace" for o in objects):
            p.append("no Namespace expected (Helm creates the release namespace)")
    elif ns is None:
        p.append("Namespace gpu-warden missing")
    elif ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") not in (None, "privileged"):
        p.append("Pod Security level must allow hostPID (privileged)")
    ds = one(objects, "DaemonSet", "gpu-warden")
    svc = one(objects, "Service", "gpu-warden")
    if svc is None or ds is None:
        p.append("Service gpu-warden or DaemonSet missing")
    else:
        labels = ds["spec"]["template"]["metadata"].get("labels", {})
        if not svc["spec"].get("selector") or any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
            p.append("Service selector does not select the agent pods")
        cports = {x.get("name"): x["containerPort"] for x in ds["spec"]["template"]["spec"]["containers"][0].get("ports", [])}
        sports = {x.get("name"): x for x in svc["spec"].get("ports", [])}
        m = sports.get("metrics")
        if m is None or m.get("targetPort") not in ("metrics", cports.get("metrics")):
            p.append("Service port 'metrics' must target the container's metrics port")
        # The scrape annotations are the Service's: on the pod template, toggling the
        # ServiceMonitor would restart every agent.
        annotations = svc["metadata"].get("annotations", {})
        pod_annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        if any(k.startswith("prometheus.io/") for k in pod_annotations):
            p.append("prometheus.io/* annotations belong on the Service, not the agent pods (a toggle would roll them)")
        if m is not None and annotations.get("prometheus.io/port") != str(cports.get("metrics")):
            p.append("the Service's prometheus.io/port annotation disagrees with the metrics port")
        if not exp["prom"] and annotations.get("prometheus.io/scrape") != "true":
            p.append("without a ServiceMonitor the Service needs prometheus.io/scrape: \"true\" (annotation-based discovery)")
        # The agents' (the scheduler profile's extender has its own, gpu-warden-scheduler).
        sm = one(objects, "ServiceMonitor", "gpu-warden")
        if sports.get("metrics", {}).get("port") != cports.get("metrics"):
            p.append("Service port and container port differ: scrape configs would be confusing")
        if exp["prom"]:
            if sm is None or (exp["prom"] is True and one(objects, "PrometheusRule") is None):
                p.append("ServiceMonitor and PrometheusRule expected")
            elif exp["prom"] != True and one(objects, "PrometheusRule") is not None:  # noqa: E712
                p.append("only a ServiceMonitor expected")
            else:
                msel = sm["spec"]["selector"].get("matchLabels", {})
                slabels = svc["metadata"].get("labels", {})
                if any(slabels.get(k) != v for k, v in msel.items()):
                    p.append(f"ServiceMonitor selector {msel} does not select Service labels {slabels}")
                for ep in sm["spec"]["endpoints"]:
                    if ep.get("port") not in sports:
                        p.append(f"ServiceMonitor port {ep.get('port')} is not a Service port name")
                    if ep.get("honorLabels") is not True:
                        p.append("ServiceMonitor endpoints need honorLabels: true (workload namespace/pod/container labels)")
                    if ep.get("scheme", "http") != ("https" if exp["tls"] else "http"):
                        p.append(f"ServiceMonitor scheme {ep.get('scheme', 'http')} but the agent serves {'https' if exp['tls'] else 'http'}")
                    if exp["auth"] == "bearer" and ep.get("authorization", {}).get("type") != "Bearer":
                        p.append("ServiceMonitor must send the bearer token (authorization: Bearer)")
                    if exp["auth"] == "basic" and not ep.get("basicAuth"):
                        p.append("ServiceMonitor must send basicAuth")
                    # Prometheus anchors relabel regexes: a full match drops the series.
                    drops = [re.compile(r.get("regex", "(.*)")) for r in ep.get("metricRelabelings", [])
                             if r.get("action", "replace").lower() == "drop" and r.get("sourceLabels") == ["__name__"]]
                    dropped = lambda n: any(x.fullmatch(n) for x in drops)  # noqa: E731
                    if exp["drop_dcgm"] and not all(dropped(n) for n in DCGM_NAMES):
                        p.append("beside dcgm-exporter the ServiceMonitor must drop every DCGM_FI_* family")
                    if any(dropped(n) for n in OWN_NAMES) or (not exp["drop_dcgm"] and any(dropped(n) for n in DCGM_NAMES)):
                        p.append(f"ServiceMonitor drops families it must keep: {[x.pattern for x in drops]}")
                if annotations.get("prometheus.io/scrape") != "false":
                    p.append("annotation-based scraping (the Service's prometheus.io/scrape) must be off where the ServiceMonitor scrapes")
            dash = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
            with open(os.path.join(ROOT, "deploy", "grafana", "gpu-warden.json")) as f:
                want = f.read()
            if exp["prom"] is True and (len(dash) != 1 or dash[0].get("data", {}).get("gpu-warden.json") != want):
                p.append("one ConfigMap labelled grafana_dashboard=1 must carry deploy/grafana/gpu-warden.json unchanged")
        elif sm is not None or one(objects, "PrometheusRule") is not None:
            p.append("prometheus-operator objects only belong to the prometheus-operator overlay (CRDs may be missing)")
    report(not p, f"namespaces, labels and ports line up: {TAG}{overlay}", p)


def check_examples(k8s):
    ex = os.path.join(ROOT, "deploy", "examples")
    p = []
    objects = []
    for name in sorted(os.listdir(ex)):
        if name.endswith(".yaml"):
            objects += load(os.path.join(ex, name))
    check_schemas("deploy/examples/*.yaml", objects, k8s)
    ts = one(objects, "ConfigMap", "time-slicing-config")
    try:
        for key, text in ts["data"].items():
            cfg = yaml.safe_load(text)
            res = cfg["sharing"]["timeSlicing"]["resources"]
            if cfg.get("version") != "v1" or {"name": "nvidia.com/gpu", "replicas": 4} not in res:
                p.append(f"time-slicing config {key}: want version v1 and nvidia.com/gpu replicas 4, got {cfg}")
    except (TypeError, KeyError, yaml.YAMLError) as e:
        p.append(f"time-slicing ConfigMap unreadable: {e!r}")
    pc = one(objects, "PriorityClass")
    with open(os.path.join(ex, "gitlab-runner-config.toml"), "rb") as f:
        runner = tomllib.load(f)
    with open(os.path.join(ROOT, "deploy", "overlays", "enforce", "policy.yaml")) as f:
        policy = yaml.safe_load(f)
    prefix = policy.get("annotationPrefix", "gpu-warden.io")
    k = {}
    try:
        k = runner["runners"][0]["kubernetes"]
        if pc is None or k.get("priority_class_name") != pc["metadata"]["name"]:
            p.append("runner priority_class_name must name the example PriorityClass")
        if pc is not None and pc["value"] >= policy.get("priorityCeiling", 2000000000):
            p.append("the CI PriorityClass must sit below the guard's priorityCeiling")
        for term in policy.get("selector", "").split(","):
            if term and "=" in term and "!=" not in term:
                key, value = term.split("=", 1)
                if k.get("pod_labels", {}).get(key.strip()) != value.strip():
                    p.append(f"runner pod_labels must carry the policy selector {term}")
        if f"{prefix}/vram-request-mib" not in k.get("pod_annotations", {}):
            p.append(f"runner pod_annotations should declare {prefix}/vram-request-mib")
        if k.get("node_tolerations", {}).get("nvidia.com/gpu") != "NoSchedule":
            p.append("runner must tolerate the nvidia.com/gpu taint")
        for ps in k.get("pod_spec", []):
            yaml.safe_load(ps["patch"])
    except (KeyError, IndexError, TypeError, yaml.YAMLError) as e:
        p.append(f"gitlab-runner-config.toml unexpected shape: {e!r}")
    # The overwrite pattern, the job's overrides and OpenTofu: deploy/tests/check_examples.py.
    report(not p, "examples: time-slicing, PriorityClass, GitLab Runner agree with the enforce policy", p)


def write_rules(objects, out_dir):
    """The PrometheusRule's groups as a rule file for `promtool check rules`, and a copy with
    only the `summary` annotation for `promtool test rules` (whose expected alerts must list
    every annotation: the long descriptions stay out of the tests, their templates are
    still parsed by `check rules`)."""
    pr = one(objects, "PrometheusRule", "gpu-warden")
    groups = pr["spec"]["groups"]
    with open(os.path.join(out_dir, "gpu-warden.rules.yaml"), "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False, width=1000)
    slim = json.loads(json.dumps(groups))
    for g in slim:
        for r in g["rules"]:
            if "annotations" in r:
                r["annotations"] = {k: v for k, v in r["annotations"].items() if k == "summary"}
    with open(os.path.join(out_dir, "gpu-warden.rules-summary-only.yaml"), "w") as f:
        yaml.safe_dump({"groups": slim}, f, sort_keys=False, width=1000)


def check_scheduler_profile(objects):
    """The KubeSchedulerConfiguration names the extender the sidecar serves, with the wire
    options the extender is built for; leader election on its own lease."""
    p = []
    cms = [o for o in objects if o["kind"] == "ConfigMap" and "scheduler-config.yaml" in (o.get("data") or {})]
    dep = next((o for o in objects if o["kind"] == "Deployment"), None)
    if len(cms) != 1 or dep is None:
        return ["one ConfigMap with scheduler-config.yaml and one Deployment expected"]
    cfg = yaml.safe_load(cms[0]["data"]["scheduler-config.yaml"])
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or cfg.get("kind") != "KubeSchedulerConfiguration":
        p.append("scheduler-config.yaml is not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")
    le = cfg.get("leaderElection") or {}
    if not le.get("leaderElect") or le.get("resourceName") != "gpu-warden-scheduler" or le.get("resourceNamespace") != NAMESPACE:
        p.append("leader election must be on, on lease gpu-warden/gpu-warden-scheduler")
    if [pr.get("schedulerName") for pr in cfg.get("profiles") or []] != ["gpu-warden-scheduler"]:
        p.append("exactly one profile, gpu-warden-scheduler, expected")
    ext = cfg.get("extenders") or []
    spec = dep["spec"]["template"]["spec"]
    sidecar = next((c for c in spec["containers"] if c["name"] == "extender"), None)
    if len(ext) != 1 or sidecar is None:
        return p + ["one extender and one extender container expected"]
    e = ext[0]
    args = sidecar.get("args") or []
    listen = next((a.split("=", 1)[1] for a in args if a.startswith("--listen=")), "127.0.0.1:8888")
    port = listen.rsplit(":", 1)[1]
    if listen.rsplit(":", 1)[0] not in ("127.0.0.1", "localhost", "[::1]"):
        p.append(f"the extender's --listen {listen} must be loopback: the verbs carry no credentials")
    if cfg.get("percentageOfNodesToScore") != 100:
        p.append("percentageOfNodesToScore must be 100: every feasible GPU node reaches the extender")
    if not re.fullmatch(rf"https?://(127\.0\.0\.1|localhost):{port}/?", e.get("urlPrefix", "")):
        p.append(f"urlPrefix {e.get('urlPrefix')} is not the sidecar on loopback port {port}")
    want = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "nodeCacheCapable": True, "ignorable": False}
    for k, v in want.items():
        if e.get(k) != v:
            p.append(f"extender {k} must be {v!r}, is {e.get(k)!r}")
    if e.get("bindVerb"):
        p.append("binding stays with the scheduler: no bindVerb")
    if [m.get("name") for m in e.get("managedResources") or []] != ["nvidia.com/gpu"]:
        p.append("managedResources must be exactly nvidia.com/gpu")
    if args[:1] != ["extender"] or sidecar.get("image") != IMAGE:
        p.append(f"the sidecar must run `gpu-warden extender` from {IMAGE}")
    if f"--scheduler-name={cfg['profiles'][0]['schedulerName']}" not in args:
        p.append("the extender's --scheduler-name must be the profile's schedulerName (its ledger watches those pods)")
    for c in spec["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True \
                or (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
            p.append(f"container {c['name']}: no privilege escalation, read-only root, every capability dropped")
    if not (spec.get("securityContext") or {}).get("runAsNonRoot"):
        p.append("the scheduler pod runs as non-root")
    return p


def main(rendered_dir, out_dir, helm=False):
    global EXPECT, TAG
    EXPECT = HELM if helm else OVERLAYS
    TAG = "helm " if helm else ""
    what, prefix = ("helm", "helm-") if helm else ("overlay", "")
    k8s = K8sSchemas()
    rendered = {}
    for overlay in EXPECT:
        path = os.path.join(rendered_dir, f"{prefix}{overlay}.yaml")
        if not os.path.exists(path):
            report(False, f"rendered {what} present: {overlay}")
            continue
        rendered[overlay] = load(path)
    if helm:
        ci = os.path.join(ROOT, "deploy", "helm", "gpu-warden", "ci")
        on_disk = sorted(f[:-len("-values.yaml")] for f in os.listdir(ci) if f.endswith("-values.yaml"))
        report(on_disk == sorted(EXPECT), f"every chart value combination is checked: {on_disk}")
    else:
        on_disk = sorted(d for d in os.listdir(os.path.join(ROOT, "deploy", "overlays")))
        report(on_disk == sorted(OVERLAYS), f"every overlay is checked: {on_disk}")
    for overlay, objects in rendered.items():
        check_schemas(f"{what} {overlay}", objects, k8s)
        agent, sched = split_scheduler(objects)
        problems = rbac_problems(agent)
        report(not problems, f"rbac exactly DESIGN §3.6: {TAG}{overlay}", problems)
        if EXPECT[overlay].get("scheduler"):
            sp = scheduler_rbac_problems(sched) if sched else ["no scheduler profile objects"]
            sp += check_scheduler_profile(sched)
            report(not sp, f"scheduler profile: RBAC exactly DESIGN §3.7, config names the extender: {TAG}{overlay}", sp)
        else:
            report(not sched, f"no scheduler profile outside its overlay: {TAG}{overlay}",
                   [f"{o['kind']}/{o['metadata']['name']}" for o in sched])
        check_daemonset(overlay, objects, out_dir)
        check_wiring(overlay, objects)
    if helm:
        return summary("check_manifests")
    check_examples(k8s)
    if one(rendered.get("prometheus-operator", []), "PrometheusRule", "gpu-warden") is not None:
        write_rules(rendered["prometheus-operator"], out_dir)
    return summary("check_manifests")


if __name__ == "__main__":
    if sys.argv[1] == "--helm":
        sys.exit(main(sys.argv[2], sys.argv[3], helm=True))
    sys.exit(main(sys.argv[1], sys.argv[2]))
