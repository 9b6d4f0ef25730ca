#!/usr/bin/env python3
"""The OOM guard on a real GPU (issues 3 and 5, DESIGN §5 tier 4).

Places CUDA processes in kubepods-shaped cgroup v2 directories, serves matching pods from
the API double (which plays the kubelet: an accepted eviction kills the pod's cgroup through
`cgroup.kill` after the grace period), runs gpu-warden with the NVML backend and then:

1. attribution: compares every container's VRAM in /metrics with nvidia-smi per process
   (a host process outside any pod must show with empty pod labels);
2. the guard sweep: a high-priority "training" process holds most of the GPU and allocates
   a fresh workspace every step (an OOM there is what a neighbour of a greedy job dies of);
   a small CI job holds steady; a greedy CI job grows at R GiB/s until the GPU is full.
   For each R, N runs with the guard in enforce mode and N with no agent at all.

A 10 ms pynvml sampler records free memory and every process's VRAM for the whole run; the
report gives OOMs seen by the training process, reaction time (threshold crossed in NVML →
eviction request at the API double), free memory at the eviction, evictions that were not
needed, and a PNG plot per mode.

    OUT=/tmp/out python3 scripts/guard_h200.py --agent target/release/gpu-warden \
        --double target/release/apiserver-double --rates 4,16,32,64 --runs 5
"""
import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pynvml as nv

CG_ROOT = "/sys/fs/cgroup"
KUBEPODS = os.path.join(CG_ROOT, "kubepods.slice")
GIB = 1 << 30
MIB = 1 << 20
NODE = "h200-guard"
HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Pod:
    def __init__(self, ns, name, container, priority, labels=None, annotations=None):
        self.ns, self.name, self.container, self.priority = ns, name, container, priority
        self.uid = str(uuid.uuid4())
        self.cid = uuid.uuid4().hex + uuid.uuid4().hex
        self.labels = labels or {}
        self.annotations = annotations or {}

    @property
    def cgroup(self):
        u = self.uid.replace("-", "_")
        return os.path.join(KUBEPODS, "kubepods-burstable.slice",
                            f"kubepods-burstable-pod{u}.slice", f"cri-containerd-{self.cid}.scope")

    def make_cgroup(self):
        os.makedirs(self.cgroup, exist_ok=True)

    def obj(self):
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.ns, "uid": self.uid,
                         "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "labels": self.labels, "annotations": self.annotations,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": self.name,
                                              "uid": str(uuid.uuid4()), "controller": True}]},
            "spec": {"nodeName": NODE, "priority": self.priority,
                     "containers": [{"name": self.container, "image": "x"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": self.container, "containerID": f"containerd://{self.cid}", "image": "x",
                "imageID": "", "ready": True, "restartCount": 0}]},
        }


