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

`--sweep` names each series as MODE[@FAST][/GPUS][*RUNS][%KEY=VALUE...]:RATES (RUNS overrides
--runs), e.g. `"guard:4,16,32,64;none:4,16,32,64;guard@20ms%h=a10g:64,128"`: MODE is guard or
none, FAST the guard's fast interval (default --fast-interval), GPUS the GPUs the greedy job(s)
grow on (`0`, or `0+1` for one greedy job on each at once; default the first of --gpus). Keys:
`h` the headroom (`today`: the ~32 GiB free of a 100 GiB trainer beside a 4 GiB CI pod, the
default; `a10g`: an A10G emulated — the rest of the H200 held by a host process so 24 GiB are
left, shared by four jobs: a 6 GiB trainer with a 1 GiB workspace, two 3 GiB CI pods and the
greedy one, thresholds 5 %/10 % of 24 GiB), `k` the double's kubelet (`faithful`, default, or
`instant`: the comparison that kills at once), `p` PID-1 mode (`shell`, default, or `exits`),
`a` the policy's `onDecision` (`evict`, `stop`, `kill`; unset: the agent's default, `stop`;
the report's onDecision column shows what the agent's /state said it does), `s` the
neighbours' shape (issue 38; `trainer`, the default; `ws`: a trainer whose workspace, larger
than the soft band, comes and goes every 0.3 s; `runner`: the seed's four jobs of one runner at
one priority, one declaring vram-request-mib with a workspace inside it, two steady (24 GiB
each on the H200), one greedy; `two`: two greedy jobs starting 1 s apart — see SHAPES), `r` a
delay for the double's pod reads (`--slow-pod-reads`, e.g. `r=3s`), `b=1` the series' agent is
`--agent-b` instead of `--agent` (an A/B of two builds in one call, at the same base loads: the
headrooms and shapes are set up once for both; the result's `agent` names the binary). With
`--gpus 0,1` every listed GPU gets its own training process and small CI pod, so a run shows
whether pressure on one GPU evicts pods of another (it must not).

Under --out: guard-report.md (a row per series and rate, then a row per run: its first
evicted pod, a wrong first victim flagged), guard-runs.json (rewritten after every run),
run-logs.jsonl.gz (per run: the agent's decision/stop/eviction log lines, the guard's /state,
the greedy job's log), timeline.csv.gz (the 10 ms samples) and guard-vram.png. `--budget`
bounds the whole harness, report included; SIGTERM ends it early with a report of the
finished runs. `--report-only RUNS.json [--timeline timeline.csv.gz]` renders a report
again without a GPU (also `python3 hw/guard_report.py RUNS.json --out DIR`); the offline
tests are `python3 hw/test_guard_report.py` (CI runs them: scripts/test.sh).
"""
import argparse
import csv
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid

from guard_report import (RUN_LOGS, TIMELINE, append_run_log, decision_lines, on_decision_of, parse_counters,
                          read_timeline, report, report_only, write_runs)

nv = None  # pynvml, imported in main(): --report-only and the tests run without it

# GUARD_CG_ROOT, GUARD_WORKDIR: elsewhere for the offline end-to-end test (fake cgroups).
CG_ROOT = os.environ.get("GUARD_CG_ROOT", "/sys/fs/cgroup")
WORKDIR = os.environ.get("GUARD_WORKDIR", "/tmp/guard-work")
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


def have_pid_namespaces():
    """Whether `unshare --pid --fork` works here (root, a kernel with PID namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "true"], timeout=10,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


PIDNS = None  # set in main()


def as_job(argv, pid1):
    """`argv` as a CI job's script run by a PID-1 shell. `shell`: no SIGTERM handler (GitLab's
    build shell): the kernel drops a signal sent to a namespace's init that has no handler
    (pid_namespaces(7)). `exits`: a handler that exits; the kernel then SIGKILLs the rest of
    the namespace. Without PID namespaces the shell is an ordinary process: `shell` then
    ignores SIGTERM by `trap '' TERM` and `exits` kills its process group (an emulation,
    reported as such)."""
    q = " ".join(shlex.quote(a) for a in argv)
    if pid1 == "shell":
        script = f"{q}; echo job-exit=$? >&2"
        if not PIDNS:
            script = "trap '' TERM; " + script
    else:
        script = f"trap 'exit 143' TERM; {q} & wait $!" if PIDNS else \
            f"trap 'kill -KILL 0' TERM; {q} & wait $!"
    # --mount-proc: the job sees its own namespace's /proc, as in a container.
    head = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"] if PIDNS else []
    return head + ["sh", "-c", script]


def job_selftest(workdir, pid1="shell"):
    """Starts a CUDA job as the greedy ones are started (in a container cgroup, under the PID-1
    shell) and says whether it got ready; prints its log when it did not."""
    cg = os.path.join(KUBEPODS, "kubepods-burstable.slice", "kubepods-burstable-podselftest.slice",
                      "cri-containerd-selftest.scope")
    os.makedirs(cg, exist_ok=True)
    lp = os.path.join(workdir, f"selftest-{PIDNS}-{pid1}.log")
    code = "import json, torch; torch.zeros(1, device='cuda'); print(json.dumps({'event': 'ready'}), flush=True)"
    p = spawn_in_cgroup(cg, as_job([sys.executable, "-c", code], pid1), lp)
    ok = wait_ready(lp, 25)
    kill_group(p)
    if not ok:
        log(f"job self-test failed (PID namespaces {PIDNS}, exit {p.returncode}):", open(lp).read()[-3000:])
    return ok


def cgroup_tree_pids(cgroup):
    """Every pid in `cgroup` and the cgroups below it (a runtime may put the job's processes
    in a child cgroup)."""
    pids = []
    for dirpath, _, _ in os.walk(cgroup):
        try:
            pids += [int(x) for x in open(os.path.join(dirpath, "cgroup.procs")).read().split()]
        except (OSError, ValueError):
            pass
    return pids


def descendants(pid, proc="/proc"):
    """Every descendant of `pid`: /proc/PID/task/*/children where the kernel has it
    (CONFIG_PROC_CHILDREN), else the parent pid of every process in /proc."""
    kids = {}
    have_children_files = os.path.exists(f"{proc}/{pid}/task/{pid}/children")
    if not have_children_files:
        for name in os.listdir(proc):
            if name.isdigit():
                try:
                    # The parent pid is the 2nd field after the command, which may hold spaces
                    # and parentheses: split after the last ")".
                    ppid = int(open(f"{proc}/{name}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if have_children_files:
            found = []
            try:
                for task in os.listdir(f"{proc}/{p}/task"):
                    try:
                        found += [int(x) for x in open(f"{proc}/{p}/task/{task}/children").read().split()]
                    except (OSError, ValueError):
                        pass
            except OSError:
                pass
        else:
            found = kids.get(p, [])
        for c in found:
            if c not in out and c != pid:
                out.append(c)
                todo.append(c)
    return out


def argv_of(pid, proc="/proc"):
    try:
        raw = open(f"{proc}/{pid}/cmdline", "rb").read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1 if raw.endswith(b"\0") else None]]


def runs_script(argv, script):
    """Whether `argv` is a Python interpreter running `script` (its first non-option
    argument). Not a substring match: the `unshare` wrapper's and the job shell's argv hold
    the whole `sh -c` script text, gpu_load.py's path included (bug: the harness took the
    wrapper's pid for the job's)."""
    if len(argv) < 2 or "python" not in os.path.basename(argv[0]):
        return False
    first = next((a for a in argv[1:] if not a.startswith("-")), None)
    return first is not None and os.path.basename(first) == script


def ns_pid(pid, proc="/proc"):
    """`pid` in its innermost PID namespace (the last NSpid field), or None."""
    try:
        for line in open(f"{proc}/{pid}/status"):
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def find_job_pid(cgroup, wrapper_pid, script="gpu_load.py", logged_pid=None, proc="/proc", timeout=10):
    """The pid (in our PID namespace, the one NVML lists to us) of the Python process running
    `script` for a job started as `wrapper_pid` (the unshare wrapper or the job shell) in
    container cgroup `cgroup`: among the cgroup subtree's processes and the wrapper's
    descendants, the interpreter running the script, and where the script logged its own
    pid (`logged_pid`, its pid inside the job's PID namespace), the one whose innermost
    NSpid is that. Waits up to `timeout` s for exactly one. Returns (pid or None, how)."""
    deadline = time.time() + timeout
    how = "not found"
    while True:
        cands = sorted(set(cgroup_tree_pids(cgroup) if cgroup else []) | set(descendants(wrapper_pid, proc)))
        matches = [p for p in cands if p != wrapper_pid and runs_script(argv_of(p, proc), script)]
        if logged_pid is not None and matches:
            same = [p for p in matches if ns_pid(p, proc) == logged_pid]
            matches = same or matches
            how = "script argv + NSpid" if same else "script argv (NSpid differs from the logged pid)"
        else:
            how = "script argv"
        if len(matches) == 1:
            return matches[0], how
        if len(matches) > 1:
            how = f"ambiguous: {matches}"
        else:
            how = f"no process runs {script} among {cands}"
        if time.time() >= deadline:
            return None, how
        time.sleep(0.05)


def events(logpath):
    """gpu_load.py's JSON event lines in `logpath`, in order; its other lines (a traceback,
    the job shell's `job-exit=`) are skipped."""
    with open(logpath) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):
                yield e


def ready_pid(logpath):
    """The pid gpu_load.py logged in its last "ready" line (its own os.getpid())."""
    try:
        ready = [e for e in events(logpath) if e.get("event") == "ready"]
        return ready[-1]["pid"] if ready else None
    except (OSError, KeyError):
        return None


def compute_pids(h):
    """The pids NVML lists as compute processes on handle `h`; none where it cannot say."""
    try:
        return [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
    except nv.NVMLError:
        return []


def nvml_lists(gpu, pid, timeout=3):
    """Whether NVML lists `pid` as a compute process of `gpu` within `timeout` s."""
    h = nv.nvmlDeviceGetHandleByIndex(gpu)
    deadline = time.time() + timeout
    while True:
        if pid in compute_pids(h):
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.05)


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


def settled_free(device, timeout=10.0):
    """GPU `device`'s free MiB once no compute process is on it (at most `timeout` s), and the
    pids still there at the bound. Why: a headroom's holder is sized from this, and on the
    H100 a process of 612 MiB that ended 60 ms after the harness's sampler began was counted, so the
    first shape's emulated A10G had 621 MiB more free than the next ones' (7,682 MiB before
    the climb in `two` instead of 7,060, docs/validation.md §9q)."""
    h = nv.nvmlDeviceGetHandleByIndex(device)
    deadline = time.time() + timeout
    while True:
        pids = compute_pids(h)
        if not pids or time.time() >= deadline:
            return nv.nvmlDeviceGetMemoryInfo(h).free // MIB, pids
        time.sleep(0.05)


def load(device, extra, cgroup, logpath, pid1=None):
    argv = [sys.executable, os.path.join(HERE, "gpu_load.py"), "--device", str(device)] + extra
    return spawn_in_cgroup(cgroup, as_job(argv, pid1) if pid1 else argv, logpath)


def hold(mib, logpath):
    """A host process (no pod) holding `mib` MiB of GPU 0: the rest of an emulated small GPU."""
    return spawn_in_cgroup(None, [sys.executable, os.path.join(HERE, "cuda_hold.py"), "--mib", str(mib),
                                  "--seconds", "3600"], logpath)


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


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def start_double(args, pods, workdir, tag, kubelet="faithful", slow_reads=""):
    fixtures = os.path.join(workdir, f"fixtures-{tag}.json")
    with open(fixtures, "w") as f:
        json.dump({"nodes": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}],
                   "pods": [p.obj() for p in pods]}, f)
    kc = os.path.join(workdir, "kubeconfig")
    port = 18080
    p = subprocess.Popen([args.double, "--listen", f"127.0.0.1:{port}", "--fixtures", fixtures,
                          "--kill-cgroups-under", KUBEPODS, "--kubelet", kubelet,
                          "--kubelet-watch-latency", args.watch_latency, "--eviction-grace-scale", "0",
                          "--kubelet-log", os.path.join(workdir, "kubelet.jsonl"),
                          "--request-log", os.path.join(workdir, "requests.jsonl"),
                          "--kubeconfig-out", kc, "--bookmark-interval", "1s"]
                         + (["--slow-pod-reads", slow_reads] if slow_reads else []),
                         stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "double.log"), "a"))
    try:
        p.stdout.readline()  # the URL: the server is up
    except BaseException:
        # SIGTERM (Interrupted) while it starts: the caller never got it to stop.
        stop(p)
        raise
    return p, kc


