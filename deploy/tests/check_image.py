#!/usr/bin/env python3
"""The container image scripts/image-build.sh built, unpacked and run (no container runtime:
podman/crun cannot set rlimits on these machines, DESIGN §4).

    check_image.py ARTIFACT_DIR TAG WORK_DIR

ARTIFACT_DIR holds gpu-warden-image.oci.tar (tagged TAG) and gpu-warden-image.rootfs/ (the
recipe's root filesystem). Checks, each printed as one PASS/FAIL line:
  - the image's configuration (skopeo inspect --config) has the Dockerfile final stage's
    USER, EXPOSE and ENTRYPOINT, and no CMD;
  - its labels: org.opencontainers.image.{title,description,version,revision,created,source,
    licenses}, created = SOURCE_DATE_EPOCH (when set), and no io.buildah.version;
  - `umoci unpack` of the OCI archive gives exactly the recipe's root filesystem (every path
    with its type, mode, owner and link target) and a runtime spec whose process is the
    entrypoint as 65532:65532;
  - the filesystem has what the agent needs at run time and nothing else: glibc and libgcc
    for every library the binary links (ELF NEEDED), the CA bundle, /tmp 1777, the user
    65532 in /etc/passwd and /etc/group, a dpkg status entry per package; no shell, no
    package manager, no libnvidia-ml (the NVIDIA runtime brings the node's);
  - the unpacked entrypoint, started with `chroot --userspec=65532:65532` under no_new_privs
    with the image's environment only, on the simulated backend (--kube off): it runs as
    65532 with no capabilities, becomes ready, serves /metrics, and exits 0 on SIGTERM;
  - a copy of the root filesystem without /tmp does not start (the check can fail).
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time

from checklib import free_port, get, report, summary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def dockerfile_final_stage():
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", f.read())
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith("#")]
    start = max(i for i, x in enumerate(lines) if x.upper().startswith("FROM "))
    final = lines[start:]
    pick = lambda kw: [x.split(None, 1)[1] for x in final if x.split()[0].upper() == kw]  # noqa: E731
    return {"from": final[0], "user": pick("USER")[-1], "expose": " ".join(pick("EXPOSE")).split(),
            "entrypoint": json.loads(pick("ENTRYPOINT")[-1])}


def tree(root):
    """Every path under root with what an image must preserve of it."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = "/" + os.path.relpath(path, root)
            link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
            out[rel] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, link, size)
    return out


def elf_needed(path):
    r = run(["readelf", "-d", path])
    if r.returncode != 0:
        return None
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)


def start(rootfs, spec_process, extra_args, log_path):
    """The entrypoint in a chroot as the image's user, with no_new_privs and only the image's
    environment, like a container without a runtime."""
    user = spec_process["user"]
    cmd = ["setpriv", "--no-new-privs", "chroot", f"--userspec={user['uid']}:{user['gid']}",
           f"--groups={user['gid']}", rootfs, *spec_process["args"], *extra_args]
    env = dict(e.split("=", 1) for e in spec_process.get("env", []))
    log = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT), log


