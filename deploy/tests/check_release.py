#!/usr/bin/env python3
"""What scripts/release.sh pushed to a real registry can be installed and pulled back.

    check_release.py RELEASE_JSON IMAGE_ARCHIVE WORK_DIR

RELEASE_JSON is the manifest release.sh wrote; the registry (Debian's docker-registry,
started by deploy/check.sh on loopback, plain HTTP) still holds what it pushed. One PASS/FAIL
line each:
  - the chart installs from oci:// by its digest with Helm's engine (helm-python-sdk's
    install, --dry-run=client), with no image value, and every gpu-warden container runs the
    released image by digest; its archive pulled back has the recorded digest;
  - the image pulled back by digest (skopeo) is the one built: the registry's manifest is
    byte for byte the archive's, hashes to the recorded digest, and every blob of the copy
    pulled into an OCI layout hashes to its name.
"""
import hashlib
import json
import os
import subprocess
import sys

import yaml

import helm_python as helm
from checklib import report, summary

# Dry-run installs never reach it, but Helm's action configuration wants a cluster named.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def skopeo(*args):
    r = subprocess.run(["skopeo", *args], capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"skopeo {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def check_chart(rel, work):
    p = []
    chart = rel["chart"]
    ref = chart["reference"]  # oci://…/gpu-warden@sha256:…
    want = rel["image"]["reference"]
    images = []
    try:
        with helm.Config(kubeconfig_content=KUBECONFIG, storage_driver="memory", namespace="gpu-warden") as cfg:
            out = cfg.install(ref, "gpu-warden", None, namespace="gpu-warden", dry_run="client", plain_http=True)
        manifest = out.get("manifest", "")
        for o in yaml.safe_load_all(manifest):
            if o and o.get("kind") in ("DaemonSet", "Deployment"):
                for c in o["spec"]["template"]["spec"]["containers"]:
                    images.append(c["image"])
        if not images:
            p.append("the install rendered no DaemonSet")
        if any(i != want for i in images if "kube-scheduler" not in i):
            p.append(f"containers run {sorted(set(images))}, not {want}")
    except (helm.HelmError, KeyError, TypeError, yaml.YAMLError) as e:
        p.append(f"install {ref}: {e}")
    try:
        dest = os.path.join(work, "chart")
        os.makedirs(dest, exist_ok=True)
        helm.pull(f"{chart['repository'].rstrip('/')}/{chart['name']}", version=chart["version"],
                  destination=dest, plain_http=True)
        got = helm.digest(os.path.join(dest, f"{chart['name']}-{chart['version']}.tgz"))
        if got != chart["archiveDigest"]:
            p.append(f"the chart pulled back hashes to {got}, release.json says {chart['archiveDigest']}")
    except (helm.HelmError, OSError) as e:
        p.append(f"pull {chart['name']} {chart['version']}: {e}")
    report(not p, f"chart installed from {ref} with Helm's engine (--dry-run=client): "
           f"its gpu-warden containers run {want}; pulled back, the archive is the one pushed", p)


def check_image(rel, archive, work):
    p = []
    img = rel["image"]
    ref = img["reference"]
    try:
        remote = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{ref}")
        local = skopeo("inspect", "--raw", f"oci-archive:{archive}")
        digest = "sha256:" + hashlib.sha256(remote).hexdigest()
        if digest != img["digest"]:
            p.append(f"the registry's manifest hashes to {digest}, release.json says {img['digest']}")
        if remote != local:
            p.append("the registry's manifest differs from the built archive's")
        layout = os.path.join(work, "image")
        skopeo("copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}", f"oci:{layout}:pulled")
        blobs = os.path.join(layout, "blobs", "sha256")
        names = sorted(os.listdir(blobs))
        for name in names:
            with open(os.path.join(blobs, name), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != name:
                    p.append(f"pulled blob {name} does not hash to its name")
        wanted = {d["digest"].split(":", 1)[1] for d in json.loads(remote)["layers"]}
        wanted.add(json.loads(remote)["config"]["digest"].split(":", 1)[1])
        if not wanted <= set(names):
            p.append(f"pulled layout lacks blobs {sorted(wanted - set(names))}")
    except (RuntimeError, OSError, KeyError, ValueError, subprocess.SubprocessError) as e:
        p.append(str(e))
    report(not p, f"image pulled back by digest {ref}: the manifest is the built archive's, every blob verified", p)


def main(release_json, archive, work):
    helm.disable_logging()
    os.makedirs(work, exist_ok=True)
    with open(release_json) as f:
        rel = json.load(f)
    check_chart(rel, work)
    check_image(rel, archive, work)
    return summary("check_release")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