def spawn_in_cgroup(cgroup, args, logpath):
    """Starts `args` with its first process already inside `cgroup` (children follow)."""
    procs = os.path.join(cgroup, "cgroup.procs") if cgroup else None
    out = open(logpath, "a")

    def pre():
        os.setsid()
        if procs:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
    return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pre,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def wait_ready(logpath, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if '"ready"' in open(logpath).read():
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    return False


def load(device, extra, cgroup, logpath):
    return spawn_in_cgroup(cgroup, [sys.executable, os.path.join(HERE, "gpu_load.py"),
                                    "--device", str(device)] + extra, logpath)


class Sampler(threading.Thread):
    """Free memory and per-process VRAM every ~10 ms, to a CSV."""

    def __init__(self, path, device=0):
        super().__init__(daemon=True)
        self.path, self.stop_flag = path, False
        self.h = nv.nvmlDeviceGetHandleByIndex(device)

    def run(self):
        with open(self.path, "w") as f:
            while not self.stop_flag:
                t = time.time()
                m = nv.nvmlDeviceGetMemoryInfo(self.h)
                try:
                    ps = nv.nvmlDeviceGetComputeRunningProcesses(self.h)
                except nv.NVMLError:
                    ps = []
                pairs = ";".join(f"{p.pid}:{(p.usedGpuMemory or 0) // MIB}" for p in ps)
                f.write(f"{t:.4f},{m.free // MIB},{m.used // MIB},{pairs}\n")
                time.sleep(0.01)


def read_timeline(path):
    rows = []
    for line in open(path):
        parts = line.rstrip("\n").split(",")
        if len(parts) < 4:
            continue
        procs = {}
        for kv in parts[3].split(";"):
            if ":" in kv:
                pid, mib = kv.split(":")
                procs[int(pid)] = int(mib)
        rows.append((float(parts[0]), int(parts[1]), int(parts[2]), procs))
    return rows


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def start_double(args, pods, workdir, tag):
    fixtures = os.path.join(workdir, f"fixtures-{tag}.json")
    with open(fixtures, "w") as f:
        json.dump({"nodes": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}],
                   "pods": [p.obj() for p in pods]}, f)
    kc = os.path.join(workdir, "kubeconfig")
    port = 18080
    p = subprocess.Popen([args.double, "--listen", f"127.0.0.1:{port}", "--fixtures", fixtures,
                          "--kill-cgroups-under", KUBEPODS, "--eviction-grace-scale", "1",
                          "--request-log", os.path.join(workdir, "requests.jsonl"),
                          "--kubeconfig-out", kc, "--bookmark-interval", "1s"],
                         stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "double.log"), "a"))
    p.stdout.readline()  # the URL: the server is up
    return p, kc


def start_agent(args, kc, workdir, policy):
    port = 19400
    env = dict(os.environ, KUBECONFIG=kc)
    a = subprocess.Popen([args.agent, "--backend", "nvml", "--node-name", NODE, "--listen", f"127.0.0.1:{port}",
                          "--poll-interval", "1s", "--guard-config", policy, "--annotations", "off",
                          "--log-format", "json"],
                         env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "agent.log"), "a"))
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            st = json.loads(http_get(f"http://127.0.0.1:{port}/state"))
            if st.get("guard") and st["guard"].get("held") is None:
                return a, port
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError("agent did not become ready with a synced pod view")


def stop(p, sig=signal.SIGTERM, timeout=8):
    if p is None or p.poll() is not None:
        return
    try:
        p.send_signal(sig)
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def ooms_in(logpath, t0, t1):
    n = 0
    for line in open(logpath):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "oom" and t0 <= e["t"] <= t1:
            n += 1
    return n


def evictions_in(workdir, t0, t1):
    out = []
    path = os.path.join(workdir, "requests.jsonl")
    if not os.path.exists(path):
        return out
    for line in open(path):
        r = json.loads(line)
        if r["path"].endswith("/eviction") and r["method"] == "POST" and t0 <= r["timeUnix"] <= t1:
            out.append((r["timeUnix"], r["path"].split("/")[-2], r["status"]))
    return out


