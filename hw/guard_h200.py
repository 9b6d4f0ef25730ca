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

    OUT=/tmp/out python3 hw/guard_h200.py --agent target/release/gpu-warden \
        --double target/release/apiserver-double --rates 4,16,32,64 --runs 5

`--sweep` names each series as MODE[@FAST][/GPUS][*RUNS]:RATES (RUNS overrides --runs), e.g.
`"guard:4,16,32,64;none:4,16,32,64;guard@20ms:64,128"`: MODE is guard or none, FAST the
guard's fast interval (default --fast-interval), GPUS the GPUs the greedy job(s) grow on
(`0`, or `0+1` for one greedy job on each at once; default the first of --gpus). With
`--gpus 0,1` every listed GPU gets its own training process and small CI pod, so a run shows
whether pressure on one GPU evicts pods of another (it must not).
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
START = time.time()


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
                            env=dict(os.environ, PYTHONUNBUFFERED="1", CUDA_DEVICE_ORDER="PCI_BUS_ID"))


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
    """Free memory and per-process VRAM of each GPU every ~10 ms, to a CSV."""

    def __init__(self, path, devices=(0,)):
        super().__init__(daemon=True)
        self.path, self.stop_flag = path, False
        self.hs = [(d, nv.nvmlDeviceGetHandleByIndex(d)) for d in devices]

    def run(self):
        with open(self.path, "w") as f:
            while not self.stop_flag:
                for d, h in self.hs:
                    t = time.time()
                    m = nv.nvmlDeviceGetMemoryInfo(h)
                    try:
                        ps = nv.nvmlDeviceGetComputeRunningProcesses(h)
                    except nv.NVMLError:
                        ps = []
                    pairs = ";".join(f"{p.pid}:{(p.usedGpuMemory or 0) // MIB}" for p in ps)
                    f.write(f"{t:.4f},{d},{m.free // MIB},{m.used // MIB},{pairs}\n")
                time.sleep(0.01)


def read_timeline(path):
    """Rows (t, gpu, free MiB, used MiB, {pid: MiB})."""
    rows = []
    for line in open(path):
        parts = line.rstrip("\n").split(",")
        if len(parts) < 5:
            continue
        procs = {}
        for kv in parts[4].split(";"):
            if ":" in kv:
                pid, mib = kv.split(":")
                procs[int(pid)] = int(mib)
        rows.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), procs))
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


