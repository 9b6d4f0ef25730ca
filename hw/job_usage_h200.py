#!/usr/bin/env python3
"""Each CI job's held and used GPU time against the truth on a real GPU (issue 41).

Three CUDA jobs of known shapes run at once on GPU 0, each in its own kubepods-shaped cgroup
v2 directory with a matching pod (its own GitLab project) served by the API double, as
hw/guard_h200.py places them: `idle` holds 1 GiB and never computes, `half` computes bf16
matmuls half of every 200 ms, `busy` computes throughout. gpu-warden runs with the NVML
backend at its defaults. After SECONDS the jobs exit; once their records close (10 s after
their processes are gone, the pods still running) the agent's counters per project give each
job's busy share (busy / held). The reference, over the same window, read independently:

- pynvml's nvmlDeviceGetProcessUtilization, read every second with the previous timestamp,
  each process's samples averaged and integrated over the seconds between reads;
- `nvidia-smi pmon -s u -d 1`: each process's `sm` column averaged over the window.

Pass: each job's share within TOLERANCE (absolute, default 0.05) of pynvml's; the pmon column
is reported beside it. The table goes to $OUT/job_usage_h200.md (docs/validation.md).

    OUT=/tmp/out python3 hw/job_usage_h200.py --agent target/release/gpu-warden \
        --double target/release/apiserver-double [--seconds 120] [--tolerance 0.05] \
        [--agent-arg=--process-util-interval=1s] [--baseline-agent before/gpu-warden]

With --baseline-agent a second build runs beside the agent at its defaults with the same pods, and
the CPU (schedstat, all threads) and RSS of both over the jobs' window go to a cost table: the
agent's cost for the record against a build without it, in the same run. The report also says
how many samples NVML gives per process per read (one: the last sample period only).
Runs: docs/validation.md §7.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guard_h200 as g  # noqa: E402  (Pod, cgroup placement, the API double)

import pynvml as n  # noqa: E402

# The jobs: (name, project, SM duty cycle 0..1).
JOBS = [("idle", "101", 0.0), ("half", "102", 0.5), ("busy", "103", 1.0)]

# A CUDA job computing `duty` of every 200 ms (0: holds its memory and sleeps).
LOAD = r"""
import sys, time, torch
duty, seconds = float(sys.argv[1]), float(sys.argv[2])
dev = torch.device("cuda:0")
held = torch.empty(1 << 30, dtype=torch.uint8, device=dev); held.fill_(1)
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev); y = torch.randn_like(x)
torch.cuda.synchronize(); print('{"event": "ready"}', flush=True)
end = time.time() + seconds
while time.time() < end:
    t0 = time.time()
    if duty > 0:
        while time.time() - t0 < 0.2 * duty:
            z = x @ y; torch.cuda.synchronize()
    time.sleep(max(0.0, 0.2 - (time.time() - t0)))
"""


def reference(pids, stop, out):
    """Integrates pynvml's per-process SM utilisation for `pids` until `stop` is set."""
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    last_ts, last_t = 0, time.time()
    while not stop.is_set():
        time.sleep(1)
        now = time.time()
        try:
            samples = n.nvmlDeviceGetProcessUtilization(h, last_ts)
        except n.NVMLError_NotFound:
            samples = []
        by_pid = {}
        for s in samples:
            last_ts = max(last_ts, s.timeStamp)
            by_pid.setdefault(s.pid, []).append(min(s.smUtil, 100) / 100)
        for pid in pids:
            u = by_pid.get(pid)
            out.setdefault(pid, 0.0)
            if u:
                out[pid] += sum(u) / len(u) * (now - last_t)
            # How many samples NVML gives per process per read: one means it reports the last
            # sample period only, more that it keeps the samples since the previous read.
            out.setdefault(("samples", pid), []).append(len(u or []))
        last_t = now


def pmon(seconds, path):
    return subprocess.Popen(["nvidia-smi", "pmon", "-i", "0", "-s", "u", "-d", "1", "-c", str(int(seconds))],
                            stdout=open(path, "w"), stderr=subprocess.STDOUT)


def pmon_shares(path, pids):
    """Mean `sm` % per pid from pmon's table (`-` counts as 0)."""
    cols, per = None, {p: [] for p in pids}
    for line in open(path):
        if line.startswith("# gpu"):
            cols = line[1:].split()
            continue
        if line.startswith("#") or not cols:
            continue
        f = dict(zip(cols, line.split()))
        pid = int(f.get("pid", "0")) if f.get("pid", "-").isdigit() else 0
        if pid in per:
            sm = f.get("sm", "-")
            per[pid].append(float(sm) / 100 if sm.replace(".", "").isdigit() else 0.0)
    return {p: (sum(v) / len(v) if v else None) for p, v in per.items()}


