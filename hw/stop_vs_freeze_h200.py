#!/usr/bin/env python3
"""SIGSTOP against a cgroup freeze, as the guard's way to stop a victim's growth (issue 25).

Issue 25 lets the stop action be a SIGSTOP of each GPU process or a freeze of the container's
cgroup (`cgroup.freeze`), "if you measure that to be better". This measures the two on the
GPU with the greedy job the guard sweeps use (hw/gpu_load.py growing at R GiB/s, started as a
GitLab job is: under a PID-1 shell in its own PID namespace, in a container-shaped cgroup):

  - action → stopped: SIGSTOP until /proc/PID/stat shows `T`; the freeze until the cgroup's
    `cgroup.events` says `frozen 1` (the kernel's own "every task is frozen");
  - growth after the action: the process's VRAM in NVML (sampled as fast as NVML answers)
    from the last sample before the action to the highest in the next second;
  - undone: SIGCONT / `cgroup.freeze` 0, and the job grows again within 2 s.

    OUT=/tmp/out python3 hw/stop_vs_freeze_h200.py --rates 16,64,250 --runs 3

Acting just after NVML showed a step is one phase of the job's allocation cycle; the guard
decides on whatever reading it has. `--delay-ms-max D` acts a random 0..D ms later instead,
and records how long before the act the last step landed and whether (and when) a step landed
after it: does an allocation the job is inside of when SIGSTOP comes still land?

    python3 hw/stop_vs_freeze_h200.py --rates 250,128 --runs 15 --actions sigstop \
        --delay-ms-max 12 --observe-s 0.3

Writes stop-vs-freeze.json and stop-vs-freeze.md under --out. Needs root, cgroup v2 and a
GPU; every cgroup it makes is killed (`cgroup.kill`) and removed at the end of each trial.
"""
import argparse
import json
import os
import random
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import guard_h200 as g  # noqa: E402  (the job starter and pid finder the sweeps use)

MIB = 1 << 20
ROOT = os.path.join(g.CG_ROOT, "gw-stop-vs-freeze")


def proc_state(pid):
    """The state letter of /proc/PID/stat (after the command, which may hold spaces)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def frozen(cg):
    with open(os.path.join(cg, "cgroup.events")) as f:
        return any(line.strip() == "frozen 1" for line in f)


def vram_mib(h, pid):
    try:
        for p in g.nv.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == pid:
                return (p.usedGpuMemory or 0) // MIB
    except g.nv.NVMLError:
        pass
    return None


def wait_until(pred, timeout, step=0.0002):
    """Seconds until `pred()` held, or None after `timeout`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred():
            return time.perf_counter() - t0
        time.sleep(step)
    return None