def start_agent(args, kc, workdir, policy, binary=None):
    port = 19400
    env = dict(os.environ, KUBECONFIG=kc)
    a = subprocess.Popen([binary or args.agent, "--backend", "nvml", "--node-name", NODE, "--listen", f"127.0.0.1:{port}",
                          "--poll-interval", "1s", "--guard-config", policy, "--annotations", "off",
                          "--log-format", "json"],
                         # Both streams to agent.log (the agent logs to stderr; a line on stdout,
                         # should there be one, is kept too): each run's part of it goes to $OUT.
                         env=env, stdout=open(os.path.join(workdir, "agent.log"), "a"), stderr=subprocess.STDOUT)
    # Not ready in time, or SIGTERM (Interrupted) while it starts: the caller never got the
    # agent to stop, so it is stopped here (it outlived the harness).
    try:
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
    except BaseException:
        stop(a)
        raise


def cpu_ticks(pid):
    """utime + stime of the whole process (every thread), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def idle_cpu(args, pods, workdir, policy, condition):
    """CPU of each --idle-agents binary with the guard armed (enforce, synced pod view), no
    pressure: `condition` names what the GPU is doing. Returns rows for the report."""
    rows = []
    for entry in filter(None, args.idle_agents.split(",")):
        binary, rate = idle_entry(entry)
        d, kc = start_double(args, pods, workdir, "idle")
        a = None
        try:  # stopped on SIGTERM too: neither is in main()'s procs
            a, _ = start_agent(args, kc, workdir, with_watch_rate(policy, rate), binary)
            time.sleep(2)
            hz = os.sysconf("SC_CLK_TCK")
            c0, t0 = cpu_ticks(a.pid), time.time()
            time.sleep(args.idle_seconds)
            c1, t1 = cpu_ticks(a.pid), time.time()
        finally:
            stop(a)
            stop(d)
        pct = (c1 - c0) / hz / (t1 - t0) * 100
        rows.append(dict(binary=binary, watch_rate=rate or "default", condition=condition,
                         seconds=round(t1 - t0, 1), cpu_pct=round(pct, 3)))
        log("idle cpu", binary, rate or "default", condition, f"{pct:.3f} %")
    return rows


def idle_entry(entry):
    """An --idle-agents entry, BINARY or BINARY@WATCHRATE: the binary and the policy's
    watchRate for it (None: the policy's own)."""
    binary, at, rate = entry.partition("@")
    if not binary or (at and not re.fullmatch(r"[0-9]+(\.[0-9]+)?(Gi|Mi|%)", rate)):
        raise SystemExit(f"--idle-agents: '{entry}' is not BINARY or BINARY@RATE (e.g. 48Gi, 200%)")
    return binary, rate or None


def with_watch_rate(policy, rate):
    """The policy file, or a copy of it with `watchRate: rate` (the watch's cadence, whose idle
    cost the idle rows measure)."""
    if rate is None:
        return policy
    path = f"{policy[:-len('.yaml')]}-watch-{rate.replace('%', 'pct')}.yaml"
    with open(policy) as f, open(path, "w") as g:
        g.write(f.read() + f"watchRate: {rate}\n")
    return path


def job_exit(logpath):
    """The exit status the job shell logged for gpu_load.py (`job-exit=N`; 128 + N: signal N),
    or None where the shell died with it (the kubelet's cgroup.kill)."""
    found = [l.split("job-exit=", 1)[1].split()[0] for l in tail(logpath, 65536).splitlines() if "job-exit=" in l]
    return int(found[-1]) if found and found[-1].isdigit() else None


def grew_from(logpath):
    """When gpu_load.py began to grow (its "go" line), or None if it never did."""
    try:
        return next((e["t"] for e in events(logpath) if e.get("event") == "go"), None)
    except OSError:
        return None


def tail(path, n):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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


class Interrupted(Exception):
    """SIGTERM or SIGINT (the sweep script's time-out backstop): end the sweep, report."""


# Seconds kept for the teardown and the report (stopping the base load, the timeline's gzip,
# the tables and the plot) at the end of --budget.
REPORT_RESERVE_S = 15
# A headroom's setup (its holder and base loads getting ready) and at least one short run.
SETUP_ESTIMATE_S = 45
# A run beyond its greedy job's own length: the double and the agent starting, the job's
# CUDA start, finding its pid, the counters' next poll, the stops and the settling.
RUN_OVERHEAD_S = 14


def run_estimate(done, seconds):
    """Seconds a run will take: the longest of its cell's finished runs (`done`) and one more,
    else its greedy job's own length (`seconds`) and the start-up around it."""
    return max(done) + 1 if done else seconds + RUN_OVERHEAD_S


def kill_group(p):
    """SIGKILL `p`'s process group (spawn_in_cgroup makes each load a session leader): a job
    shell's child too, where no PID namespace kills it with the shell."""
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    try:
        p.wait(timeout=8)
    except subprocess.TimeoutExpired:
        pass


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
    return sum(1 for e in events(logpath) if e.get("event") == "oom" and t0 <= e["t"] <= t1)


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


def kubelet_in(workdir, t0, t1):
    """(unix time, pod, action, detail) of every kubelet action the double logged."""
    out = []
    path = os.path.join(workdir, "kubelet.jsonl")
    if not os.path.exists(path):
        return out
    for line in open(path):
        try:
            a = json.loads(line)
        except ValueError:
            continue
        if t0 <= a["timeUnix"] <= t1:
            out.append((a["timeUnix"], a["pod"], a["action"], a.get("detail", "")))
    return out


def agent_view(port, timeout=3.5):
    """The agent's counters and its guard's /state from a publication rendered after this
    call: the agent renders /metrics (its own counters included) once per full poll, so a
    scrape right after an action can read the poll before it. Call 3 read its kill runs 0.3 s
    after the job died and saw no `gpu_warden_guard_stops_total{result="killed"}` at all.
    Returns (counters, the guard part of /state, whether a newer publication was seen)."""
    def state():
        try:
            return json.loads(http_get(f"http://127.0.0.1:{port}/state"))
        except Exception:
            return None
    st = state()
    seq0 = (st or {}).get("snapshot", {}).get("seq")
    fresh = False
    deadline = time.time() + timeout
    while seq0 is not None and time.time() < deadline:
        time.sleep(0.05)
        st2 = state()
        if st2 and st2.get("snapshot", {}).get("seq", seq0) > seq0:
            st, fresh = st2, True
            break
    try:
        text = http_get(f"http://127.0.0.1:{port}/metrics")
    except Exception:
        text = ""
    return parse_counters(text), (st or {}).get("guard"), fresh


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


def agent_of(args, opts):
    """The agent binary of a series: --agent-b for b=1, else --agent."""
    return args.agent_b if opts["b"] else args.agent


def parse_sweep(args):
    """[(label, mode, fast interval, greedy GPUs, [rates], runs, options)] from --sweep or
    --modes/--rates; options: h (headroom), k (kubelet), p (PID-1 mode), a (onDecision),
    s (neighbour shape, SHAPES), r (the double's --slow-pod-reads, e.g. 3s), b (1: the agent of --agent-b)."""
    spec = args.sweep or ";".join(f"{m}:{args.rates}" for m in args.modes.split(","))
    gpus = [int(g) for g in args.gpus.split(",")]
    out = []
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        label, rates = item.split(":")
        head, *kv = label.split("%")
        opts = dict(h="today", k="faithful", p="shell", a="", s="trainer", r="", b="")
        for pair in kv:
            k, _, v = pair.partition("=")
            if k not in opts:
                raise SystemExit(f"--sweep: unknown key {k!r} in {item!r} (h, k, p, a, s, r, b)")
            opts[k] = v
        if opts["h"] not in ("today", "a10g") or opts["k"] not in ("faithful", "instant") \
                or opts["p"] not in ("shell", "exits") or opts["a"] not in ("", "evict", "stop", "kill") \
                or opts["s"] not in SHAPES or (opts["r"] and not opts["r"][:-1].replace(".", "").isdigit()) \
                or opts["b"] not in ("", "1"):
            raise SystemExit(f"--sweep: bad option value in {item!r}")
        head, _, runs = head.partition("*")
        head, _, on = head.partition("/")
        mode, _, fast = head.partition("@")
        if mode not in ("guard", "none"):
            raise SystemExit(f"--sweep: unknown mode {mode!r} in {item!r}")
        greedy_gpus = [int(g) for g in on.split("+")] if on else gpus[:1]
        if not set(greedy_gpus) <= set(gpus):
            raise SystemExit(f"--sweep: {item!r} grows on a GPU not in --gpus")
        out.append((label, mode, fast or args.fast_interval, greedy_gpus, [float(r) for r in rates.split(",")],
                    int(runs) if runs else args.runs, opts))
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


# The A10G the "a10g" headroom emulates: 24 GiB, thresholds as the default 5 % / 10 % of it.
A10G_MIB = 24 * 1024

# The neighbours of the greedy job (issue 38), per shape and headroom: the "train" process
# (its gpu_load.py arguments, its pod's namespace, priority and annotations) and the steady
# CI pods' GiB. `trainer`: the sweep's protected trainer (a 2 GiB workspace; 1 GiB on the
# a10g). `ws`: a trainer whose workspace, larger than the soft band (H200: 7 GiB; a10g:
# 1.2 GiB), is allocated and freed every 0.3 s. `runner`: the seed's four jobs of one runner
# at one priority — one declares vram-request-mib and stays inside it while its workspace
# comes and goes, two hold steady (an innocent 24 GiB one among them), one grows. `two`: the
# trainer, and two greedy jobs starting 1 s apart.
SHAPES = ("trainer", "ws", "runner", "two")
WS_STEP = ["--workspace-hold-s", "0.15", "--release-s", "0.15"]


def base_load(args, hr, shape):
    """(train gpu_load args, train pod (ns, priority, annotations), [steady CI GiB], host GiB)."""
    a10g = hr == "a10g"
    protected = ("ml", 1_000_000, {})
    if shape == "ws":
        hold, ws = (5, 2) if a10g else (args.train_gib - 8, 10)
        return (["--hold-gib", str(hold), "--compute", "--workspace-gib", str(ws), "--seconds", "3600"] + WS_STEP,
                protected, [3, 3] if a10g else [4], 0 if a10g else 1)
    if shape == "runner":
        # Today's is the H200's (TRAIN_GIB 100): 105 GiB of 143. On a smaller card the declared
        # job and the second steady job shrink to leave the same free memory as the other
        # shapes (TRAIN_GIB + 7 GiB in use): sized for the H200 on an H100, the base load alone
        # left 3.9 GiB free, below hard, and a steady job was evicted before any growth
        # (docs/validation.md §9h).
        big = args.train_gib >= 100
        hold, ws = (4, 2) if a10g else ((48, 8) if big else (max(1, args.train_gib - 32), 8))
        steady = [6, 3] if a10g else ([24, 24] if big else [24, 6])
        declared = {"gpu-warden.io/vram-request-mib": str(int((hold + ws) * 1024))}
        return (["--hold-gib", str(hold), "--compute", "--workspace-gib", str(ws), "--seconds", "3600"] + WS_STEP,
                ("ci", 0, declared), steady, 0 if a10g else 1)
    if a10g:
        return (["--hold-gib", "6", "--compute", "--workspace-gib", "1", "--seconds", "3600"], protected, [3, 3], 0)
    return (["--hold-gib", str(args.train_gib), "--compute", "--workspace-gib", str(args.workspace_gib),
             "--seconds", "3600"], protected, [4], 1)


def write_policy(args, workdir, fast, headroom="today", action=""):
    if headroom == "a10g":
        hard, soft = f"{int(A10G_MIB * args.hard / 100)}Mi", f"{int(A10G_MIB * args.soft / 100)}Mi"
    else:
        hard, soft = f"{args.hard:g}%", f"{args.soft:g}%"
    path = os.path.join(workdir, f"policy-{fast}-{headroom}-{action or 'default'}.yaml")
    with open(path, "w") as f:
        f.write(f"mode: enforce\nhard: {hard}\nsoft: {soft}\ngrace: 10s\nhorizon: 5s\n"
                + ("" if fast == "default" else f"fastInterval: {fast}\n")
                + ("" if args.grace == "default" else f"evictionGracePeriodSeconds: {args.grace}\n")
                + (f"onDecision: {action}\n" if action else "")
                + "cooldownTimeout: 30s\nrateLimit: {maxEvictions: 5, per: 60s}\n")
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent")
    ap.add_argument("--double")
    ap.add_argument("--agent-b", help="the agent of the series with b=1 (an A/B of two builds in one call)")
    ap.add_argument("--report-only", metavar="RUNS_JSON",
                    help="no measurement: the report again from an earlier call's guard-runs.json, into --out")
    ap.add_argument("--timeline", help="with --report-only: that call's timeline.csv(.gz), to compute the runs' figures again")
    ap.add_argument("--rates", default="4,16,32,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--train-gib", type=float, default=100)
    ap.add_argument("--workspace-gib", type=float, default=2)
    ap.add_argument("--chunk-mib", default="auto", help="the greedy job's allocation size, or auto (by rate)")
    ap.add_argument("--idle-agents", default="",
                    help="comma-separated agent binaries, each BINARY or BINARY@WATCHRATE (its policy's "
                         "watchRate), whose CPU is measured with the guard armed, first on the idle GPU, "
                         "then with the training and small CI loads running")
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--fast-interval", default="default",
                    help="the policy's fastInterval, or default (the agent's own, adaptive watch)")
    ap.add_argument("--hard", type=float, default=5, help="hard threshold, %% of the GPU free")
    ap.add_argument("--soft", type=float, default=10, help="soft threshold, %% of the GPU free")
    ap.add_argument("--modes", default="guard,none", help="guard (enforce mode), none (no agent)")
    ap.add_argument("--sweep", help="series MODE[@FAST][/GPUS]:RATES;… (overrides --modes/--rates)")
    ap.add_argument("--gpus", default="0", help="GPUs that each get a training process and a small CI pod")
    ap.add_argument("--skip-attribution", action="store_true")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds for the whole harness, from its start to the written report: a run "
                         "(or a headroom's setup) that would not end inside it is skipped; SIGTERM "
                         "ends the run in progress and writes the report from the runs that finished")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/guard-out"))
    ap.add_argument("--grace", default="default",
                    help="the policy's evictionGracePeriodSeconds, or default (the agent's, 5 s)")
    ap.add_argument("--watch-latency", default="50ms", help="the double's kubelet watch latency")
    ap.add_argument("--hold-after-full", type=float, default=8,
                    help="seconds the greedy job lives on after it could have filled the GPU")
    args = ap.parse_args()
    if args.report_only:
        report_only(args.report_only, args.out, args.timeline)
        return
    if not (args.agent and args.double):
        ap.error("--agent and --double are required (unless --report-only)")
    global PIDNS, nv
    import pynvml as nv
    PIDNS = have_pid_namespaces()
    log("PID namespaces for the job shells:", PIDNS)
    # A fresh work dir: the logs are appended to and read for "ready" lines and pids, so a
    # warm machine's earlier call would answer for this one's jobs.
    shutil.rmtree(WORKDIR, ignore_errors=True)
    os.makedirs(WORKDIR, exist_ok=True)
    # One self-test where it passes in a PID namespace (a second, as before, cost the budget a
    # CUDA start for nothing); the fallback is tested before it is used.
    if not (PIDNS and job_selftest(WORKDIR)):
        if PIDNS:
            PIDNS = False
            log("falling back to job shells without PID namespaces (SIGTERM ignored by trap; an emulation)")
        if not job_selftest(WORKDIR):
            raise SystemExit("a CUDA job cannot be started in a container cgroup: see the log above")
    sweep = parse_sweep(args)
    gpus = [int(g) for g in args.gpus.split(",")]
    if any(o["h"] == "a10g" for *_, o in sweep) and gpus != [0]:
        raise SystemExit("the a10g headroom emulates one GPU: use --gpus 0")
    if any(o["b"] for *_, o in sweep) and not args.agent_b:
        raise SystemExit("--sweep: a series with b=1 runs the agent of --agent-b, which is not given")
    os.makedirs(args.out, exist_ok=True)
    workdir = WORKDIR
    os.makedirs(workdir, exist_ok=True)
    nv.nvmlInit()
    total_mib = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(gpus[0])).total // MIB
    thresholds = {"today": (total_mib * args.soft / 100, total_mib * args.hard / 100),
                  "a10g": (A10G_MIB * args.soft / 100, A10G_MIB * args.hard / 100)}

    def suffix(g):
        return "" if g == gpus[0] else f"-{g}"
    results, idle_rows, pods_by_pid, setups = [], [], {}, {}
    sampler = Sampler(os.path.join(workdir, "timeline.csv"), gpus)
    sampler.start()
    procs = {}
    pid_of = lambda lp: json.loads([l for l in open(lp) if '"ready"' in l][-1])["pid"]
    meta = dict(gpus=args.gpus, fast_interval=args.fast_interval, grace=args.grace, watch_latency=args.watch_latency,
                budget=args.budget)
    deadline = START + args.budget - REPORT_RESERVE_S
    durations, skipped = {}, []
    interrupted = failed = None

    def on_term(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        for hr, shape in dict.fromkeys((o["h"], o["s"]) for *_, o in sweep):
            if time.time() + SETUP_ESTIMATE_S > deadline:
                log(f"budget spent: skipping the {hr} headroom ({shape})")
                skipped += [(label, rate, run, "headroom setup") for label, *_, rates, runs, o in sweep
                            if (o["h"], o["s"]) == (hr, shape) for rate in rates for run in range(runs)]
                continue
            # The base load of this headroom and shape: a trainer (or the declared runner job)
            # and steady CI pods on each GPU. Their logs are the shape's own: a readiness
            # wait on a log that an earlier shape at this headroom wrote to passed at once, so
            # a run began while its neighbours still started (2026-12-05, runner at a10g).
            train_args, (train_ns, train_prio, train_ann), small_gibs, host_gib = base_load(args, hr, shape)
            n_small = len(small_gibs)
            train = {g: Pod(train_ns, f"train{suffix(g) or '-0'}", "trainer", train_prio,
                            {} if train_ns == "ml" else {"workload-type": "gpu-ci"}, train_ann) for g in gpus}
            small = {(g, i): Pod("ci", f"ci-small{suffix(g)}{'-' + str(i + 1) if i else ''}", "build", 0,
                                 {"workload-type": "gpu-ci"}) for g in gpus for i in range(n_small)}
            for p in list(train.values()) + list(small.values()):
                p.make_cgroup()
            base_pods = list(train.values()) + list(small.values())
            free_before, left_on = settled_free(gpus[0])
            setup = dict(free_before=free_before)
            if left_on:
                setup["processes_at_setup"] = left_on
            if hr == "a10g":
                # Hold all but an A10G's 23 028 usable MiB (the holder's own context included).
                hlog = os.path.join(workdir, f"a10g-holder-{shape}.log")
                keep = 23028 + 600
                procs[("holder", 0)] = hold(max(0, setup["free_before"] - keep), hlog)
                if not wait_ready(hlog, 60):
                    raise RuntimeError("the a10g holder never got ready")
                setup["free_after_holder"] = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).free // MIB
            if args.idle_agents and not idle_rows:
                idle_rows += idle_cpu(args, base_pods, workdir, write_policy(args, workdir, args.fast_interval, hr),
                                      f"idle GPU ({hr})")
            tlog = {g: os.path.join(workdir, f"train-{hr}-{shape}-{g}.log") for g in gpus}
            slog = {(g, i): os.path.join(workdir, f"small-{hr}-{shape}-{g}-{i}.log")
                    for g in gpus for i in range(n_small)}
            logs = list(tlog.values())
            for g in gpus:
                procs[("train", g)] = load(g, train_args, train[g].cgroup, tlog[g])
                for i in range(n_small):
                    procs[("small", g, i)] = load(g, ["--hold-gib", str(small_gibs[i]), "--seconds", "3600"],
                                                  small[(g, i)].cgroup, slog[(g, i)])
                    logs.append(slog[(g, i)])
            if host_gib:
                hlog = os.path.join(workdir, f"host-{hr}-{shape}.log")
                procs[("host", gpus[0])] = load(gpus[0], ["--hold-gib", str(host_gib), "--seconds", "3600"], None, hlog)
                logs.append(hlog)
            for lp in logs:
                if not wait_ready(lp):
                    raise RuntimeError(f"{lp} never got ready")
            for g in gpus:
                pods_by_pid[pid_of(tlog[g])] = (train_ns, train[g].name, "trainer")
                for i in range(n_small):
                    pods_by_pid[pid_of(slog[(g, i)])] = ("ci", small[(g, i)].name, "build")
            time.sleep(1)
            setup["free_with_base_load"] = nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(gpus[0])).free // MIB
            # Keyed by headroom and shape: each shape sets its own base load at a headroom.
            setups[f"{hr} {shape}"] = setup
            log("headroom", hr, setup)
            if args.idle_agents and len(idle_rows) < 2 * len(args.idle_agents.split(",")):
                idle_rows += idle_cpu(args, base_pods, workdir, write_policy(args, workdir, args.fast_interval, hr),
                                      f"base load running, calm ({hr})")
            if not args.skip_attribution and hr == "today":
                d, kc = start_double(args, base_pods, workdir, "attr")
                a = None
                try:  # stopped on SIGTERM too: neither is in procs
                    a, port = start_agent(args, kc, workdir, write_policy(args, workdir, args.fast_interval, hr))
                    attribution_check(args, workdir, port, pods_by_pid)
                finally:
                    stop(a)
                    stop(d)
            for label, mode, fast, greedy_gpus, rates, runs, opts in sweep:
                if (opts["h"], opts["s"]) != (hr, shape):
                    continue
                policy = write_policy(args, workdir, fast, hr, opts["a"])
                for rate in rates:
                    for run in range(runs):
                        # Long enough to fill the GPU and then hold on through the kubelet's grace
                        # (max(grace, 2 s) after the eviction), as a real job would.
                        seconds = max(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(g)).free / GIB
                                      for g in greedy_gpus) / rate + 1.5 + args.hold_after_full
                        # A run must end inside the budget, not merely start in it: the longest of
                        # this cell's runs so far, else the job's own length and the start-up around it.
                        est = run_estimate(durations.get((label, rate)), seconds)
                        if time.time() + est > deadline:
                            log(f"budget spent: skipping {label} at {rate:g} GiB/s, run {run} (needs ~{est:.0f} s, "
                                f"{max(0, deadline - time.time()):.0f} s left)")
                            skipped.append((label, rate, run, f"~{est:.0f} s needed"))
                            continue
                        run_started = time.time()
                        # A training process evicted by mistake is recorded and restarted, so one
                        # wrong eviction cannot void the runs after it.
                        restarted = []
                        for g in gpus:
                            if procs[("train", g)].poll() is not None:
                                log(f"training process on GPU {g} is gone: restarting it")
                                seen = open(tlog[g]).read().count('"ready"')
                                procs[("train", g)] = load(g, train_args, train[g].cgroup, tlog[g])
                                ready_by = time.time() + 90  # not `deadline`: that is the budget's
                                while open(tlog[g]).read().count('"ready"') <= seen and time.time() < ready_by:
                                    time.sleep(0.1)
                                pods_by_pid[pid_of(tlog[g])] = (train_ns, train[g].name, "trainer")
                                restarted.append(g)
                        tag = label.replace("/", "-on-").replace("@", "-at-").replace("+", "").replace("%", "-") \
                            .replace("=", "").replace("*", "x")
                        # (key, GPU, start delay): one greedy job per GPU; with shape `two` a second
                        # on the same GPU one second later (key "<gpu>b").
                        gkeys = [(g, g, 0) for g in greedy_gpus] + \
                            ([(f"{g}b", g, 1) for g in greedy_gpus] if shape == "two" else [])
                        greedy = {k: Pod("ci", f"ci-greedy{'2' if k != g else ''}-{int(rate)}-{run}{suffix(g)}",
                                         "build", 0, {"workload-type": "gpu-ci"}) for k, g, _ in gkeys}
                        for p in greedy.values():
                            p.make_cgroup()
                        d = a = None
                        port = None
                        agent_log = os.path.join(workdir, "agent.log")
                        log_from = os.path.getsize(agent_log) if os.path.exists(agent_log) else 0
                        if mode == "guard":
                            d, kc = start_double(args, base_pods + list(greedy.values()), workdir, "run", opts["k"],
                                                 opts["r"])
                            procs[("run", "double")] = d
                            a, port = start_agent(args, kc, workdir, policy, agent_of(args, opts))
                            procs[("run", "agent")] = a
                        # Again, now (a trainer restarted above holds its memory again).
                        seconds = max(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(g)).free / GIB
                                      for g in greedy_gpus) / rate + 1.5 + args.hold_after_full
                        gprocs, glogs, gpids = {}, {}, {}
                        # Every window (OOMs, evictions, the timeline) opens before the greedy jobs
                        # start: with several of them, the first grows while the next still starts.
                        t0 = time.time()
                        # Growth starts at the go, once every job is up: each job's own start-up
                        # (CUDA, a second or more, varying) would otherwise set the gap between
                        # two jobs' growth (on the H100, 0.1–2 s for `two`'s "one second apart").
                        go = os.path.join(workdir, f"go-{hr}-{tag}-{int(rate)}-{run}")
                        if os.path.exists(go):
                            os.remove(go)
                        for k, g, delay in gkeys:
                            glogs[k] = os.path.join(workdir, f"greedy-{hr}-{tag}-{int(rate)}-{run}-{k}.log")
                            # Into procs in the same statement: a SIGTERM between two would leave
                            # this job (a session of its own) running after the harness.
                            procs[("run", "greedy", k)] = gprocs[k] = load(
                                g, ["--hold-gib", "0.25", "--grow-gib-per-s", str(rate),
                                    "--chunk-mib", str(chunk_for(args, rate)),
                                    "--start-delay", str(delay), "--go-file", go, "--seconds", f"{seconds:.2f}"],
                                greedy[k].cgroup, glogs[k], pid1=opts["p"])
                        for k, g, _ in gkeys:
                            ready = wait_ready(glogs[k], 30)
                            if not ready:
                                log("greedy job never got ready:", open(glogs[k]).read()[-2000:])
                            # The job's NVML pid: gpu_load.py's, not the wrapper's (NVML never
                            # lists that). Not found, or not on the GPU: the report says the
                            # pid-derived figures are unknown instead of computing them.
                            pid, how = find_job_pid(greedy[k].cgroup, gprocs[k].pid, logged_pid=ready_pid(glogs[k]),
                                                    timeout=10 if ready else 1)
                            listed = pid is not None and nvml_lists(g, pid)
                            gpids[k] = dict(pid=pid, pid_how=how, pid_ok=listed, wrapper_pid=gprocs[k].pid, gpu=g)
                            if not listed:
                                log(f"greedy job {k} on GPU {g}: NVML pid unknown ({how}; found {pid}, listed by NVML: {listed})")
                        open(go, "w").close()
                        ready_at = time.time()
                        for gp in gprocs.values():
                            try:
                                gp.wait(timeout=max(0.1, ready_at + seconds + 8 - time.time()))
                            except subprocess.TimeoutExpired:
                                kill_group(gp)
                        t1 = time.time() + 0.3
                        time.sleep(0.3)
                        counters, guard_state, fresh = agent_view(port) if port else ({}, None, False)
                        stop(a)
                        stop(d)
                        for k in [k for k in procs if k[0] == "run"]:
                            procs.pop(k)
                        # This run's agent log lines about decisions, stops and evictions, with the
                        # guard's /state and the greedy job's log, to $OUT: a wrong victim can be
                        # analysed afterwards (call 3's could not: the log stayed on the machine).
                        agent_lines = []
                        if a is not None and os.path.exists(agent_log):
                            with open(agent_log, "rb") as f:
                                f.seek(log_from)
                                agent_lines = f.read().decode(errors="replace").splitlines()
                        kept, dropped = decision_lines(agent_lines)
                        append_run_log(os.path.join(args.out, RUN_LOGS), dict(
                            label=label, rate=rate, run=run, t0=t0, agent_lines=kept, agent_lines_dropped=dropped,
                            agent_lines_total=len(agent_lines), guard_state=guard_state,
                            greedy_logs={k: tail(glogs[k], 8192) for k, _, _ in gkeys}))
                        results.append(dict(
                            label=label, mode=mode, fast=fast, rate=rate, run=run, t0=t0, t1=t1,
                            headroom=hr, kubelet=opts["k"], pid1=opts["p"], action=opts["a"] or "default",
                            # `killed` is the wrapper's status: a job shell whose child the agent
                            # killed exits 0 after `echo job-exit=137`, so job_exit says more.
                            shape=shape, slow_reads=opts["r"],
                            agent=os.path.basename(agent_of(args, opts)) if mode == "guard" else None,
                            greedy={k: dict(name=greedy[k].name, **gpids[k],
                                            killed=gprocs[k].returncode is not None and gprocs[k].returncode != 0,
                                            wrapper_rc=gprocs[k].returncode, job_exit=job_exit(glogs[k]),
                                            grew_from=grew_from(glogs[k]))
                                    for k, _, _ in gkeys},
                            train_restarted_before=restarted,
                            train_alive_after={g: procs[("train", g)].poll() is None for g in gpus},
                            train_ooms={g: ooms_in(tlog[g], t0, t1) for g in gpus},
                            evictions=evictions_in(workdir, t0 - 1, t1),
                            kubelet_actions=kubelet_in(workdir, t0 - 1, t1 + 3),
                            counters=counters, counters_fresh=fresh,
                            on_decision=on_decision_of(guard_state),
                            decision_log=dict(file=RUN_LOGS, lines=len(kept), dropped=dropped),
                            decisions=decisions_in(workdir, t0 - 1, t1)))
                        log(label, rate, run, "train OOMs", results[-1]["train_ooms"], "evictions",
                            results[-1]["evictions"], "kubelet", [k[2] for k in results[-1]["kubelet_actions"]],
                            "counters", counters)
                        # The raw results so far, at once: a harness killed later still leaves them.
                        write_runs(args.out, results, thresholds, total_mib, setups, PIDNS, sweep, meta, skipped)
                        # Let the GPU settle (the greedy job's memory returns to the driver).
                        time.sleep(0.5)
                        durations.setdefault((label, rate), []).append(time.time() - run_started)
            # Tear the base load down before the next headroom.
            for k in [k for k in procs if k[0] in ("train", "small", "host", "holder")]:
                kill_group(procs.pop(k))
            time.sleep(2)
    except Interrupted as e:
        # The run in progress is dropped (its figures would be cut short); every finished
        # one is reported.
        interrupted = str(e)
        log(f"{interrupted}: stopping; the report covers the {len(results)} runs that finished")
    except Exception as e:
        # A failure (an agent that never got ready, a load that did not start) costs the run
        # in progress, not the report of those before it; the exit status still says so.
        failed = interrupted = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        log(f"failed ({interrupted}); the report covers the {len(results)} runs that finished")
    finally:
        # Nothing may stop the report now: a second SIGTERM is ignored (the shell's timeout
        # SIGKILLs after its grace if this hangs).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sampler.stop_flag = True
        for k, p in list(procs.items()):
            if k[0] == "run" and k[1] != "greedy":
                stop(p)
            else:
                kill_group(p)
        sampler.join(timeout=2)
    # The 10 ms timeline comes back too (gzip, a few MiB at most), so that a report can be
    # computed again later (`--report-only RUNS --timeline`). $OUT returns at most 8 files:
    # gpu.csv, sweep.log, guard-runs.json, guard-report.md, guard-vram.png, run-logs.jsonl.gz,
    # timeline.csv.gz (and attribution.md without --skip-attribution).
    try:
        with open(os.path.join(workdir, "timeline.csv"), "rb") as src, \
                gzip.open(os.path.join(args.out, TIMELINE), "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    except OSError as e:
        log("timeline not saved:", e)
    meta.update(interrupted=interrupted, skipped=skipped, ended_after_s=round(time.time() - START, 1))
    try:
        timeline = read_timeline(os.path.join(workdir, "timeline.csv"))
    except OSError as e:
        log("no timeline:", e)
        timeline = []
    report(args.out, meta, sweep, results, timeline, thresholds, total_mib, pods_by_pid, idle_rows, setups, PIDNS)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