def wait_ready(agent, port, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and agent.poll() is None:
        if get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
            return True
        time.sleep(0.1)
    return False


def status_fields(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def main(artifacts, tag, work):
    archive = os.path.join(artifacts, "gpu-warden-image.oci.tar")
    recipe_rootfs = os.path.join(artifacts, "gpu-warden-image.rootfs")
    want = dockerfile_final_stage()

    # -- configuration
    p = []
    r = run(["skopeo", "inspect", "--config", f"oci-archive:{archive}:{tag}"])
    if r.returncode != 0:
        report(False, f"skopeo inspect --config oci-archive:{archive}:{tag}", [r.stderr.strip()])
        return 1
    cfg = json.loads(r.stdout).get("config", {})
    if cfg.get("User") != want["user"]:
        p.append(f"User {cfg.get('User')!r}, the Dockerfile says {want['user']!r}")
    if cfg.get("Entrypoint") != want["entrypoint"]:
        p.append(f"Entrypoint {cfg.get('Entrypoint')}, the Dockerfile says {want['entrypoint']}")
    if cfg.get("Cmd"):
        p.append(f"Cmd {cfg.get('Cmd')}: the entrypoint takes its flags from the DaemonSet")
    ports = sorted(cfg.get("ExposedPorts", {}))
    expected_ports = sorted(x if "/" in x else f"{x}/tcp" for x in want["expose"])
    if ports != expected_ports:
        p.append(f"ExposedPorts {ports}, the Dockerfile says {expected_ports}")
    if want["from"] != "FROM scratch":
        p.append(f"the Dockerfile's final stage is {want['from']!r}, not FROM scratch over the recipe")
    report(not p, f"image config = the Dockerfile's final stage: user {cfg.get('User')}, "
           f"entrypoint {cfg.get('Entrypoint')}, ports {ports}", p)

    # -- labels: the OCI annotation keys, and nothing naming the builder's version (it would
    # make the digest depend on which buildah built it).
    p = []
    labels = cfg.get("Labels") or {}
    oci = "org.opencontainers.image."
    for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
        if not labels.get(oci + key):
            p.append(f"label {oci}{key} missing")
    builder = [k for k in labels if k.startswith("io.buildah.") or "builder" in k]
    if builder:
        p.append(f"builder labels {builder}: the digest would depend on the builder's version")
    if not re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels.get(oci + "revision", "")):
        p.append(f"revision {labels.get(oci + 'revision')!r} is not a commit id")
    created = labels.get(oci + "created", "")
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created):
        p.append(f"created {created!r} is not an RFC 3339 UTC time")
    elif epoch and time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch))) != created:
        p.append(f"created {created} is not SOURCE_DATE_EPOCH {epoch}")
    report(not p, f"image labels: {', '.join(sorted(k[len(oci):] for k in labels if k.startswith(oci)))}"
           f" (revision {labels.get(oci + 'revision', '')[:12]}, created {created}); no builder label", p)

    # -- umoci unpack
    layout, bundle = os.path.join(work, "layout"), os.path.join(work, "bundle")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(layout)
    with tarfile.open(archive) as t:
        t.extractall(layout, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(layout)
    r = run(["umoci", "unpack", "--image", f"{layout}:{tag}", bundle])
    if r.returncode != 0:
        report(False, "umoci unpack", [r.stderr.strip()[-500:]])
        return 1
    rootfs = os.path.join(bundle, "rootfs")
    with open(os.path.join(bundle, "config.json")) as f:
        spec = json.load(f)
    proc = spec["process"]
    p = []
    if proc["args"] != want["entrypoint"] or (proc["user"]["uid"], proc["user"]["gid"]) != (65532, 65532):
        p.append(f"runtime spec process: args {proc['args']}, user {proc['user']}")
    got, expected = tree(rootfs), tree(recipe_rootfs)
    for path in sorted(set(got) | set(expected)):
        if got.get(path) != expected.get(path):
            p.append(f"{path}: image {got.get(path)}, recipe {expected.get(path)}")
    report(not p, f"umoci unpack: {len(got)} paths, exactly the recipe's root filesystem (types, modes, "
           f"owners, links, sizes); runtime spec runs {proc['args']} as {proc['user']['uid']}:{proc['user']['gid']}", p[:40])

    # -- contents
    p = []
    entry = os.path.join(rootfs, want["entrypoint"][0].lstrip("/"))
    if not (os.path.isfile(entry) and os.access(entry, os.X_OK)):
        p.append(f"entrypoint {want['entrypoint'][0]} is not an executable file")
    needed = elf_needed(entry) or []
    libdirs = [d for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu",
                           "usr/lib/aarch64-linux-gnu", "lib64", "lib") if os.path.isdir(os.path.join(rootfs, d))]
    for lib in needed:
        if not any(os.path.exists(os.path.join(rootfs, d, lib)) for d in libdirs):
            p.append(f"the binary needs {lib}, not in the image ({libdirs})")
    if not needed:
        p.append("readelf found no NEEDED libraries (is binutils installed?)")
    tmp = os.lstat(os.path.join(rootfs, "tmp")) if os.path.isdir(os.path.join(rootfs, "tmp")) else None
    if tmp is None or stat.S_IMODE(tmp.st_mode) != 0o1777:
        p.append("/tmp must exist with mode 1777")
    for f, line in (("etc/passwd", "nonroot:x:65532:65532:"), ("etc/group", "nonroot:x:65532:")):
        with open(os.path.join(rootfs, f)) as fh:
            if not any(x.startswith(line) for x in fh):
                p.append(f"/{f} lacks {line}")
    bundle_crt = os.path.join(rootfs, "etc/ssl/certs/ca-certificates.crt")
    if not os.path.isfile(bundle_crt) or open(bundle_crt).read().count("BEGIN CERTIFICATE") < 50:
        p.append("/etc/ssl/certs/ca-certificates.crt missing or nearly empty")
    with open(os.path.join(artifacts, "gpu-warden-image.packages")) as f:
        packages = [x.split()[0] for x in f if x.strip()]
    status_d = sorted(os.listdir(os.path.join(rootfs, "var/lib/dpkg/status.d")))
    if status_d != sorted(packages):
        p.append(f"var/lib/dpkg/status.d {status_d} != the package list {packages}")
    forbidden = [x for x in got if re.search(r"^/(usr/)?s?bin/(sh|bash|dash|busybox|apt|apt-get|dpkg)$", x)
                 or "libnvidia-ml" in x]
    if forbidden:
        p.append(f"must not be in the image: {forbidden}")
    report(not p, f"contents: {', '.join(packages)}; every NEEDED library ({', '.join(needed)}); /tmp 1777; "
           "nonroot 65532; CA bundle; no shell, package manager or libnvidia-ml", p)

    # -- run it
    port = free_port()
    args = ["--backend", "sim", "--kube", "off", "--listen", f"127.0.0.1:{port}"]
    p = []
    agent, log = start(rootfs, proc, args, os.path.join(work, "agent.log"))
    try:
        if not wait_ready(agent, port, 15):
            p.append(f"not ready within 15 s (exit code {agent.poll()})")
        else:
            st = status_fields(agent.pid)
            ids = (st.get("Uid", "").split(), st.get("Gid", "").split())
            if ids != (["65532"] * 4, ["65532"] * 4) or st.get("Groups", "").split() != ["65532"]:
                p.append(f"runs as Uid {ids[0]} Gid {ids[1]} Groups {st.get('Groups')}, expected 65532 only")
            caps = {k: st.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")}
            if any(v != "0000000000000000" for v in caps.values()):
                p.append(f"has capabilities: {caps}")
            if st.get("NoNewPrivs") != "1":
                p.append(f"NoNewPrivs {st.get('NoNewPrivs')}")
            if get(f"http://127.0.0.1:{port}/healthz")[0] != 200:
                p.append("/healthz is not 200")
            status, body = get(f"http://127.0.0.1:{port}/metrics")
            samples = [x for x in body.decode(errors="replace").splitlines() if x and not x.startswith("#")]
            if status != 200 or not any(x.startswith("DCGM_FI_DEV_FB_USED{") for x in samples) \
                    or not any(x.startswith("gpu_warden_build_info{") for x in samples):
                p.append(f"/metrics answered {status} with {len(samples)} samples, no DCGM_FI_DEV_FB_USED/build_info")
    finally:
        code = None
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                code = agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
                p.append("did not exit within 10 s of SIGTERM")
        else:
            code = agent.returncode
            p.append(f"exited by itself with {code}")
        log.close()
    if code not in (0, None):
        p.append(f"exit code {code} after SIGTERM")
    with open(os.path.join(work, "agent.log")) as f:
        lines = f.read().splitlines()
    if p:
        p += [f"agent: {x[:300]}" for x in lines[-10:]]
    report(not p, f"image entrypoint run (chroot --userspec=65532:65532, no_new_privs, image env only, "
           f"--backend sim --kube off): uid 65532, no capabilities, ready, /metrics, exit {code} on SIGTERM", p)

    # -- the same without /tmp must not start: the run above would have caught a missing /tmp
    broken = os.path.join(work, "rootfs-without-tmp")
    shutil.copytree(rootfs, broken, symlinks=True)
    shutil.rmtree(os.path.join(broken, "tmp"))
    port = free_port()
    agent, log = start(broken, proc, ["--backend", "sim", "--kube", "off", "--listen", f"127.0.0.1:{port}"],
                       os.path.join(work, "broken.log"))
    try:
        ready = wait_ready(agent, port, 5)
    finally:
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        log.close()
    with open(os.path.join(work, "broken.log")) as f:
        last = (f.read().strip().splitlines() or ["(no output)"])[-1]
    report(not ready, f"control: without /tmp the entrypoint does not start (exit {agent.returncode}: {last[:160]})")

    return summary("check_image")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