def trial(args, h, action, rate, n):
    cg = os.path.join(ROOT, f"{action}-{int(rate)}-{n}")
    os.makedirs(cg, exist_ok=True)
    logpath = os.path.join(args.job_logs, f"job-{action}-{int(rate)}-{n}.log")
    extra = ["--hold-gib", "0.5", "--grow-gib-per-s", str(rate), "--chunk-mib", str(g.chunk_for(args, rate)),
             "--grow-max-gib", str(args.grow_max_gib), "--seconds", "30"]
    p = g.load(0, extra, cg, logpath, pid1="shell")
    r = dict(action=action, rate=rate, run=n)
    try:
        if not g.wait_ready(logpath, 60):
            r["error"] = "the job never got ready: " + g.tail(logpath, 5)
            return r
        pid, how = g.find_job_pid(cg, p.pid, logged_pid=g.ready_pid(logpath))
        if pid is None or not g.nvml_lists(0, pid):
            r["error"] = f"the job's NVML pid was not found ({how})"
            return r
        # Act once the job is growing: it has allocated beyond what it holds at start.
        base = vram_mib(h, pid) or 0
        if wait_until(lambda: (vram_mib(h, pid) or 0) >= base + args.act_after_mib, 20, 0.001) is None:
            r["error"] = "the job did not grow"
            return r
        # A random phase of the job's allocation cycle (--delay-ms-max): the guard decides on
        # whatever reading it has, not only on the one just after a step landed. Sampled as
        # fast as NVML answers meanwhile, to say how long before the act the last step landed.
        delay = random.uniform(0, args.delay_ms_max) / 1000
        last, last_at, t_seen = vram_mib(h, pid), time.perf_counter(), time.perf_counter()
        while time.perf_counter() - t_seen < delay:
            m = vram_mib(h, pid)
            if m is not None and last is not None and m > last:
                last_at = time.perf_counter()
            last = m if m is not None else last
        before = vram_mib(h, pid)
        t_act = time.perf_counter()
        r["delay_ms"] = round(delay * 1000, 2)
        r["since_last_step_ms"] = round((t_act - last_at) * 1000, 2)
        if action == "sigstop":
            os.kill(pid, signal.SIGSTOP)
            took = wait_until(lambda: proc_state(pid) == "T", 2)
        else:
            with open(os.path.join(cg, "cgroup.freeze"), "w") as f:
                f.write("1")
            took = wait_until(lambda: frozen(cg), 2)
        r["act_to_stopped_ms"] = None if took is None else round(took * 1000, 3)
        samples, landed_at = [], None
        while time.perf_counter() - t_act < args.observe_s:
            m = vram_mib(h, pid)
            if m is not None:
                samples.append(m)
                if landed_at is None and before is not None and m > before:
                    landed_at = time.perf_counter() - t_act
        r["landed_after_act_ms"] = None if landed_at is None else round(landed_at * 1000, 2)
        r["vram_before_mib"] = before
        r["growth_after_mib"] = max(0, max(samples, default=before) - before)
        r["samples"] = len(samples)
        held = max(samples, default=before)
        if action == "sigstop":
            os.kill(pid, signal.SIGCONT)
        else:
            with open(os.path.join(cg, "cgroup.freeze"), "w") as f:
                f.write("0")
        back = wait_until(lambda: (vram_mib(h, pid) or 0) > held, 2, 0.001)
        r["resumed_growing_ms"] = None if back is None else round(back * 1000, 1)
        return r
    finally:
        try:
            with open(os.path.join(cg, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:
            g.kill_group(p)
        try:
            p.wait(timeout=10)
        except Exception:  # noqa: BLE001  (a stuck job must not stop the next trial)
            g.kill_group(p)
        wait_until(lambda: not g.cgroup_tree_pids(cg), 10, 0.05)
        try:
            os.rmdir(cg)
        except OSError:
            pass


def table(results):
    rows = ["| action | GiB/s | runs | action → stopped, ms (median, max) | VRAM growth after the action, MiB "
            "(median, max) | undone: growing again, ms (median) | errors |",
            "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["action"], r["rate"]) for r in results})
    for action, rate in keys:
        rs = [r for r in results if (r["action"], r["rate"]) == (action, rate)]
        ok = [r for r in rs if "error" not in r]

        def col(k, digits=1):
            v = [r[k] for r in ok if r.get(k) is not None]
            return "—" if not v else f"{statistics.median(v):.{digits}f}, {max(v):.{digits}f}"
        back = [r["resumed_growing_ms"] for r in ok if r.get("resumed_growing_ms") is not None]
        grew = sum(1 for r in ok if (r.get("growth_after_mib") or 0) > 0)
        errors = "; ".join(r["error"] for r in rs if "error" in r) or "—"
        rows.append(f"| {action} | {rate:g} | {len(ok)} of {len(rs)} | {col('act_to_stopped_ms', 3)} | "
                    f"{col('growth_after_mib', 0)} ({grew} of {len(ok)} grew) | {statistics.median(back) if back else float('nan'):.0f} | "
                    f"{errors} |")
    return "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="16,64,250")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk-mib", default="auto")
    ap.add_argument("--act-after-mib", type=int, default=2048, help="act once the job grew this much")
    ap.add_argument("--grow-max-gib", type=float, default=40)
    ap.add_argument("--delay-ms-max", type=float, default=0,
                    help="act a random 0..this many ms after the job grew --act-after-mib (its allocation cycle's phase)")
    ap.add_argument("--actions", default="sigstop,freeze")
    ap.add_argument("--observe-s", type=float, default=1.0, help="how long to read the job's VRAM after the act")
    ap.add_argument("--budget", type=float, default=150, help="start no trial after this many seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/stop-vs-freeze"))
    # Not under --out by default: the device tool brings back a bounded number of files, and
    # 30 jobs' logs once crowded out the results (2026-12-06).
    ap.add_argument("--job-logs", default="/tmp/stop-vs-freeze-jobs", help="where each job's log goes")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.job_logs, exist_ok=True)
    import pynvml
    g.nv = pynvml
    g.nv.nvmlInit()
    g.PIDNS = g.have_pid_namespaces()
    os.makedirs(ROOT, exist_ok=True)
    h = g.nv.nvmlDeviceGetHandleByIndex(0)
    start, results = time.time(), []
    for rate in (float(x) for x in args.rates.split(",")):
        for n in range(args.runs):
            for action in args.actions.split(","):
                if time.time() - start > args.budget:
                    print(f"budget spent: no {action} at {rate:g} GiB/s, run {n}", flush=True)
                    continue
                r = trial(args, h, action, rate, n)
                print(json.dumps(r), flush=True)
                results.append(r)
    with open(os.path.join(args.out, "stop-vs-freeze.json"), "w") as f:
        json.dump(dict(pid_namespaces=g.PIDNS, results=results), f, indent=1)
    md = (f"PID namespaces: {g.PIDNS}; each job a PID-1 shell running hw/gpu_load.py in a cgroup of its own; "
          f"acted a random 0–{args.delay_ms_max:g} ms after it had grown {args.act_after_mib} MiB.\n\n" + table(results))
    with open(os.path.join(args.out, "stop-vs-freeze.md"), "w") as f:
        f.write(md)
    print(md)
    try:
        os.rmdir(ROOT)
    except OSError:
        pass


if __name__ == "__main__":
    main()