def attribution_check(args, workdir, port, pods_by_pid):
    """Per-container VRAM in /metrics against nvidia-smi per process."""
    time.sleep(2.5)
    metrics = http_get(f"http://127.0.0.1:{port}/metrics")
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    expected = {}
    for line in smi.strip().splitlines():
        pid, mib = [x.strip() for x in line.split(",")]
        key = pods_by_pid.get(int(pid), ("", "", ""))
        expected[key] = expected.get(key, 0) + int(mib)
    got = {}
    for line in metrics.splitlines():
        if line.startswith("gpu_warden_container_gpu_memory_used_bytes{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.rindex("}")].split('",'))
            labels = {k: v.strip('"') for k, v in labels.items()}
            key = (labels["namespace"], labels["pod"], labels["container"])
            got[key] = float(line.rsplit(" ", 1)[1]) / MIB
    rows, ok = [], True
    for key in sorted(set(expected) | set(got)):
        e, g = expected.get(key), got.get(key)
        good = e is not None and g is not None and abs(e - g) <= 2
        ok &= good
        rows.append(f"| {key[0] or '(host)'} | {key[1] or '—'} | {key[2] or '—'} | {g if g is None else round(g)} | {e} | {'ok' if good else 'DIFFERS'} |")
    with open(os.path.join(args.out, "attribution.md"), "w") as f:
        f.write("| namespace | pod | container | gpu-warden MiB | nvidia-smi MiB (sum of its pids) | verdict |\n|---|---|---|---|---|---|\n")
        f.write("\n".join(rows) + "\n")
        inv = [l for l in metrics.splitlines() if l.startswith("gpu_warden_invisible_processes ")]
        f.write(f"\n{inv[0] if inv else 'no invisible metric'}\n\nRESULT: {'PASS' if ok else 'FAIL'}\n")
    log("attribution", "PASS" if ok else "FAIL")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--double", required=True)
    ap.add_argument("--rates", default="4,16,32,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--train-gib", type=float, default=100)
    ap.add_argument("--workspace-gib", type=float, default=2)
    ap.add_argument("--fast-interval", default="100ms")
    ap.add_argument("--modes", default="guard,none", help="guard (enforce mode), none (no agent)")
    ap.add_argument("--skip-attribution", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/guard-out"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    workdir = "/tmp/guard-work"
    os.makedirs(workdir, exist_ok=True)
    nv.nvmlInit()
    total_mib = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).total // MIB
    soft_mib, hard_mib = total_mib * 0.10, total_mib * 0.05

    policy = os.path.join(workdir, "policy.yaml")
    with open(policy, "w") as f:
        f.write(f"mode: enforce\nhard: 5%\nsoft: 10%\ngrace: 10s\nhorizon: 5s\nfastInterval: {args.fast_interval}\n"
                "evictionGracePeriodSeconds: 0\ncooldownTimeout: 30s\n"
                "rateLimit: {maxEvictions: 5, per: 60s}\n")

    train = Pod("ml", "train-0", "trainer", 1_000_000)
    small = Pod("ci", "ci-small", "build", 0, {"workload-type": "gpu-ci"})
    for p in (train, small):
        p.make_cgroup()
    sampler = Sampler(os.path.join(workdir, "timeline.csv"))
    sampler.start()
    tlog, slog, hlog = (os.path.join(workdir, n) for n in ("train.log", "small.log", "host.log"))
    procs = [load(0, ["--hold-gib", str(args.train_gib), "--compute", "--workspace-gib", str(args.workspace_gib),
                      "--seconds", "3600"], train.cgroup, tlog),
             load(0, ["--hold-gib", "4", "--seconds", "3600"], small.cgroup, slog),
             load(0, ["--hold-gib", "1", "--seconds", "3600"], None, hlog)]
    for lp in (tlog, slog, hlog):
        if not wait_ready(lp):
            raise RuntimeError(f"{lp} never got ready")
    pid_of = lambda lp: json.loads([l for l in open(lp) if '"ready"' in l][0])["pid"]
    pid_of_last = lambda lp: json.loads([l for l in open(lp) if '"ready"' in l][-1])["pid"]
    pods_by_pid = {pid_of(tlog): ("ml", "train-0", "trainer"), pid_of(slog): ("ci", "ci-small", "build")}
    results = []
    train_args = ["--hold-gib", str(args.train_gib), "--compute", "--workspace-gib", str(args.workspace_gib),
                  "--seconds", "3600"]
    try:
        # 1. attribution, with the agent and the double up and no greedy job yet.
        if not args.skip_attribution:
            d, kc = start_double(args, [train, small], workdir, "attr")
            a, port = start_agent(args, kc, workdir, policy)
            attribution_check(args, workdir, port, pods_by_pid)
            stop(a)
            stop(d)
        # 2. the sweep.
        for mode in args.modes.split(","):
            for rate in [float(r) for r in args.rates.split(",")]:
                for run in range(args.runs):
                    # A training process evicted by mistake is recorded and restarted, so one
                    # wrong eviction cannot void the runs after it.
                    restarted = False
                    if procs[0].poll() is not None:
                        log("training process is gone: restarting it")
                        procs[0] = load(0, train_args, train.cgroup, tlog)
                        wait_ready(tlog)
                        pods_by_pid[pid_of_last(tlog)] = ("ml", "train-0", "trainer")
                        restarted = True
                    greedy = Pod("ci", f"ci-greedy-{int(rate)}-{run}", "build", 0, {"workload-type": "gpu-ci"})
                    greedy.make_cgroup()
                    d = a = None
                    if mode == "guard":
                        d, kc = start_double(args, [train, small, greedy], workdir, "run")
                        a, _ = start_agent(args, kc, workdir, policy)
                    free_now = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).free / GIB
                    seconds = free_now / rate + 1.5
                    glog = os.path.join(workdir, f"greedy-{mode}-{int(rate)}-{run}.log")
                    g = load(0, ["--hold-gib", "0.25", "--grow-gib-per-s", str(rate), "--chunk-mib", "256",
                                 "--start-delay", "0", "--seconds", f"{seconds:.2f}"], greedy.cgroup, glog)
                    wait_ready(glog, 30)
                    t0 = time.time()
                    try:
                        g.wait(timeout=seconds + 5)
                    except subprocess.TimeoutExpired:
                        g.kill()
                    t1 = time.time() + 0.3
                    time.sleep(0.3)
                    stop(a)
                    stop(d)
                    results.append(dict(mode=mode, rate=rate, run=run, t0=t0, t1=t1, greedy_pid=g.pid,
                                        train_restarted_before=restarted, train_alive_after=procs[0].poll() is None,
                                        greedy=greedy.name, killed=g.returncode is not None and g.returncode < 0,
                                        train_ooms=ooms_in(tlog, t0, t1),
                                        evictions=evictions_in(workdir, t0 - 1, t1)))
                    log(mode, rate, run, "train OOMs", results[-1]["train_ooms"], "evictions", results[-1]["evictions"])
                    # Let the GPU settle (the greedy job's memory returns to the driver).
                    time.sleep(0.5)
    finally:
        sampler.stop_flag = True
        for p in procs:
            stop(p, signal.SIGKILL)
        sampler.join(timeout=2)
    timeline = read_timeline(os.path.join(workdir, "timeline.csv"))
    report(args, results, timeline, soft_mib, hard_mib, total_mib, pods_by_pid)