def start_agent(args, kc, workdir, policy, binary=None):
    port = 19400
    env = dict(os.environ, KUBECONFIG=kc)
    a = subprocess.Popen([binary or args.agent, "--backend", "nvml", "--node-name", NODE, "--listen", f"127.0.0.1:{port}",
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


def cpu_ticks(pid):
    """utime + stime of the whole process (every thread), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def idle_cpu(args, pods, workdir, policy, condition):
    """CPU of each --idle-agents binary with the guard armed (enforce, synced pod view), no
    pressure: `condition` names what the GPU is doing. Returns rows for the report."""
    rows = []
    for binary in filter(None, args.idle_agents.split(",")):
        d, kc = start_double(args, pods, workdir, "idle")
        a, _ = start_agent(args, kc, workdir, policy, binary)
        time.sleep(2)
        hz = os.sysconf("SC_CLK_TCK")
        c0, t0 = cpu_ticks(a.pid), time.time()
        time.sleep(args.idle_seconds)
        c1, t1 = cpu_ticks(a.pid), time.time()
        stop(a)
        stop(d)
        pct = (c1 - c0) / hz / (t1 - t0) * 100
        rows.append(dict(binary=binary, condition=condition, seconds=round(t1 - t0, 1), cpu_pct=round(pct, 3)))
        log("idle cpu", binary, condition, f"{pct:.3f} %")
    return rows


def decisions_in(workdir, t0, t1):
    """(unix time, trigger, free MiB from the summary) of every decision the agent logged."""
    import datetime
    out = []
    path = os.path.join(workdir, "agent.log")
    if not os.path.exists(path):
        return out
    for line in open(path):
        try:
            e = json.loads(line)
            f = e.get("fields", {})
            if "decision" not in f or "trigger" not in f:
                continue
            stamp = e["timestamp"].rstrip("Z")
            head, _, frac = stamp.partition(".")
            # Python 3.11's fromisoformat takes at most 6 fractional digits.
            ts = datetime.datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()
        except (ValueError, KeyError):
            continue
        if t0 <= ts <= t1:
            out.append((ts, f["trigger"]))
    return out


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
        # Only accepted evictions (2xx) count; a refused one (429, 5xx) removed nothing.
        if (r["path"].endswith("/eviction") and r["method"] == "POST" and t0 <= r["timeUnix"] <= t1
                and 200 <= r["status"] < 300):
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


def parse_sweep(args):
    """[(label, mode, fast interval, greedy GPUs, [rates])] from --sweep or --modes/--rates."""
    spec = args.sweep or ";".join(f"{m}:{args.rates}" for m in args.modes.split(","))
    gpus = [int(g) for g in args.gpus.split(",")]
    out = []
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        label, rates = item.split(":")
        label, _, runs = label.partition("*")
        head, _, on = label.partition("/")
        mode, _, fast = head.partition("@")
        if mode not in ("guard", "none"):
            raise SystemExit(f"--sweep: unknown mode {mode!r} in {item!r}")
        greedy_gpus = [int(g) for g in on.split("+")] if on else gpus[:1]
        if not set(greedy_gpus) <= set(gpus):
            raise SystemExit(f"--sweep: {item!r} grows on a GPU not in --gpus")
        out.append((label, mode, fast or args.fast_interval, greedy_gpus, [float(r) for r in rates.split(",")],
                    int(runs) if runs else args.runs))
    return out


def chunk_for(args, rate):
    """MiB per allocation of the greedy job: --chunk-mib, or with "auto" 256 MiB up to
    32 GiB/s and multi-GiB steps beyond (what a real job allocating large tensors does, and
    what lets the load reach 250 GiB/s at all: each allocation costs about a millisecond)."""
    if args.chunk_mib != "auto":
        return int(args.chunk_mib)
    mib = 256
    while mib < 2048 and mib < rate * 8:
        mib *= 2
    return mib


def write_policy(args, workdir, fast):
    path = os.path.join(workdir, f"policy-{fast}.yaml")
    with open(path, "w") as f:
        f.write(f"mode: enforce\nhard: {args.hard:g}%\nsoft: {args.soft:g}%\ngrace: 10s\nhorizon: 5s\n"
                + ("" if fast == "default" else f"fastInterval: {fast}\n")
                + "evictionGracePeriodSeconds: 0\ncooldownTimeout: 30s\n"
                "rateLimit: {maxEvictions: 5, per: 60s}\n")
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--double", required=True)
    ap.add_argument("--rates", default="4,16,32,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--train-gib", type=float, default=100)
    ap.add_argument("--workspace-gib", type=float, default=2)
    ap.add_argument("--chunk-mib", default="auto", help="the greedy job's allocation size, or auto (by rate)")
    ap.add_argument("--idle-agents", default="",
                    help="comma-separated agent binaries whose CPU is measured with the guard armed, "
                         "first on the idle GPU, then with the training and small CI loads running")
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--fast-interval", default="default",
                    help="the policy's fastInterval, or default (the agent's own, adaptive watch)")
    ap.add_argument("--hard", type=float, default=5, help="hard threshold, % of the GPU free")
    ap.add_argument("--soft", type=float, default=10, help="soft threshold, % of the GPU free")
    ap.add_argument("--modes", default="guard,none", help="guard (enforce mode), none (no agent)")
    ap.add_argument("--sweep", help="series MODE[@FAST][/GPUS]:RATES;… (overrides --modes/--rates)")
    ap.add_argument("--gpus", default="0", help="GPUs that each get a training process and a small CI pod")
    ap.add_argument("--skip-attribution", action="store_true")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds for the whole run: runs that would start after it are skipped, "
                         "so the report is still written")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/guard-out"))
    args = ap.parse_args()
    sweep = parse_sweep(args)
    gpus = [int(g) for g in args.gpus.split(",")]
    os.makedirs(args.out, exist_ok=True)
    workdir = "/tmp/guard-work"
    os.makedirs(workdir, exist_ok=True)
    nv.nvmlInit()
    total_mib = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(gpus[0])).total // MIB
    soft_mib, hard_mib = total_mib * args.soft / 100, total_mib * args.hard / 100
    policies = {fast: write_policy(args, workdir, fast) for _, _, fast, _, _, _ in sweep}
    policies.setdefault(args.fast_interval, write_policy(args, workdir, args.fast_interval))

    def suffix(g):
        return "" if g == gpus[0] else f"-{g}"
    train = {g: Pod("ml", f"train{suffix(g) or '-0'}", "trainer", 1_000_000) for g in gpus}
    small = {g: Pod("ci", f"ci-small{suffix(g)}", "build", 0, {"workload-type": "gpu-ci"}) for g in gpus}
    for g in gpus:
        train[g].make_cgroup()
        small[g].make_cgroup()
    base_pods = list(train.values()) + list(small.values())
    idle_rows = idle_cpu(args, base_pods, workdir, policies[args.fast_interval], "idle GPU")
    sampler = Sampler(os.path.join(workdir, "timeline.csv"), gpus)
    sampler.start()
    train_args = ["--hold-gib", str(args.train_gib), "--compute", "--workspace-gib", str(args.workspace_gib),
                  "--seconds", "3600"]
    tlog = {g: os.path.join(workdir, f"train-{g}.log") for g in gpus}
    procs = {}
    for g in gpus:
        procs[("train", g)] = load(g, train_args, train[g].cgroup, tlog[g])
        procs[("small", g)] = load(g, ["--hold-gib", "4", "--seconds", "3600"], small[g].cgroup,
                                   os.path.join(workdir, f"small-{g}.log"))
    hlog = os.path.join(workdir, "host.log")
    procs[("host", gpus[0])] = load(gpus[0], ["--hold-gib", "1", "--seconds", "3600"], None, hlog)
    logs = list(tlog.values()) + [os.path.join(workdir, f"small-{g}.log") for g in gpus] + [hlog]
    for lp in logs:
        if not wait_ready(lp):
            raise RuntimeError(f"{lp} never got ready")
    pid_of = lambda lp: json.loads([l for l in open(lp) if '"ready"' in l][-1])["pid"]
    pods_by_pid = {}
    for g in gpus:
        pods_by_pid[pid_of(tlog[g])] = ("ml", train[g].name, "trainer")
        pods_by_pid[pid_of(os.path.join(workdir, f"small-{g}.log"))] = ("ci", small[g].name, "build")
    results = []
    try:
        idle_rows += idle_cpu(args, base_pods, workdir, policies[args.fast_interval],
                              "training (100 GiB + workspace every step) and small CI (4 GiB) running, calm")
        # 1. attribution, with the agent and the double up and no greedy job yet.
        if not args.skip_attribution:
            d, kc = start_double(args, base_pods, workdir, "attr")
            a, port = start_agent(args, kc, workdir, policies[args.fast_interval])
            attribution_check(args, workdir, port, pods_by_pid)
            stop(a)
            stop(d)
        # 2. the sweep.
        for label, mode, fast, greedy_gpus, rates, runs in sweep:
            for rate in rates:
                for run in range(runs):
                    if time.time() - START > args.budget:
                        log(f"budget spent: skipping {label} at {rate:g} GiB/s, run {run}")
                        continue
                    # A training process evicted by mistake is recorded and restarted, so one
                    # wrong eviction cannot void the runs after it.
                    restarted = []
                    for g in gpus:
                        if procs[("train", g)].poll() is not None:
                            log(f"training process on GPU {g} is gone: restarting it")
                            # The log is appended to: wait for a "ready" line beyond the old ones.
                            seen = open(tlog[g]).read().count('"ready"')
                            procs[("train", g)] = load(g, train_args, train[g].cgroup, tlog[g])
                            deadline = time.time() + 90
                            while open(tlog[g]).read().count('"ready"') <= seen and time.time() < deadline:
                                time.sleep(0.1)
                            pods_by_pid[pid_of(tlog[g])] = ("ml", train[g].name, "trainer")
                            restarted.append(g)
                    tag = label.replace("/", "-on-").replace("@", "-at-").replace("+", "")
                    greedy = {g: Pod("ci", f"ci-greedy-{int(rate)}-{run}{suffix(g)}", "build", 0,
                                     {"workload-type": "gpu-ci"}) for g in greedy_gpus}
                    for p in greedy.values():
                        p.make_cgroup()
                    d = a = None
                    if mode == "guard":
                        d, kc = start_double(args, base_pods + list(greedy.values()), workdir, "run")
                        a, _ = start_agent(args, kc, workdir, policies[fast])
                    seconds = max(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(g)).free / GIB
                                  for g in greedy_gpus) / rate + 1.5
                    gprocs, glogs = {}, {}
                    # Every window (OOMs, evictions, the timeline) opens before the greedy jobs
                    # start: with several of them, the first grows while the next still starts.
                    t0 = time.time()
                    for g in greedy_gpus:
                        glogs[g] = os.path.join(workdir, f"greedy-{tag}-{int(rate)}-{run}-{g}.log")
                        gprocs[g] = load(g, ["--hold-gib", "0.25", "--grow-gib-per-s", str(rate),
                                             "--chunk-mib", str(chunk_for(args, rate)),
                                             "--start-delay", "0", "--seconds", f"{seconds:.2f}"], greedy[g].cgroup,
                                         glogs[g])
                    for g in greedy_gpus:
                        wait_ready(glogs[g], 30)
                    ready_at = time.time()
                    for gp in gprocs.values():
                        try:
                            gp.wait(timeout=max(0.1, ready_at + seconds + 5 - time.time()))
                        except subprocess.TimeoutExpired:
                            gp.kill()
                    t1 = time.time() + 0.3
                    time.sleep(0.3)
                    stop(a)
                    stop(d)
                    results.append(dict(
                        label=label, mode=mode, fast=fast, rate=rate, run=run, t0=t0, t1=t1,
                        greedy={g: dict(name=greedy[g].name, pid=gprocs[g].pid,
                                        killed=gprocs[g].returncode is not None and gprocs[g].returncode < 0)
                                for g in greedy_gpus},
                        train_restarted_before=restarted,
                        train_alive_after={g: procs[("train", g)].poll() is None for g in gpus},
                        train_ooms={g: ooms_in(tlog[g], t0, t1) for g in gpus},
                        evictions=evictions_in(workdir, t0 - 1, t1),
                        decisions=decisions_in(workdir, t0 - 1, t1)))
                    log(label, rate, run, "train OOMs", results[-1]["train_ooms"], "evictions",
                        results[-1]["evictions"])
                    # Let the GPU settle (the greedy job's memory returns to the driver).
                    time.sleep(0.5)
    finally:
        sampler.stop_flag = True
        for p in procs.values():
            stop(p, signal.SIGKILL)
        sampler.join(timeout=2)
    timeline = read_timeline(os.path.join(workdir, "timeline.csv"))
    report(args, sweep, results, timeline, soft_mib, hard_mib, total_mib, pods_by_pid, idle_rows)


def growth_rate(rows, pid):
    """GiB/s the greedy process actually grew at: from 1 GiB to 90 % of its peak."""
    pts = [(t, procs[pid]) for t, _, _, _, procs in rows if pid in procs]
    if not pts:
        return None
    peak = max(m for _, m in pts)
    a = next(((t, m) for t, m in pts if m >= 1024), None)
    b = next(((t, m) for t, m in pts if m >= 0.9 * peak), None)
    if a is None or b is None or b[0] - a[0] < 0.02:
        return None
    return (b[1] - a[1]) / 1024 / (b[0] - a[0])


def report(args, sweep, results, timeline, soft_mib, hard_mib, total_mib, pods_by_pid, idle_rows=()):
    for r in results:
        ev = sorted(r["evictions"])
        greedy_names = {v["name"] for v in r["greedy"].values()}
        r["unneeded"] = [name for _, name, _ in ev if name not in greedy_names]
        r["per_gpu"] = {}
        for g, gr in r["greedy"].items():
            win = [row for row in timeline if row[1] == g and r["t0"] - 0.5 <= row[0] <= r["t1"]]
            soft_t = next((t for t, _, free, _, _ in win if free < soft_mib and t >= r["t0"]), None)
            hard_t = next((t for t, _, free, _, _ in win if free < hard_mib and t >= r["t0"]), None)
            x = dict(soft_crossed=soft_t, hard_crossed=hard_t, rate_measured=growth_rate(win, gr["pid"]),
                     min_free_mib=min((free for t, _, free, _, _ in win if t >= r["t0"]), default=None))
            mine = [e for e in ev if e[1] == gr["name"]]
            if mine:
                te = mine[0][0]
                x["reaction_from_soft_ms"] = None if soft_t is None else round((te - soft_t) * 1000, 1)
                x["reaction_from_hard_ms"] = None if hard_t is None else round((te - hard_t) * 1000, 1)
                before = [free for t, _, free, _, _ in win if t <= te]
                x["free_at_eviction_mib"] = before[-1] if before else None
                # The budget: decision → eviction request → the greedy process gone from the
                # GPU's process list (the kubelet's kill and the CUDA teardown).
                ds = [d for d in r.get("decisions", []) if d[0] <= te + 0.001]
                if ds:
                    x["trigger"] = ds[-1][1]
                    x["decision_to_eviction_ms"] = round((te - ds[-1][0]) * 1000, 1)
                gone = next((t for t, _, _, _, procs in win if t > te and gr["pid"] not in procs), None)
                x["eviction_to_freed_ms"] = None if gone is None else round((gone - te) * 1000, 1)
            r["per_gpu"][g] = x
    with open(os.path.join(args.out, "guard-runs.json"), "w") as f:
        json.dump(dict(results=results, soft_mib=soft_mib, hard_mib=hard_mib, total_mib=total_mib,
                       sweep=sweep), f, indent=1, default=str)
    lines = ["| series | GiB/s asked (measured, median) | runs | runs with training OOMs | training OOM events | "
             "evictions (greedy / other) | reaction from soft crossing, ms (median, max) | from hard crossing, ms "
             "(median) | free at eviction, MiB (min) | min free, MiB | triggers | decision → eviction, ms (median) | "
             "eviction → memory freed, ms (median, max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None
    for label, *_ in sweep:
        for rate in sorted({r["rate"] for r in results if r["label"] == label}):
            rs = [r for r in results if r["label"] == label and r["rate"] == rate]
            pg = [x for r in rs for x in r["per_gpu"].values()]
            react = [x["reaction_from_soft_ms"] for x in pg if x.get("reaction_from_soft_ms") is not None]
            react_h = [x["reaction_from_hard_ms"] for x in pg if x.get("reaction_from_hard_ms") is not None]
            free_ev = [x["free_at_eviction_mib"] for x in pg if x.get("free_at_eviction_mib") is not None]
            measured = [x["rate_measured"] for x in pg if x.get("rate_measured")]
            freed = [x["eviction_to_freed_ms"] for x in pg if x.get("eviction_to_freed_ms") is not None]
            greedy_ev = sum(1 for r in rs for _, n, _ in r["evictions"] if n not in r["unneeded"])
            other_ev = sum(len(r["unneeded"]) for r in rs)
            bad = sum(1 for r in rs if any(r["train_ooms"].values()) or not all(r["train_alive_after"].values()))
            m = med(measured)
            lines.append(f"| {label} | {rate:g} ({'—' if m is None else f'{m:.1f}'}) | {len(rs)} | {bad} | "
                         f"{sum(sum(r['train_ooms'].values()) for r in rs)} | {greedy_ev} / {other_ev} | "
                         f"{med(react)}, {max(react) if react else None} | {med(react_h)} | "
                         f"{min(free_ev) if free_ev else None} | "
                         f"{min((x['min_free_mib'] for x in pg if x['min_free_mib'] is not None), default=None)} | "
                         f"{', '.join(sorted({x['trigger'] for x in pg if x.get('trigger')})) or '—'} | "
                         f"{med([x['decision_to_eviction_ms'] for x in pg if x.get('decision_to_eviction_ms') is not None])} | "
                         f"{med(freed)}, {max(freed) if freed else None} |")
    with open(os.path.join(args.out, "guard-report.md"), "w") as f:
        f.write(f"GPUs {args.gpus}, {total_mib} MiB each; soft threshold {soft_mib:.0f} MiB free ({args.soft:g} %), "
                f"hard {hard_mib:.0f} MiB free ({args.hard:g} %); default fast interval {args.fast_interval} "
                "(a series named MODE@X used X); eviction grace period 0 s (the API double kills the pod's cgroup "
                "at once). Every GPU in --gpus runs its own training process and small CI pod; series "
                "MODE/0+1 grow a greedy job on each of those GPUs at once.\n\n")
        f.write("\n".join(lines) + "\n")
        if idle_rows:
            f.write("\nCPU with the guard armed and no pressure (every thread, /proc/PID/stat):\n\n"
                    "| agent | GPU | seconds | CPU, % of one core |\n|---|---|---|---|\n")
            for r in idle_rows:
                f.write(f"| {r['binary']} | {r['condition']} | {r['seconds']} | {r['cpu_pct']} |\n")
    print("\n".join(lines))
    print(json.dumps(list(idle_rows)))
    plot(args, results, timeline, pods_by_pid, soft_mib, hard_mib)


def plot(args, results, timeline, pods_by_pid, soft_mib, hard_mib):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = []
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        r = next((x for x in rs if x["rate"] == 16), rs[0])
        panels += [(r, g) for g in r["greedy"]]
    panels = panels[:4]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4 * len(panels)), squeeze=False)
    for ax, (r, g) in zip(axes[:, 0], panels):
        win = [row for row in timeline if row[1] == g and r["t0"] - 0.5 <= row[0] <= r["t1"]]
        ts = [row[0] - r["t0"] for row in win]
        names = dict(pods_by_pid)
        for gg, gr in r["greedy"].items():
            names[gr["pid"]] = ("ci", gr["name"], "build")
        for pid, (ns, pod, _) in names.items():
            ys = [row[4].get(pid, 0) / 1024 for row in win]
            if any(ys):
                ax.plot(ts, ys, label=f"{ns}/{pod}")
        ax.plot(ts, [row[2] / 1024 for row in win], "k--", label="free")
        ax.axhline(soft_mib / 1024, color="orange", lw=0.8, label="soft")
        ax.axhline(hard_mib / 1024, color="red", lw=0.8, label="hard")
        here = {r["greedy"][g]["name"]} | set(r["unneeded"])
        for te, name, status in (e for e in r["evictions"] if e[1] in here):
            ax.axvline(te - r["t0"], color="purple", lw=1.5, label=f"eviction of {name} ({status})")
        ax.set_title(f"GPU {g}, {r['label']} ({'guard, enforce, fast ' + r['fast'] if r['mode'] == 'guard' else 'no guard'}): "
                     f"greedy at {r['rate']:g} GiB/s; training OOM events: {r['train_ooms'].get(g, 0)}")
        ax.set_xlabel("seconds since the greedy job was launched")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=7, loc="center left")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "guard-vram.png"), dpi=110)


if __name__ == "__main__":
    main()