def cpu_ns(pid):
    """Nanoseconds on CPU of all of `pid`'s threads (schedstat's first field)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metric(text, name, project):
    for line in text.splitlines():
        if line.startswith(f'{name}{{namespace="ci",project="{project}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", default="target/release/gpu-warden")
    ap.add_argument("--double", default="target/release/apiserver-double")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--watch-latency", default="0s")
    ap.add_argument("--agent-arg", action="append", default=[],
                    help="(repeatable) an extra flag for the agent, e.g. --agent-arg=--process-util-interval=1s")
    ap.add_argument("--baseline-agent", action="append", default=[],
                    help="(repeatable) another gpu-warden build run beside the agent at its defaults (the "
                         "same pods; --agent-arg is the agent's alone): the CPU and RSS of each over the jobs' "
                         "window go to the cost table; the same build twice shows the run's noise")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "/tmp/job-usage")
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, "work")
    os.makedirs(work, exist_ok=True)

    pods = [g.Pod("ci", f"job-{name}", "build", 0, labels={"project.runner.gitlab.com/id": proj})
            for name, proj, _ in JOBS]
    for p in pods:
        p.make_cgroup()
    double, kc = g.start_double(args, pods, work, "usage")
    def start_agent(path, port, log, extra):
        return subprocess.Popen([path, "--backend", "nvml", "--node-name", g.NODE,
                                 "--listen", f"127.0.0.1:{port}", "--annotations", "off", "--log-format", "json",
                                 *extra],
                                env=dict(os.environ, KUBECONFIG=kc),
                                stdout=open(os.path.join(work, log), "w"), stderr=subprocess.STDOUT)
    agent = start_agent(args.agent, 19401, "agent.log", args.agent_arg)
    agents = [("agent", args.agent, agent)]
    for i, path in enumerate(args.baseline_agent):
        agents.append((f"baseline{i + 1}", path, start_agent(path, 19402 + i, f"baseline{i + 1}.log", [])))
    time.sleep(5)
    procs = [g.spawn_in_cgroup(p.cgroup, [sys.executable, "-c", LOAD, str(duty), str(args.seconds)],
                               os.path.join(work, f"{name}.log"))
             for p, (name, _, duty) in zip(pods, JOBS)]
    for name, _, _ in JOBS:
        g.wait_ready(os.path.join(work, f"{name}.log"))
    pids = [p.pid for p in procs]
    stop, ref = threading.Event(), {}
    t = threading.Thread(target=reference, args=(pids, stop, ref))
    t.start()
    pm = pmon(args.seconds, os.path.join(work, "pmon.txt"))
    t_cpu0, cpu0 = time.monotonic(), {name: cpu_ns(a.pid) for name, _, a in agents}
    for p in procs:
        p.wait()
    t_cpu1, cpu1 = time.monotonic(), {name: cpu_ns(a.pid) for name, _, a in agents}
    rss = {name: rss_kib(a.pid) for name, _, a in agents}
    stop.set()
    t.join()
    pm.wait()
    time.sleep(15)  # the records close 10 s after the processes are gone
    text = urllib.request.urlopen("http://127.0.0.1:19401/metrics", timeout=5).read().decode()
    for _, _, a in agents:
        a.terminate()
    double.terminate()
    shares = pmon_shares(os.path.join(work, "pmon.txt"), pids)

    rows, ok = [], True
    for (name, proj, duty), pid in zip(JOBS, pids):
        held = metric(text, "gpu_warden_ci_job_gpu_replica_seconds_total", proj)
        busy = metric(text, "gpu_warden_ci_job_gpu_busy_seconds_total", proj)
        share = busy / held if held and busy is not None else None
        ref_share = ref.get(pid, 0.0) / args.seconds
        good = share is not None and abs(share - ref_share) <= args.tolerance
        ok &= good
        pm_share = shares.get(pid)
        rows.append(f"| {name} | {duty:.0%} | {held} | {busy} | {share if share is None else f'{share:.3f}'} | "
                    f"{ref_share:.3f} | {'—' if pm_share is None else f'{pm_share:.3f}'} | {'ok' if good else 'FAIL'} |")
    table = "\n".join(["| job | duty | held s | busy s | agent share | pynvml share | pmon share | within "
                       f"{args.tolerance} |", "|---|---|---|---|---|---|---|---|"] + rows)
    per_read = sorted(n_ for pid in pids for n_ in ref.get(("samples", pid), []))
    table += ("\n\nNVML samples per process per read (pynvml, every 1 s): median "
              f"{per_read[len(per_read) // 2] if per_read else '—'}, max {max(per_read, default='—')}\n")
    if args.agent_arg:
        table += f"\nAgent flags beyond the defaults: {' '.join(args.agent_arg)}\n"
    wall = t_cpu1 - t_cpu0
    cost = ["| agent | binary | CPU, % of one core | RSS at the end, MiB |", "|---|---|---|---|"]
    for name, path, _ in agents:
        cost.append(f"| {name} | {path} | {100 * (cpu1[name] - cpu0[name]) / 1e9 / wall:.3f} | "
                    f"{rss[name] / 1024:.1f} |")
    for name, _, _ in agents[1:]:
        a, b = (cpu1[n_] - cpu0[n_] for n_ in ("agent", name))
        cost.append(f"\nCPU agent / {name} over the same {wall:.0f} s: {a / max(b, 1):.3f}; "
                    f"RSS {rss['agent'] / max(rss[name], 1):.3f}")
    if len(agents) == 3:
        a, b = (cpu1[n_] - cpu0[n_] for n_ in ("baseline1", "baseline2"))
        cost.append(f"\nCPU baseline1 / baseline2 (the run's noise when they are one build): {a / max(b, 1):.3f}")
    table += "\n" + "\n".join(cost) + "\n"
    print(table)
    with open(os.path.join(out_dir, "job_usage_h200.md"), "w") as f:
        f.write(table + "\n")
    json.dump({"metrics": text}, open(os.path.join(work, "scrape.json"), "w"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