def report(args, results, timeline, soft_mib, hard_mib, total_mib, pods_by_pid):
    for r in results:
        win = [row for row in timeline if r["t0"] - 0.5 <= row[0] <= r["t1"]]
        soft_t = next((t for t, free, _, _ in win if free < soft_mib and t >= r["t0"]), None)
        hard_t = next((t for t, free, _, _ in win if free < hard_mib and t >= r["t0"]), None)
        r["soft_crossed"], r["hard_crossed"] = soft_t, hard_t
        r["min_free_mib"] = min((free for t, free, _, _ in win if t >= r["t0"]), default=None)
        ev = sorted(r["evictions"])
        if ev:
            te = ev[0][0]
            r["reaction_from_soft_ms"] = None if soft_t is None else round((te - soft_t) * 1000, 1)
            r["reaction_from_hard_ms"] = None if hard_t is None else round((te - hard_t) * 1000, 1)
            before = [free for t, free, _, _ in win if t <= te]
            r["free_at_eviction_mib"] = before[-1] if before else None
            r["unneeded"] = [name for _, name, _ in ev if name != r["greedy"]]
        else:
            r["unneeded"] = []
    with open(os.path.join(args.out, "guard-runs.json"), "w") as f:
        json.dump(dict(results=results, soft_mib=soft_mib, hard_mib=hard_mib, total_mib=total_mib), f, indent=1)
    lines = ["| mode | GiB/s | runs | runs with training OOMs | training OOM events | evictions (greedy / other) | "
             "reaction from soft crossing, ms (median, max) | from hard crossing, ms (median) | free at eviction, MiB (min) | min free, MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None
    for mode in ("guard", "none"):
        for rate in sorted({r["rate"] for r in results}):
            rs = [r for r in results if r["mode"] == mode and r["rate"] == rate]
            if not rs:
                continue
            react = [r["reaction_from_soft_ms"] for r in rs if r.get("reaction_from_soft_ms") is not None]
            react_h = [r["reaction_from_hard_ms"] for r in rs if r.get("reaction_from_hard_ms") is not None]
            free_ev = [r["free_at_eviction_mib"] for r in rs if r.get("free_at_eviction_mib") is not None]
            greedy_ev = sum(1 for r in rs for _, n, _ in r["evictions"] if n == r["greedy"])
            other_ev = sum(len(r["unneeded"]) for r in rs)
            lines.append(f"| {mode} | {rate:g} | {len(rs)} | {sum(1 for r in rs if r['train_ooms'] or not r['train_alive_after'])} | "
                         f"{sum(r['train_ooms'] for r in rs)} | {greedy_ev} / {other_ev} | "
                         f"{med(react)}, {max(react) if react else None} | {med(react_h)} | "
                         f"{min(free_ev) if free_ev else None} | {min((r['min_free_mib'] for r in rs if r['min_free_mib'] is not None), default=None)} |")
    with open(os.path.join(args.out, "guard-report.md"), "w") as f:
        f.write(f"GPU total {total_mib} MiB; soft threshold {soft_mib:.0f} MiB free, hard {hard_mib:.0f} MiB free; "
                f"fast interval {args.fast_interval}; eviction grace period 0 s (the API double kills the pod's cgroup at once).\n\n")
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(args, results, timeline, pods_by_pid, soft_mib, hard_mib)


def plot(args, results, timeline, pods_by_pid, soft_mib, hard_mib):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    picks = []
    for mode in ("guard", "none"):
        rs = [r for r in results if r["mode"] == mode and r["rate"] == 16] or [r for r in results if r["mode"] == mode]
        if rs:
            picks.append(rs[0])
    fig, axes = plt.subplots(len(picks), 1, figsize=(10, 4 * len(picks)), squeeze=False)
    for ax, r in zip(axes[:, 0], picks):
        win = [row for row in timeline if r["t0"] - 0.5 <= row[0] <= r["t1"]]
        ts = [row[0] - r["t0"] for row in win]
        names = dict(pods_by_pid)
        names[r["greedy_pid"]] = ("ci", r["greedy"], "build")
        for pid, (ns, pod, _) in names.items():
            ax.plot(ts, [row[3].get(pid, 0) / 1024 for row in win], label=f"{ns}/{pod}")
        ax.plot(ts, [row[1] / 1024 for row in win], "k--", label="free")
        ax.axhline(soft_mib / 1024, color="orange", lw=0.8, label="soft")
        ax.axhline(hard_mib / 1024, color="red", lw=0.8, label="hard")
        for te, name, status in r["evictions"]:
            ax.axvline(te - r["t0"], color="purple", lw=1.5, label=f"eviction of {name} ({status})")
        ax.set_title(f"{'guard (enforce)' if r['mode'] == 'guard' else 'no guard'}: greedy at {r['rate']:g} GiB/s; "
                     f"training OOM events: {r['train_ooms']}")
        ax.set_xlabel("seconds since the greedy job started growing")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=7, loc="center left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "guard-vram.png"), dpi=110)


if __name__ == "__main__":
    main()
