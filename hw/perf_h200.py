#!/usr/bin/env python3
"""gpu-warden's real-GPU cost figures (issue 7), all in one run of about 5 minutes.

Measures, in this order (phases share work; each prints its elapsed time):

1. agent phases with 0, 8 and 64 CUDA processes (`--procs-list`), agent run as
   `--backend nvml --kube off --poll-interval 1s --guard-mode off` with `GPU_WARDEN_GPM=off`:
   polls, wall per poll (`gpu_warden_poll_duration_seconds` deltas), CPU per poll and % of one
   core from the sum of `/proc/<pid>/task/*/schedstat` (ns on CPU; `utime+stime` ticks and the
   process CPU clock beside it), VmRSS and an Rss breakdown by mapping from `/proc/<pid>/smaps`.
   The idle phase lasts `--window-seconds`, the others `--seconds`;
2. `/metrics` latency against the idle agent: the compiled client (`--scrape-load`,
   `examples/scrape_load.rs`) at 1 and 64 clients, and the Python 1-client figure of earlier runs;
3. the guard's fast memory watch active: `apiserver-double` with this node, the agent with
   `--guard-mode dry-run --annotations off` through KUBECONFIG, RSS and CPU over `--window-seconds`
   (and a shorter control run with the guard off, when time allows);
4. a Python exporter as teams write it (pynvml + prometheus_client, `generate_latest()` per
   scrape), with and without the slow counters; `nvidia-smi --query-gpu` wall and CPU per run;
   the NVML floor (`--floor`, examples/nvml_floor.rs) with its peak RSS and an Rss breakdown;
5. ratios.

Everything printed is also written to `$OUT/perf.md`, raw figures to `$OUT/perf.json` and the
agents' and helpers' log tails to `$OUT/logs.txt` (OUT defaults to a new temporary folder).
A missing module or a failing measurement prints one line and the run goes on.

    cargo build --profile dist -p gpu-warden && cargo build --release -p apiserver-double && cargo build --release --example scrape_load --example nvml_floor
    OUT=/tmp/perf python3 hw/perf_h200.py --agent target/dist/gpu-warden \\
        --scrape-load target/release/examples/scrape_load --double target/release/apiserver-double \\
        --floor target/release/examples/nvml_floor

`--plan peers` (issue 20) is a different run of about 7 minutes: with `--peer-procs` CUDA
processes (`hw/cuda_hold.py`), gpu-warden, nvitop-exporter (`--nvitop-site`: a folder the
wheels were installed into), the pynvml exporter (this script's `--serve-pynvml`, a process of
its own) and the NVML floor at the agent's cadence (`nvml_floor --cadence`, with and without
the XID event wait) run at once, each exporter scraped once a second together with one
`nvidia-smi --query-gpu` run, for `--peer-seconds` with GPM off and again with GPM every 10 s;
every thread's schedstat, wake-ups (context switches) and RSS of each process; values
cross-checked in the same second; `/metrics` under 64 compiled scrapers; then the crowded
GPU (`--crowded 64,256`): the agent beside the floor and `nvml_floor --per-call`.

    OUT=/tmp/peers python3 hw/perf_h200.py --plan peers --agent target/dist/gpu-warden \
        --floor target/release/examples/nvml_floor --scrape-load target/release/examples/scrape_load \
        --nvitop-site /tmp/nvt [--agent-baseline other/gpu-warden]

`--plan crowded` (about 2–4 minutes): only the crowded-GPU phases of `--plan peers`
(`--crowded 64,256`): CUDA holders started in waves (`--holder-wave`, this script's own
minimal context, `--cuda-hold`), the agent beside `nvml_floor --cadence --xid`, then
`nvml_floor --per-call`; when a holder cannot be created, what may be the limit is recorded.
`--baseline-env 0:NAME=VALUE` (with `--agent-baseline`, repeatable) runs a baseline agent with extra
environment, e.g. the same binary with `GPU_WARDEN_RUNTIME_WORKERS=2` (the old runtime).

`--baseline-pageout N` (repeatable) runs the Nth baseline from a private copy of its binary and,
once it is ready, pages its executable's pages out (`process_madvise(MADV_PAGEOUT)`, from this
script): what the agent's resident memory would be if it dropped its start-up code pages.

`--plan scrape-modes` (issue 20, about 90 s): three agents with GPM off beside
`nvml_floor --cadence --xid` for `--peer-seconds`, one scraped once a second on a new connection
each time, one on a kept-alive connection, one not scraped: the HTTP side's share per thread.

Smoke test without a GPU (simulated agent; load, NVML and nvidia-smi sections are skipped):

    python3 hw/perf_h200.py --backend sim --agent target/dist/gpu-warden \\
        --scrape-load target/release/examples/scrape_load --double target/release/apiserver-double \\
        --window-seconds 5 --seconds 3
"""
import argparse
import http.client
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TICK = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20
NODE = "h200-perf"

try:
    import pynvml as nv
    NV_IMPORT_ERROR = None
except Exception as e:  # ImportError, or a broken install
    nv = None
    NV_IMPORT_ERROR = f"{type(e).__name__}: {e}"

try:
    import prometheus_client as prom
    PROM_IMPORT_ERROR = None
except Exception as e:
    prom = None
    PROM_IMPORT_ERROR = f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------- report

class Report:
    """Prints, and keeps everything printed as markdown plus raw figures as JSON. Both files
    are rewritten after every section, so a run cut short still leaves what it measured."""

    def __init__(self, out):
        self.out = out
        self.md = []
        self.data = {"sections": {}, "timing_s": {}, "notes": []}
        self.logs = []
        self.t_start = time.monotonic()

    def say(self, text=""):
        print(text, flush=True)
        self.md.append(text)

    def note(self, text):
        """A line about something skipped or failed: printed and kept in the JSON too."""
        self.say(f"> **note:** {text}")
        self.say()
        self.data["notes"].append(text)

    def table(self, headers, rows):
        if self.md and self.md[-1].strip():
            self.say()
        self.say("| " + " | ".join(headers) + " |")
        self.say("|" + "---|" * len(headers))
        for r in rows:
            self.say("| " + " | ".join(str(c) for c in r) + " |")
        self.say()

    def put(self, section, key, value):
        self.data["sections"].setdefault(section, {})[key] = value

    def log(self, title, text):
        self.logs.append(f"===== {title}\n{text.rstrip()}\n")

    def elapsed(self):
        return time.monotonic() - self.t_start

    def save(self):
        try:
            os.makedirs(self.out, exist_ok=True)
            with open(os.path.join(self.out, "perf.md"), "w") as f:
                f.write("\n".join(self.md) + "\n")
            with open(os.path.join(self.out, "perf.json"), "w") as f:
                json.dump(self.data, f, indent=1, default=str)
            with open(os.path.join(self.out, "logs.txt"), "w") as f:
                f.write("\n".join(self.logs))
        except OSError as e:
            print(f"cannot write to {self.out}: {e}", flush=True)


def section(rep, key, title, fn, *args):
    """Runs one section; a failure prints one line (traceback to logs.txt) and the run goes on."""
    rep.say(f"## {title}")
    rep.say()
    t0 = time.monotonic()
    result = None
    try:
        result = fn(*args)
    except Exception as e:  # one failing measurement never ends the run
        rep.note(f"section '{title}' failed: {type(e).__name__}: {e}")
        rep.log(f"traceback: {title}", traceback.format_exc())
    dt = time.monotonic() - t0
    rep.data["timing_s"][key] = round(dt, 1)
    rep.say(f"_section took {dt:.1f} s; {rep.elapsed():.0f} s since start_")
    rep.say()
    rep.save()
    return result


def f3(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}"


# --------------------------------------------------------------------------- processes

CHILDREN = []


def spawn(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    CHILDREN.append(p)
    return p


def stop(p, timeout=10):
    if p is None or p.returncode is not None:
        return
    try:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    except (OSError, ChildProcessError):
        pass


def stop_all():
    for p in CHILDREN:
        try:
            if p.returncode is None and p.poll() is None:
                p.kill()
        except (OSError, ChildProcessError):
            pass
    for p in CHILDREN:
        try:
            if p.returncode is None:
                p.wait(timeout=5)
        except (OSError, ChildProcessError, subprocess.TimeoutExpired):
            pass


def tail(path, lines=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def last_line(path):
    lines = [ln for ln in tail(path, 5).splitlines() if ln.strip()]
    return lines[-1].strip()[:400] if lines else "(empty log)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_child(pid):
    """The first child of pid (for the program /usr/bin/time runs), or None."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
            if kids:
                return int(kids[0])
    except (OSError, ValueError):
        pass
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        return int(d)
            except (OSError, ValueError, IndexError):
                pass
    return None


TIME = "/usr/bin/time"


def run_with_rusage(argv, timeout=120, sample=None, peak_rss=False):
    """Runs argv to the end; returns a dict: rc, out, err, wall_s, ru (rusage of that child
    alone, from os.wait4), sample (last value of sample(pid) taken every 100 ms while it ran)
    and, with peak_rss, peak_rss_kib and how it was measured.

    Peak RSS needs care: ru_maxrss of a child Python starts is at least the RSS of this Python
    (vfork/fork: the pre-exec process is counted), so it is measured by GNU time (its forked
    copy is ~2 MiB) when /usr/bin/time exists, else by sampling VmHWM of the program."""
    timed = peak_rss and os.access(TIME, os.X_OK)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r", suffix=".time") as tfile:
        cmd = [TIME, "-f", "%M", "-o", tfile.name] + argv if timed else argv
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        last, hwm, target = None, None, None if timed else p.pid
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            if sample is not None or peak_rss:
                if target is None:
                    target = find_child(p.pid)
                if target is not None:
                    if sample is not None:
                        try:
                            last = sample(target) or last
                        except Exception:
                            pass
                    h = proc_status(target).get("VmHWM_MiB")
                    hwm = h if h is not None else hwm
                time.sleep(0.1)
            else:
                time.sleep(0.002)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        r = {"rc": p.returncode, "out": out.read().decode(errors="replace"),
             "err": err.read().decode(errors="replace"), "wall_s": wall, "ru": ru, "sample": last}
        if peak_rss:
            r["peak_rss_kib"], r["peak_rss_how"] = None, None
            if timed:
                try:
                    r["peak_rss_kib"] = int(tfile.read().strip().splitlines()[-1])
                    r["peak_rss_how"] = "/usr/bin/time %M"
                except (ValueError, IndexError):
                    pass
            if r["peak_rss_kib"] is None and hwm is not None:
                r["peak_rss_kib"], r["peak_rss_how"] = hwm * 1024, "VmHWM sampled every 100 ms"
            r["vmhwm_sampled_mib"] = hwm
        return r


# --------------------------------------------------------------------------- /proc readers

def cpu_snapshot(pid):
    """On-CPU time of a live process three ways: the sum of field 1 of every thread's schedstat
    (ns; threads that already exited are missing), utime+stime from /proc/<pid>/stat (10 ms
    ticks) and the process CPU clock (ns, exited threads included)."""
    snap = {"t": time.monotonic(), "sched_s": None, "ticks_s": None, "clock_s": None, "threads": None}
    total, n = 0, 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                n += 1
            except (OSError, ValueError, IndexError):
                pass
        if n:
            snap["sched_s"], snap["threads"] = total / 1e9, n
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        snap["ticks_s"] = (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, ValueError, IndexError):
        pass
    try:
        snap["clock_s"] = time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the process
    except (OSError, ValueError, OverflowError, AttributeError):
        pass
    return snap


def cpu_delta(a, b, key):
    if a.get(key) is None or b.get(key) is None:
        return None
    return b[key] - a[key]


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "VmSize"):
                    out[k + "_MiB"] = int(v.split()[0]) / 1024
                elif k == "Threads":
                    out["Threads"] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


SMAP_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+\s+\S{4}\s")
GROUPS = ["the binary", "libnvidia-ml*", "other .so", "[heap]", "anonymous", "[stack]", "/dev/*",
          "other"]


def exe_path(pid):
    """The path of `pid`'s executable as its mappings name it, or None."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


def smaps_breakdown(pid):
    """Rss and Pss (KiB) of a process by mapping group, and its largest mappings by Rss."""
    exe = exe_path(pid) or ""
    groups = {g: {"rss_kib": 0, "pss_kib": 0, "mappings": 0} for g in GROUPS}
    by_name = {}
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if SMAP_HEADER.match(line):
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) > 5 else ""
                clean = path.removesuffix(" (deleted)")
                base = os.path.basename(clean)
                if clean and (clean == exe or (exe and base == os.path.basename(exe))):
                    g = "the binary"
                elif base.startswith("libnvidia-ml"):
                    g = "libnvidia-ml*"
                elif re.search(r"\.so(\.|$)", base):
                    g = "other .so"
                elif path == "[heap]":
                    g = "[heap]"
                elif path.startswith("[stack"):
                    g = "[stack]"
                elif path == "":
                    g = "anonymous"
                elif clean.startswith("/dev/"):
                    g = "/dev/*"
                else:
                    g = "other"
                name = path if path else "(anonymous)"
                cur = (g, name)
                groups[g]["mappings"] += 1
                by_name.setdefault(name, {"group": g, "rss_kib": 0, "mappings": 0})
                by_name[name]["mappings"] += 1
            elif cur is not None and (line.startswith("Rss:") or line.startswith("Pss:")):
                kib = int(line.split()[1])
                if line.startswith("Rss:"):
                    groups[cur[0]]["rss_kib"] += kib
                    by_name[cur[1]]["rss_kib"] += kib
                else:
                    groups[cur[0]]["pss_kib"] += kib
    top = sorted(({"name": k, **v} for k, v in by_name.items()), key=lambda x: -x["rss_kib"])[:12]
    total = sum(g["rss_kib"] for g in groups.values())
    return {"exe": exe, "total_rss_kib": total, "groups": groups, "top": top}


def clear_refs(pid):
    """Clears the pages' referenced bits, so `binary_pages` can tell which were used after."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def binary_pages(pid):
    """Rss and Referenced (KiB) of the process's own executable's mappings."""
    exe = exe_path(pid)
    if exe is None:
        return None
    out = {"rss_kib": 0, "referenced_kib": 0}
    mine = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if SMAP_HEADER.match(line):
                    parts = line.split(None, 5)
                    mine = len(parts) > 5 and parts[5].strip().removesuffix(" (deleted)") == exe
                elif mine and line.startswith("Rss:"):
                    out["rss_kib"] += int(line.split()[1])
                elif mine and line.startswith("Referenced:"):
                    out["referenced_kib"] += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return out


def pageout_executable(pid):
    """Asks the kernel to page out every resident page of `pid`'s executable's mappings
    (process_madvise, MADV_PAGEOUT; Linux 5.10+, root). Returns the bytes advised, or an
    error string."""
    import ctypes
    try:
        exe = exe_path(pid)
        if exe is None:
            return "no /proc/<pid>/exe"
        ranges = []
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) > 5 and parts[5].strip() == exe and "w" not in parts[1]:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((lo, hi - lo))

        class Iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        iov = (Iovec * len(ranges))(*[Iovec(lo, n) for lo, n in ranges])
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = os.pidfd_open(pid)
        try:
            r = libc.syscall(440, pidfd, iov, len(ranges), 21, 0)  # SYS_process_madvise, MADV_PAGEOUT
        finally:
            os.close(pidfd)
        if r < 0:
            return f"process_madvise failed: {os.strerror(ctypes.get_errno())}"
        return int(r)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return f"{type(e).__name__}: {e}"


def print_breakdown(rep, title, bd, compare=None, compare_title=None):
    rep.say(f"Rss by mapping, {title} (total {bd['total_rss_kib'] / 1024:.1f} MiB):")
    rep.say()
    headers = ["group", "Rss, MiB", "Pss, MiB", "mappings"]
    if compare:
        headers.append(f"{compare_title} Rss, MiB")
    rows = []
    for g in GROUPS:
        v = bd["groups"][g]
        if v["mappings"] == 0 and not (compare and compare["groups"][g]["mappings"]):
            continue
        row = [g, f"{v['rss_kib'] / 1024:.2f}", f"{v['pss_kib'] / 1024:.2f}", v["mappings"]]
        if compare:
            row.append(f"{compare['groups'][g]['rss_kib'] / 1024:.2f}")
        rows.append(row)
    rep.table(headers, rows)
    rep.say("Largest mappings by Rss: " + "; ".join(
        f"`{os.path.basename(t['name']) or t['name']}` {t['rss_kib'] / 1024:.2f} MiB"
        + (f" ({t['mappings']} maps)" if t["mappings"] > 1 else "")
        for t in bd["top"][:8]))
    rep.say()


# --------------------------------------------------------------------------- HTTP

def http_get(port, path="/metrics", timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t = time.perf_counter()
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        return r.status, body, time.perf_counter() - t
    finally:
        c.close()


def metric(body, name):
    """Sum of every series of `name` (with or without labels); None when absent."""
    total, seen = 0.0, False
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                total += float(line.rsplit(None, 1)[-1])
                seen = True
            except ValueError:
                pass
    return total if seen else None


def poll_counters(port):
    _, body, _ = http_get(port)
    return (metric(body, "gpu_warden_poll_duration_seconds_count"),
            metric(body, "gpu_warden_poll_duration_seconds_sum"))


# --------------------------------------------------------------------------- agent

class Agent:
    def __init__(self, a, tag, extra, env_extra=None):
        self.port = free_port()
        self.tag = tag
        self.logpath = os.path.join(a.workdir, f"agent-{tag}.log")
        if a.backend == "sim":
            src = ["--backend", "sim", "--scenario", a.scenario]
        else:
            src = ["--backend", "nvml"]
        self.argv = [a.agent] + src + ["--listen", f"127.0.0.1:{self.port}", "--poll-interval", "1s"] + extra
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GPU_WARDEN_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        env["GPU_WARDEN_GPM"] = "off"
        env.update(env_extra or {})
        self.env = env
        self.p = spawn(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=open(self.logpath, "w"))

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"agent exited with {self.p.returncode}: {last_line(self.logpath)}")
            try:
                if http_get(self.port, "/readyz", timeout=1)[0] == 200:
                    n, _ = poll_counters(self.port)
                    if n is not None and n >= 1:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"agent not ready after {timeout} s: {last_line(self.logpath)}")

    def stop(self, rep):
        stop(self.p)
        rep.log(f"agent {self.tag}: {' '.join(self.argv)}", tail(self.logpath, 80))


def measure_window(agent, seconds):
    """CPU, polls and RSS of a running agent over `seconds`."""
    pid = agent.p.pid
    n0, s0 = poll_counters(agent.port)
    c0 = cpu_snapshot(pid)
    rss = []
    end = c0["t"] + seconds
    while True:
        st = proc_status(pid)
        if "VmRSS_MiB" in st:
            rss.append(st["VmRSS_MiB"])
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    c1 = cpu_snapshot(pid)
    n1, s1 = poll_counters(agent.port)
    st = proc_status(pid)
    wall = c1["t"] - c0["t"]
    polls = (n1 - n0) if n0 is not None and n1 is not None else None
    r = {"window_s": round(wall, 2), "polls": polls, "threads_start": c0["threads"], "threads_end": c1["threads"],
         "status_end": st, "rss_mib_max": max(rss) if rss else None, "rss_mib_min": min(rss) if rss else None,
         "rss_mib_end": st.get("VmRSS_MiB")}
    r["wall_per_poll_ms"] = (s1 - s0) / polls * 1e3 if polls else None
    for key, name in (("sched_s", "schedstat"), ("ticks_s", "ticks"), ("clock_s", "cpuclock")):
        d = cpu_delta(c0, c1, key)
        r[f"cpu_{name}_s"] = d
        r[f"cpu_{name}_pct"] = d / wall * 100 if d is not None and wall > 0 else None
        r[f"cpu_{name}_per_poll_ms"] = d / polls * 1e3 if d is not None and polls else None
    return r


def phase_row(name, nprocs, r):
    return [name, "—" if nprocs is None else nprocs, f3(r.get("polls"), 0), f3(r.get("wall_per_poll_ms")),
            f3(r.get("cpu_schedstat_per_poll_ms")), f3(r.get("cpu_cpuclock_per_poll_ms")),
            f3(r.get("cpu_ticks_per_poll_ms"), 2), f3(r.get("cpu_schedstat_pct")),
            f"{f3(r.get('rss_mib_end'), 1)} / {f3(r.get('rss_mib_max'), 1)}",
            r.get("threads_end")]


PHASE_HEADERS = ["phase", "CUDA procs", "polls", "wall per poll, ms", "CPU per poll, ms (schedstat)",
                 "CPU per poll, ms (process clock)", "CPU per poll, ms (utime+stime ticks)",
                 "CPU, % of one core (schedstat)", "RSS end / max, MiB", "threads"]


# --------------------------------------------------------------------------- GPU processes

def nvml_process_count():
    if nv is None or not NVML_OK[0]:
        return None
    n = 0
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            n += len(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except nv.NVMLError:
            pass
    return n


def smi_process_count():
    try:
        r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0:
            return len([x for x in r.stdout.splitlines() if x.strip()])
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def gpu_process_count():
    try:
        n = nvml_process_count()
        if n is not None:
            return n
    except Exception:
        pass
    return smi_process_count()


NVML_OK = [False]


class Loads:
    """The CUDA processes of the load phases (hw/gpu_load.py)."""

    def __init__(self, a, rep):
        self.a, self.rep, self.procs = a, rep, []
        self.baseline = None

    def ready_count(self):
        n = 0
        for _, path in self.procs:
            try:
                with open(path) as f:
                    if '"ready"' in f.read():
                        n += 1
            except OSError:
                pass
        return n

    def grow_to(self, n, timeout=90):
        """Starts processes up to n in all and waits until the GPU lists them; returns how
        many are there (and says so when fewer)."""
        if self.baseline is None:
            self.baseline = gpu_process_count() or 0
        t0 = time.monotonic()
        while len(self.procs) < n:
            i = len(self.procs)
            path = os.path.join(self.a.workdir, f"load-{i}.log")
            p = spawn([sys.executable, os.path.join(HERE, "gpu_load.py"), "--hold-gib", "0.25", "--seconds", "900"],
                      stdout=open(path, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                      env=dict(os.environ, PYTHONUNBUFFERED="1"))
            self.procs.append((p, path))
        deadline = t0 + timeout
        last_print = t0
        while True:
            alive = sum(1 for p, _ in self.procs if p.poll() is None)
            listed = gpu_process_count()
            ready = self.ready_count()
            have = (listed - self.baseline) if listed is not None else ready
            if have >= n or alive == 0 or time.monotonic() > deadline:
                break
            if time.monotonic() - last_print > 10:
                self.rep.say(f"waiting for {n} CUDA processes: {have} listed by the GPU, {ready} ready, {alive} alive, "
                             f"{time.monotonic() - t0:.0f} s")
                last_print = time.monotonic()
            time.sleep(0.5)
        dt = time.monotonic() - t0
        dead = [(p, path) for p, path in self.procs if p.poll() is not None]
        if dead:
            self.rep.note(f"{len(dead)} of {len(self.procs)} load processes exited (first exit status "
                          f"{dead[0][0].returncode}); see logs.txt")
            self.rep.log(f"load process {dead[0][1]}", tail(dead[0][1], 30))
        if have < n:
            self.rep.note(f"only {have} of {n} CUDA processes listed after {dt:.0f} s"
                          + (f"; the phase runs with {have}" if have > 0 else ""))
        else:
            self.rep.say(f"{have} CUDA processes listed by the GPU after {dt:.1f} s")
        return have, dt

    def kill(self):
        for p, _ in self.procs:
            try:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for p, _ in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        for p, _ in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        # The driver tears contexts down after the processes end; wait until the GPU is idle.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            n = gpu_process_count()
            if n is None or n <= (self.baseline or 0):
                return n
            time.sleep(0.5)
        return gpu_process_count()


# --------------------------------------------------------------------------- sections

def module_version(dist):
    try:
        return importlib.metadata.version(dist)
    except Exception:
        return None


def info_section(rep, a):
    rep.say(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; host: {platform.node()}; kernel: {platform.release()}; "
            f"cores: {os.cpu_count()}; Python {platform.python_version()}")
    rep.say(f"- command: `{' '.join(sys.argv)}`")
    rep.say(f"- backend: {a.backend}; OUT: {a.out}")
    mods = []
    mods.append("pynvml " + (f"ok ({module_version('nvidia-ml-py') or module_version('pynvml')})" if nv else
                             f"MISSING ({NV_IMPORT_ERROR})"))
    mods.append("prometheus_client " + (f"ok ({module_version('prometheus_client')})" if prom else
                                        f"MISSING ({PROM_IMPORT_ERROR})"))
    # Only whether the loads can start: importing torch here would cost seconds and memory.
    mods.append("torch " + ("found" if importlib.util.find_spec("torch") else "MISSING (the load phases will fail)"))
    rep.say("- Python modules: " + "; ".join(mods))
    info = {"modules": mods, "argv": sys.argv}
    for name, path in (("agent", a.agent), ("scrape_load", a.scrape_load), ("apiserver-double", a.double),
                       ("nvml_floor", a.floor)):
        ok = bool(path) and os.access(path, os.X_OK)
        info[name] = path
        rep.say(f"- {name}: {path or '(not given)'}{'' if ok or not path else ' — NOT EXECUTABLE/MISSING'}")
    try:
        v = subprocess.run([a.agent, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        rep.say(f"- agent version: {v}")
        info["agent_version"] = v
    except (OSError, subprocess.TimeoutExpired) as e:
        rep.note(f"cannot run the agent: {e}")
    if a.backend == "nvml":
        if nv is not None:
            try:
                nv.nvmlInit()
                NVML_OK[0] = True
                gpus = []
                for i in range(nv.nvmlDeviceGetCount()):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    name = nv.nvmlDeviceGetName(h)
                    gpus.append(name.decode() if isinstance(name, bytes) else name)
                drv = nv.nvmlSystemGetDriverVersion()
                drv = drv.decode() if isinstance(drv, bytes) else drv
                rep.say(f"- GPUs: {len(gpus)} × {', '.join(sorted(set(gpus)))}; driver {drv}")
                info["gpus"], info["driver"] = gpus, drv
            except Exception as e:
                rep.note(f"NVML init failed in this script: {e}")
        try:
            r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            rep.say(f"- nvidia-smi -L: {r.stdout.strip() or r.stderr.strip()}")
        except (OSError, subprocess.TimeoutExpired) as e:
            rep.note(f"nvidia-smi not runnable: {e}")
        n = gpu_process_count()
        rep.say(f"- GPU compute processes before the run: {n}")
        info["gpu_processes_before"] = n
    rep.data["info"] = info
    rep.say()


def scrape_load_run(a, port, clients, per_client, pid):
    c0 = cpu_snapshot(pid)
    r = subprocess.run([a.scrape_load, "--addr", f"127.0.0.1:{port}", "--path", "/metrics", "--clients", str(clients),
                        "--requests-per-client", str(per_client)], capture_output=True, text=True, timeout=120)
    c1 = cpu_snapshot(pid)
    if r.returncode != 0:
        raise RuntimeError(f"scrape_load exited {r.returncode}: {r.stderr.strip()[:300]}")
    j = json.loads(r.stdout.strip().splitlines()[-1])
    d = cpu_delta(c0, c1, "sched_s")
    if d is not None and j.get("ok"):
        j["agent_cpu_per_request_us"] = d / j["ok"] * 1e6
    return j


def latency_section(rep, a, agent):
    res = {}
    # Python, 1 client, a new connection per request: the figure of the earlier runs.
    lat = []
    for _ in range(200):
        lat.append(http_get(agent.port)[2] * 1e3)
    lat.sort()
    res["python_1_client"] = {"requests": len(lat), "p50_ms": lat[len(lat) // 2],
                              "p99_ms": lat[int(len(lat) * 0.99) - 1], "max_ms": lat[-1]}
    rows = [["Python http.client, new connection per request", 1, 200, 0,
             f3(res["python_1_client"]["p50_ms"]), "—", f3(res["python_1_client"]["p99_ms"]),
             f3(res["python_1_client"]["max_ms"]), "—", "—"]]
    if not a.scrape_load or not os.access(a.scrape_load, os.X_OK):
        rep.note(f"--scrape-load missing ({a.scrape_load or 'not given'}): no compiled-client latency "
                 "(cargo build --release --example scrape_load)")
    else:
        for spec in a.scrape_runs.split(","):
            try:
                clients, per = (int(x) for x in spec.lower().split("x"))
                j = scrape_load_run(a, agent.port, clients, per, agent.p.pid)
                res[f"compiled_{clients}x{per}"] = j
                rows.append(["scrape_load (compiled), keep-alive", clients, j["requests"], j["errors"],
                             f3(j["p50_ms"]), f3(j["p90_ms"]), f3(j["p99_ms"]), f3(j["max_ms"]),
                             j["bytes_per_response"], f3(j.get("agent_cpu_per_request_us"), 1)])
                if j["errors"]:
                    rep.note(f"scrape_load {spec}: {j['errors']} errors, first: {j.get('first_error')}")
            except Exception as e:
                rep.note(f"scrape_load {spec} failed: {type(e).__name__}: {e}")
    rep.table(["client", "clients", "requests", "errors", "p50, ms", "p90, ms", "p99, ms", "max, ms",
               "bytes per response", "agent CPU per request, µs (schedstat)"], rows)
    rep.put("latency", "results", res)
    return res


def agent_phase(rep, a, loads, nprocs, seconds, with_latency):
    key = f"procs_{nprocs}"
    have = 0
    if nprocs > 0:
        if a.backend == "sim":
            rep.note(f"{nprocs}-process phase skipped: --backend sim has no CUDA processes")
            return None
        have, waited = loads.grow_to(nprocs, timeout=a.load_wait)
        rep.put(key, "procs_listed", have)
        rep.put(key, "procs_wait_s", round(waited, 1))
        if have <= 0:
            rep.note(f"{nprocs}-process phase skipped: no CUDA process came up")
            return None
    agent = Agent(a, key, ["--kube", "off", "--guard-mode", "off"])
    try:
        agent.wait_ready()
        time.sleep(1.0)  # the first polls (NVML init, first process-util read) are outside the window
        r = measure_window(agent, seconds)
        r["procs_requested"], r["procs_listed"] = nprocs, have if nprocs else gpu_process_count()
        try:
            r["smaps"] = smaps_breakdown(agent.p.pid)
        except OSError as e:
            rep.note(f"cannot read smaps: {e}")
        rep.put(key, "window", r)
        name = "idle GPU" if nprocs == 0 else f"{nprocs} CUDA processes"
        rep.table(PHASE_HEADERS, [phase_row(name, have if nprocs else r["procs_listed"], r)])
        st = r["status_end"]
        rep.say(f"RSS detail: VmRSS {f3(st.get('VmRSS_MiB'), 1)} MiB = RssAnon {f3(st.get('RssAnon_MiB'), 1)} + "
                f"RssFile {f3(st.get('RssFile_MiB'), 1)} + RssShmem {f3(st.get('RssShmem_MiB'), 1)}; "
                f"VmHWM {f3(st.get('VmHWM_MiB'), 1)} MiB; VmSize {f3(st.get('VmSize_MiB'), 0)} MiB; "
                f"threads {r['threads_start']} → {r['threads_end']}")
        s, c = r.get("cpu_schedstat_s"), r.get("cpu_cpuclock_s")
        if s is not None and c is not None and c > 0 and abs(s - c) / c > 0.05:
            rep.note(f"schedstat sum ({s * 1e3:.1f} ms) and process CPU clock ({c * 1e3:.1f} ms) differ by more "
                     "than 5 %: a thread ended during the window (its time is only in the process clock)")
        rep.say()
        if "smaps" in r and nprocs == 0:
            print_breakdown(rep, "agent, idle GPU", r["smaps"])
        if with_latency:
            rep.say("### /metrics latency (this agent)")
            rep.say()
            t0 = time.monotonic()
            try:
                latency_section(rep, a, agent)
            except Exception as e:
                rep.note(f"latency measurement failed: {type(e).__name__}: {e}")
                rep.log("traceback: latency", traceback.format_exc())
            rep.data["timing_s"]["latency"] = round(time.monotonic() - t0, 1)
            rep.say(f"_latency took {time.monotonic() - t0:.1f} s_")
            rep.say()
        return r
    finally:
        agent.stop(rep)


def start_double(rep, a):
    if not a.double or not os.access(a.double, os.X_OK):
        raise RuntimeError(f"--double missing ({a.double or 'not given'}): "
                           "cargo build --release -p apiserver-double")
    fixtures = os.path.join(a.workdir, "fixtures.yaml")
    text = None
    if a.backend == "sim":
        # The scenario's pods, so the simulated processes attribute to pods as in a cluster.
        r = subprocess.run([a.agent, "--backend", "sim", "--scenario", a.scenario, "--node-name", NODE,
                            "--print-sim-pods"], capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            text = r.stdout
    if text is None:
        text = json.dumps({"nodes": [{"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"},
                                                   "annotations": {}}}],
                           "pods": []})
    with open(fixtures, "w") as f:
        f.write(text)
    kc = os.path.join(a.workdir, "kubeconfig")
    port = free_port()
    logpath = os.path.join(a.workdir, "double.log")
    # Bookmarks every 60 s, about what a real API server sends: a 1 s bookmark would add
    # watch traffic to the agent's CPU that a cluster does not cause.
    p = spawn([a.double, "--listen", f"127.0.0.1:{port}", "--fixtures", fixtures, "--kubeconfig-out", kc,
               "--bookmark-interval", "60s"], stdout=subprocess.PIPE, stderr=open(logpath, "w"))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"apiserver-double exited {p.returncode}: {last_line(logpath)}")
        if os.path.exists(kc):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return p, kc, logpath
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError("apiserver-double did not start within 15 s")


def fast_watch_lines(logpath):
    """The agent's 'fast memory watch' log lines (JSON log format), as (on, raw line)."""
    out = []
    try:
        with open(logpath, errors="replace") as f:
            for line in f:
                if "fast memory watch" not in line:
                    continue
                on = None
                try:
                    j = json.loads(line)
                    on = (j.get("fields") or {}).get("on", j.get("on"))
                except ValueError:
                    m = re.search(r"\bon[=:]\s*(true|false)", line)
                    on = m and m.group(1) == "true"
                out.append((on, line.strip()))
    except OSError:
        pass
    return out


def fast_watch_section(rep, a, window, control_seconds):
    double, kc, dlog = start_double(rep, a)
    res = {}
    try:
        for tag, mode, seconds in (("fast_watch", "dry-run", window), ("kube_guard_off", "off", control_seconds)):
            if seconds <= 0:
                rep.note(f"{tag} run skipped (no time left in --deadline-seconds)")
                continue
            agent = Agent(a, tag, ["--node-name", NODE, "--guard-mode", mode, "--annotations", "off",
                                   "--log-format", "json"], {"KUBECONFIG": kc})
            try:
                agent.wait_ready()
                # The guard decides only once the pod view has synced ("held" is null then).
                state, deadline = None, time.monotonic() + 20
                while time.monotonic() < deadline:
                    try:
                        state = json.loads(http_get(agent.port, "/state", timeout=2)[1])
                        g = state.get("guard")
                        if g is not None and g.get("held") is None:
                            break
                    except (OSError, ValueError):
                        pass
                    time.sleep(0.2)
                time.sleep(1.0)
                r = measure_window(agent, seconds)
                try:
                    r["smaps"] = smaps_breakdown(agent.p.pid)
                except OSError as e:
                    rep.note(f"cannot read smaps: {e}")
                guard = (state or {}).get("guard")
                lines = fast_watch_lines(agent.logpath)
                r["guard_present"] = guard is not None
                r["guard_held"] = guard.get("held") if isinstance(guard, dict) else None
                r["guard_status"] = guard.get("status") if isinstance(guard, dict) else None
                r["fast_watch_log"] = [ln for _, ln in lines][-5:]
                r["fast_watch_on"] = lines[-1][0] if lines else False
                res[tag] = r
                rep.put("fast_watch", tag, r)
                label = ("guard dry-run, fast watch" if mode != "off" else "guard off, same kube client (control)")
                rep.table(PHASE_HEADERS, [phase_row(label, 0, r)])
                gs = r["guard_status"] or {}
                mode_seen = gs.get("mode") if isinstance(gs, dict) else None
                rep.say(f"/state: guard {'present' if guard is not None else 'ABSENT'}"
                        f"{'' if mode_seen is None else f', mode {mode_seen}'}"
                        f", held: {r['guard_held']!r}; fast memory watch per the log: "
                        f"{'ON' if r['fast_watch_on'] else 'off / not logged'}"
                        f" ({len(lines)} log line(s) 'fast memory watch')")
                if mode != "off" and not r["fast_watch_on"]:
                    rep.note("the fast watch did not report on: the figures above are NOT with the fast watch active "
                             "(see logs.txt for the agent's log)")
                if mode != "off" and guard is None:
                    rep.note("/state shows no guard")
                rep.say()
            finally:
                agent.stop(rep)
        fw, ctl = res.get("fast_watch"), res.get("kube_guard_off")
        if fw and "smaps" in fw:
            idle = (rep.data["sections"].get("procs_0") or {}).get("window") or {}
            print_breakdown(rep, "agent with the fast watch", fw["smaps"], compare=idle.get("smaps"),
                            compare_title="idle phase (kube off)")
        idle = (rep.data["sections"].get("procs_0") or {}).get("window") or {}
        base, what = (ctl, "the control run (same kube client, guard off)") if ctl else \
            (idle, "the idle phase (kube off: the kube client's own cost is included, an upper bound)")
        if fw and base and fw.get("cpu_schedstat_pct") is not None and base.get("cpu_schedstat_pct") is not None:
            extra = fw["cpu_schedstat_pct"] - base["cpu_schedstat_pct"]
            # 100 ms fast interval: about 9 memory-only reads per second between full polls.
            per_read = extra / 100 / 9 * 1e6
            rep.say(f"Fast watch cost: {extra:+.3f} % of one core over {what}, about {per_read:.1f} µs CPU per "
                    f"memory-only read (9 reads/s between full polls at the default 100 ms fastInterval); "
                    f"RSS {f3(fw.get('rss_mib_end'), 1)} MiB against {f3(base.get('rss_mib_end'), 1)} MiB.")
            rep.put("fast_watch", "extra_cpu_pct", extra)
            rep.put("fast_watch", "extra_cpu_baseline", what)
            rep.put("fast_watch", "cpu_per_fast_read_us", per_read)
            rep.say()
    finally:
        stop(double)
        rep.log("apiserver-double", tail(dlog, 40))
    return res


def field_value(v):
    t = getattr(v, "valueType", 0)
    u = v.value
    return {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(t, "ullVal"), u


class PyExporter:
    """What a Python exporter does per collection: the NVML calls of gpu-warden's poll, one
    Gauge per field labelled gpu/UUID, set every collection; generate_latest() per scrape."""

    def __init__(self, rep):
        self.rep = rep
        self.handles = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            u = nv.nvmlDeviceGetUUID(h)
            self.handles.append((str(i), u.decode() if isinstance(u, bytes) else u, h))
        mem_kw = {"version": nv.nvmlMemory_v2} if hasattr(nv, "nvmlMemory_v2") else {}
        if not mem_kw:
            rep.note("this pynvml has no nvmlMemory_v2: memory_info v1 used")

        def fields(h):
            out = {}
            vals = nv.nvmlDeviceGetFieldValues(h, [82, 142, 143, 144, 145])
            for fid, v in zip(("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                               "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "gpu_row_remap_pending",
                               "DCGM_FI_DEV_ROW_REMAP_FAILURE"), vals):
                if getattr(v, "nvmlReturn", 0) == 0:
                    attr, u = field_value(v)
                    out[fid] = float(getattr(u, attr, 0))
            return out

        def mem(h):
            m = nv.nvmlDeviceGetMemoryInfo(h, **mem_kw)
            return {"DCGM_FI_DEV_FB_FREE": m.free / MIB, "DCGM_FI_DEV_FB_USED": m.used / MIB,
                    "DCGM_FI_DEV_FB_RESERVED": getattr(m, "reserved", 0) / MIB}

        def util(h):
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"DCGM_FI_DEV_GPU_UTIL": u.gpu, "DCGM_FI_DEV_MEM_COPY_UTIL": u.memory}

        # (name, function of the handle returning {gauge: value}, slow)
        calls = [
            ("memory_info", mem, False),
            ("utilization", util, False),
            ("encoder", lambda h: {"DCGM_FI_DEV_ENC_UTIL": nv.nvmlDeviceGetEncoderUtilization(h)[0]}, False),
            ("decoder", lambda h: {"DCGM_FI_DEV_DEC_UTIL": nv.nvmlDeviceGetDecoderUtilization(h)[0]}, False),
            ("temperature", lambda h: {"DCGM_FI_DEV_GPU_TEMP": nv.nvmlDeviceGetTemperature(
                h, nv.NVML_TEMPERATURE_GPU)}, False),
            ("power", lambda h: {"DCGM_FI_DEV_POWER_USAGE": nv.nvmlDeviceGetPowerUsage(h) / 1000}, False),
            ("energy", lambda h: {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
                                  nv.nvmlDeviceGetTotalEnergyConsumption(h)}, True),
            ("sm clock", lambda h: {"DCGM_FI_DEV_SM_CLOCK": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)}, False),
            ("mem clock", lambda h: {"DCGM_FI_DEV_MEM_CLOCK": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)}, False),
            ("pcie replay", lambda h: {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": nv.nvmlDeviceGetPcieReplayCounter(h)}, True),
            ("field values", fields, False),
            ("compute processes", lambda h: {"gpu_processes": len(nv.nvmlDeviceGetComputeRunningProcesses(h))}, False),
        ]
        # Drop what this GPU/driver/pynvml does not support, once, as an exporter would.
        self.calls = []
        for name, fn, slow in calls:
            try:
                for _, _, h in self.handles:
                    fn(h)
                self.calls.append((name, fn, slow))
            except Exception as e:
                rep.note(f"pynvml call '{name}' unusable here ({type(e).__name__}: {e}); left out")
        self.gauges = {}
        if prom is not None:
            names = set()
            for _, fn, _ in self.calls:
                for _, _, h in self.handles:
                    names.update(fn(h).keys())
            for n in sorted(names):
                self.gauges[n] = prom.Gauge(n, f"{n} (pynvml)", ["gpu", "UUID"])

    def collect(self, slow, gauges):
        for gpu, uuid, h in self.handles:
            for _, fn, is_slow in self.calls:
                if is_slow and not slow:
                    continue
                vals = fn(h)
                if gauges:
                    for k, v in vals.items():
                        self.gauges[k].labels(gpu, uuid).set(v)

    def time(self, n, slow, gauges, scrape):
        for _ in range(5):
            self.collect(slow, gauges)
            if scrape:
                prom.generate_latest()
        walls = []
        c0, t0 = time.process_time(), time.perf_counter()
        size = 0
        for _ in range(n):
            t = time.perf_counter()
            self.collect(slow, gauges)
            if scrape:
                size = len(prom.generate_latest())
            walls.append(time.perf_counter() - t)
        wall = (time.perf_counter() - t0) / n * 1e3
        cpu = (time.process_time() - c0) / n * 1e3
        return {"n": n, "wall_ms": wall, "cpu_ms": cpu, "wall_p50_ms": statistics.median(walls) * 1e3,
                "exposition_bytes": size if scrape else None}


def pynvml_section(rep, a):
    if a.backend == "sim":
        rep.note("skipped: --backend sim")
        return None
    if nv is None:
        rep.note(f"skipped: pynvml not importable ({NV_IMPORT_ERROR})")
        return None
    if not NVML_OK[0]:
        rep.note("skipped: NVML did not initialise in this script")
        return None
    ex = PyExporter(rep)
    rep.say(f"{len(ex.handles)} GPU(s); NVML calls per collection: " + ", ".join(
        n + (" (slow)" if s else "") for n, s in ((c[0], c[2]) for c in ex.calls)))
    rep.say()
    if prom is None:
        rep.note(f"prometheus_client not importable ({PROM_IMPORT_ERROR}): pynvml calls only, no Gauges, "
                 "no generate_latest()")
    variants = []
    n = a.pynvml_collections
    for slow in (True, False):
        sl = "with energy + PCIe replay" if slow else "without energy + PCIe replay (gpu-warden reads them every 10 s)"
        if prom is not None:
            variants.append((f"pynvml + Gauges + generate_latest(), {sl}", slow, True, True))
            variants.append((f"pynvml + Gauges, no generate_latest(), {sl}", slow, True, False))
        variants.append((f"pynvml calls only, {sl}", slow, False, False))
    res = {}
    rows = []
    for label, slow, gauges, scrape in variants:
        try:
            r = ex.time(n, slow, gauges, scrape)
            res[label] = {"slow": slow, "gauges": gauges, "generate_latest": scrape, **r}
            rows.append([label, n, f3(r["wall_ms"]), f3(r["wall_p50_ms"]), f3(r["cpu_ms"]),
                         r["exposition_bytes"] if r["exposition_bytes"] is not None else "—"])
        except Exception as e:
            rep.note(f"{label}: {type(e).__name__}: {e}")
    if prom is not None:
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                prom.generate_latest()
            gl = {"wall_ms": (time.perf_counter() - t0) / n * 1e3, "cpu_ms": (time.process_time() - c0) / n * 1e3}
            res["generate_latest() alone"] = gl
            rows.append(["generate_latest() alone (default registry: these gauges + process/platform/gc)", n,
                         f3(gl["wall_ms"]), "—", f3(gl["cpu_ms"]), "—"])
        except Exception as e:
            rep.note(f"generate_latest alone: {e}")
    rep.table(["Python exporter variant", "collections", "wall per collection, ms (mean)", "wall, ms (p50)",
               "CPU per collection, ms (process_time)", "exposition bytes"], rows)
    rep.put("pynvml", "variants", res)
    return res


SMI_FIELDS = ("index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,memory.free,memory.reserved,"
              "utilization.gpu,utilization.memory,utilization.encoder,utilization.decoder,temperature.gpu,"
              "temperature.memory,power.draw,clocks.current.sm,clocks.current.memory")


def smi_section(rep, a):
    if a.backend == "sim":
        rep.note("skipped: --backend sim")
        return None
    if shutil.which("nvidia-smi") is None:
        rep.note("skipped: nvidia-smi not on PATH")
        return None
    runs = []
    for _ in range(a.smi_runs):
        x = run_with_rusage(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"], timeout=60)
        if x["rc"] != 0:
            rep.note(f"nvidia-smi exited {x['rc']}: {(x['err'] or x['out']).strip()[:200]}")
        ru = x["ru"]
        runs.append({"wall_ms": x["wall_s"] * 1e3, "cpu_ms": (ru.ru_utime + ru.ru_stime) * 1e3,
                     "user_ms": ru.ru_utime * 1e3, "sys_ms": ru.ru_stime * 1e3})
    # One more run for its peak RSS (under /usr/bin/time, so not in the timings above).
    x = run_with_rusage(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"], timeout=60, peak_rss=True)
    peak = x.get("peak_rss_kib")
    r = {"runs": len(runs),
         "wall_ms_median": statistics.median(x["wall_ms"] for x in runs),
         "cpu_ms_median": statistics.median(x["cpu_ms"] for x in runs),
         "cpu_ms_mean": statistics.mean(x["cpu_ms"] for x in runs),
         "user_ms_median": statistics.median(x["user_ms"] for x in runs),
         "sys_ms_median": statistics.median(x["sys_ms"] for x in runs),
         "peak_rss_mib": peak / 1024 if peak else None, "peak_rss_how": x.get("peak_rss_how"), "all": runs}
    rep.table(["collector", "runs", "wall, ms (median)", "CPU, ms (median; user + sys)", "CPU, ms (mean)",
               "peak RSS, MiB"],
              [["nvidia-smi --query-gpu (18 fields) --format=csv", r["runs"], f3(r["wall_ms_median"], 1),
                f"{f3(r['cpu_ms_median'], 1)} ({f3(r['user_ms_median'], 1)} + {f3(r['sys_ms_median'], 1)})",
                f3(r["cpu_ms_mean"], 1), f3(r["peak_rss_mib"], 1)]])
    rep.say("CPU per run is the child's own rusage (os.wait4), i.e. what RUSAGE_CHILDREN adds per run; "
            f"peak RSS from one extra run ({r['peak_rss_how'] or 'not measured'}).")
    rep.say()
    rep.put("nvidia_smi", "result", r)
    return r


FLOOR_RE = re.compile(r"([\d.]+) µs wall, ([\d.]+) µs CPU per poll")


def floor_section(rep, a):
    if a.backend == "sim":
        rep.note("skipped: --backend sim")
        return None
    if not a.floor:
        rep.note("skipped: no --floor (cargo build --release --example nvml_floor)")
        return None
    if not os.access(a.floor, os.X_OK):
        rep.note(f"skipped: --floor {a.floor} is not executable")
        return None
    res, rows = {}, []
    for extra in ([], ["--with-slow-counters"]):
        label = "with slow counters" if extra else "without slow counters"
        x = run_with_rusage([a.floor, str(a.floor_iterations)] + extra, timeout=120, sample=smaps_breakdown,
                            peak_rss=True)
        rc, out, err, wall, ru, bd = x["rc"], x["out"], x["err"], x["wall_s"], x["ru"], x["sample"]
        line = (out.strip() or err.strip()).splitlines()
        line = line[-1] if line else ""
        rep.say(f"`{os.path.basename(a.floor)} {a.floor_iterations} {' '.join(extra)}` → {line}")
        if rc != 0:
            rep.note(f"nvml_floor {label} exited {rc}")
        m = FLOOR_RE.search(line)
        peak = x.get("peak_rss_kib")
        r = {"rc": rc, "line": line, "run_wall_s": wall, "peak_rss_mib": peak / 1024 if peak else None,
             "peak_rss_how": x.get("peak_rss_how"), "vmhwm_sampled_mib": x.get("vmhwm_sampled_mib"),
             "process_cpu_s": ru.ru_utime + ru.ru_stime,
             "wall_us": float(m.group(1)) if m else None, "cpu_us": float(m.group(2)) if m else None,
             "smaps": bd}
        res[label] = r
        rows.append([label, a.floor_iterations, f3(r["wall_us"], 1), f3(r["cpu_us"], 1),
                     f"{f3(r['peak_rss_mib'], 1)} ({r['peak_rss_how'] or 'not measured'})",
                     f3(r["vmhwm_sampled_mib"], 1), f3(bd["total_rss_kib"] / 1024, 1) if bd else "—",
                     f3(r["process_cpu_s"], 2), f3(wall, 2)])
    rep.say()
    rep.table(["NVML floor", "iterations", "wall per poll, µs", "CPU per poll, µs (its own ticks)",
               "peak RSS, MiB", "VmHWM sampled, MiB", "Rss while looping, MiB (smaps)",
               "process CPU incl. NVML init, s", "run wall, s"], rows)
    rep.put("floor", "results", res)
    bd = (res.get("with slow counters") or {}).get("smaps") or (res.get("without slow counters") or {}).get("smaps")
    idle = (rep.data["sections"].get("procs_0") or {}).get("window") or {}
    if bd:
        print_breakdown(rep, "NVML floor (a process that only loads NVML and loops)", bd,
                        compare=idle.get("smaps"), compare_title="agent idle")
    return res


def ratio(x, y):
    return f"{x / y:.1f}×" if x is not None and y not in (None, 0) else "—"


def ratios_section(rep, a):
    s = rep.data["sections"]
    idle = (s.get("procs_0") or {}).get("window") or {}
    a_cpu, a_wall = idle.get("cpu_schedstat_per_poll_ms"), idle.get("wall_per_poll_ms")
    py = (s.get("pynvml") or {}).get("variants") or {}
    smi = (s.get("nvidia_smi") or {}).get("result") or {}
    fl = (s.get("floor") or {}).get("results") or {}
    rows = []

    def pyv(slow):
        for k, v in py.items():
            if v["slow"] == slow and v["gauges"] and v["generate_latest"]:
                return k, v
        for k, v in py.items():
            if v["slow"] == slow and not v["gauges"]:
                return k, v
        return None, None

    for slow in (True, False):
        k, v = pyv(slow)
        if v:
            rows.append([f"Python exporter: {k}", f3(v["cpu_ms"]), ratio(v["cpu_ms"], a_cpu), f3(v["wall_ms"]),
                         ratio(v["wall_ms"], a_wall)])
    if smi:
        rows.append(["nvidia-smi --query-gpu per run", f3(smi["cpu_ms_median"], 2), ratio(smi["cpu_ms_median"], a_cpu),
                     f3(smi["wall_ms_median"], 2), ratio(smi["wall_ms_median"], a_wall)])
    for label, r in fl.items():
        if r.get("wall_us") is not None:
            rows.append([f"NVML floor, {label} (per iteration)", f3(r["cpu_us"] / 1e3, 4),
                         ratio(r["cpu_us"] / 1e3, a_cpu), f3(r["wall_us"] / 1e3, 4), ratio(r["wall_us"] / 1e3, a_wall)])
    fast, slow_ = (fl.get("without slow counters") or {}).get("wall_us"), (fl.get("with slow counters") or {}).get("wall_us")
    if fast is not None and slow_ is not None:
        # The agent reads the slow counters on one poll in 10 (--slow-counter-interval 10s).
        blended = (fast + (slow_ - fast) / 10) / 1e3
        rows.append(["NVML floor blended as the agent polls (slow counters 1 poll in 10)", "—", "—", f3(blended, 4),
                     ratio(blended, a_wall)])
        rep.put("ratios", "floor_blended_wall_ms", blended)
        if a_wall is not None and blended > 0:
            rep.put("ratios", "agent_wall_over_floor_blended", a_wall / blended)
            rows.append(["→ gpu-warden wall per poll ÷ blended floor (its overhead over NVML alone)", "—", "—",
                         f"{a_wall / blended:.2f}×", "—"])
    rep.say(f"gpu-warden idle poll: {f3(a_cpu)} ms CPU (schedstat), {f3(a_wall)} ms wall per poll. "
            "Ratio columns: the other collector's figure divided by gpu-warden's (>1× = gpu-warden cheaper; "
            "for the floor rows <1× is expected: the floor is what NVML alone costs).")
    rep.say()
    if a_cpu is None and a_wall is None:
        rep.note("no idle-phase agent figures: ratios cannot be computed")
    if rows:
        rep.table(["collector", "CPU per collection, ms", "÷ agent CPU per poll", "wall per collection, ms",
                   "÷ agent wall per poll"], rows)
    else:
        rep.note("no other collector was measured (pynvml, nvidia-smi and floor sections skipped or failed)")
    rep.put("ratios", "agent_cpu_per_poll_ms", a_cpu)
    rep.put("ratios", "agent_wall_per_poll_ms", a_wall)


def summary_section(rep, a):
    s = rep.data["sections"]
    rows = []
    for key in sorted((k for k in s if k.startswith("procs_")), key=lambda k: int(k.split("_")[1])):
        w = s[key].get("window")
        if w:
            n = int(key.split("_")[1])
            rows.append(phase_row("idle GPU" if n == 0 else f"{n} CUDA processes", w.get("procs_listed"), w))
    fw = s.get("fast_watch") or {}
    for tag, label in (("fast_watch", "guard dry-run, fast watch (kube)"), ("kube_guard_off", "guard off (kube)")):
        if fw.get(tag):
            rows.append(phase_row(label, 0, fw[tag]))
    if rows:
        rep.table(PHASE_HEADERS, rows)
    # Rss by mapping group across every process measured: where the agent's memory goes,
    # next to a process that only loads NVML.
    cols = []
    for key in sorted((k for k in s if k.startswith("procs_")), key=lambda k: int(k.split("_")[1])):
        w = s[key].get("window") or {}
        if w.get("smaps"):
            n = int(key.split("_")[1])
            cols.append(("agent, idle" if n == 0 else f"agent, {n} procs", w["smaps"]))
    if (fw.get("fast_watch") or {}).get("smaps"):
        cols.append(("agent, fast watch", fw["fast_watch"]["smaps"]))
    for label, r in (((s.get("floor") or {}).get("results")) or {}).items():
        if r.get("smaps"):
            cols.append((f"NVML floor, {label}", r["smaps"]))
    if cols:
        rep.say("Rss by mapping group, MiB:")
        rep.table(["group"] + [c[0] for c in cols],
                  [[g] + [f"{c[1]['groups'][g]['rss_kib'] / 1024:.2f}" for c in cols] for g in GROUPS]
                  + [["total"] + [f"{c[1]['total_rss_kib'] / 1024:.2f}" for c in cols]])
    lat = ((s.get("latency") or {}).get("results")) or {}
    bits = []
    for k, v in lat.items():
        bits.append(f"{k}: p50 {f3(v.get('p50_ms'))} / p99 {f3(v.get('p99_ms'))} ms")
    if bits:
        rep.say("/metrics latency: " + "; ".join(bits))
        rep.say()


# --------------------------------------------------------------------------- main

# --------------------------------------------------------------------------- peers (issue 20)
#
# `--plan peers`: every exporter at once on one GPU, each scraped once a second, every thread
# of each counted (schedstat), beside the NVML floor at the agent's cadence
# (`nvml_floor --cadence`), at two GPM settings; then /metrics under 64 scrapers and the
# crowded GPU (64 and 256 CUDA processes, `nvml_floor --per-call`).

def thread_snapshot(pid):
    """{tid: (comm, on-CPU ns, voluntary + involuntary context switches)} of a live process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            with open(f"{base}/schedstat") as f:
                ns = int(f.read().split()[0])
            sw = 0
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        sw += int(line.split()[1])
            out[tid] = (comm, ns, sw)
        except (OSError, ValueError, IndexError):
            pass
    return out


def threads_delta(a, b, wall):
    """Per thread name (threads of one name summed): CPU ms per second and wake-ups per second."""
    by = {}
    for tid, (comm, ns, sw) in b.items():
        ns0, sw0 = (a[tid][1], a[tid][2]) if tid in a else (0, 0)
        e = by.setdefault(comm, {"threads": 0, "cpu_ms_per_s": 0.0, "switches_per_s": 0.0})
        e["threads"] += 1
        e["cpu_ms_per_s"] += (ns - ns0) / 1e6 / wall
        e["switches_per_s"] += (sw - sw0) / wall
    return by


class Proc:
    """A long-running process measured from outside: every thread's schedstat, RSS."""

    def __init__(self, name, argv, env=None, logdir=None):
        self.name, self.argv = name, argv
        self.log = os.path.join(logdir, f"{re.sub('[^A-Za-z0-9_.-]', '_', name)}.log")
        self.p = spawn(argv, env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def alive(self):
        return self.p.poll() is None

    def begin(self):
        self.t0, self.s0, self.th0 = time.monotonic(), cpu_snapshot(self.p.pid), thread_snapshot(self.p.pid)
        self.rss = []
        self.refs_cleared = clear_refs(self.p.pid)

    def sample_rss(self):
        st = proc_status(self.p.pid)
        if "VmRSS_MiB" in st:
            self.rss.append(st["VmRSS_MiB"])

    def end(self):
        s1, th1 = cpu_snapshot(self.p.pid), thread_snapshot(self.p.pid)
        wall = s1["t"] - self.s0["t"]
        st = proc_status(self.p.pid)
        d = cpu_delta(self.s0, s1, "sched_s")
        return {"window_s": round(wall, 2), "cpu_s": d, "cpu_pct": d / wall * 100 if d is not None else None,
                "cpu_ms_per_s": d / wall * 1e3 if d is not None else None,
                "rss_mib_end": st.get("VmRSS_MiB"), "rss_mib_max": max(self.rss) if self.rss else None,
                "hwm_mib": st.get("VmHWM_MiB"), "threads": st.get("Threads"),
                "rss_anon_mib": st.get("RssAnon_MiB"), "rss_file_mib": st.get("RssFile_MiB"),
                "binary": binary_pages(self.p.pid) if self.refs_cleared else None,
                "per_thread": threads_delta(self.th0, th1, wall),
                "switches_per_s": sum(v["switches_per_s"] for v in threads_delta(self.th0, th1, wall).values())}

    def stop(self, rep):
        stop(self.p)
        rep.log(f"{self.name}: {' '.join(self.argv)}", tail(self.log, 40))


def wait_http(port, path, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited: {last_line(proc.log)}")
        try:
            st, body, _ = http_get(port, path, timeout=2)
            if st == 200 and body:
                return body
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"port {port}{path} not ready after {timeout} s")


def metric_prefix(body, prefix, label=None):
    """First value of a series whose name starts with prefix (optionally containing label)."""
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("#") or not line.startswith(prefix):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_created",)):
            continue
        if label and label not in line:
            continue
        try:
            return float(line.rsplit(None, 1)[-1])
        except ValueError:
            pass
    return None


# What each peer calls memory used (MiB), GPU temperature (C), power (W), SM clock (MHz).
XCHECK = {
    "gpu-warden": ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"),
    "nvitop-exporter": ("gpu_memory_used", "gpu_temperature", "gpu_power_usage", "gpu_clock_sm"),
    "pynvml exporter": ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"),
}
SMI_QUERY = ("memory.used,temperature.gpu,power.draw,clocks.sm,utilization.gpu,memory.total,memory.free,"
             "temperature.memory,clocks.mem,pcie.link.gen.current,pcie.link.width.current,power.limit,"
             "clocks.max.sm,clocks.max.mem,enforced.power.limit,pstate,ecc.errors.corrected.volatile.total,"
             "ecc.errors.uncorrected.volatile.total")


class Scraper:
    """Once a second: one GET of each exporter's /metrics and one `nvidia-smi --query-gpu`
    (what nvidia_gpu_exporter runs per scrape; its CPU summed from wait4), all in the same
    second; keeps latencies and the cross-check values. The exporters are read in turn, the
    first one of a round changing every round: the one read first after the second's idle
    answers slower (0.70 against 0.37-0.52 ms at p50 for the same agent on the development
    machine, docs/performance.md), so a fixed order would charge it to one exporter."""

    def __init__(self, targets):
        import threading
        self.targets = targets  # {name: port}
        self.lat = {n: [] for n in targets}
        self.errors = {n: 0 for n in targets}
        self.rounds = []
        self.smi = {"runs": 0, "cpu_s": 0.0, "wall_s": 0.0, "peak_rss_kib": 0}
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.th.start()

    def loop(self):
        nxt = time.monotonic()
        turn = 0
        while not self.stop_ev.is_set():
            row = {"t": time.time()}
            targets = list(self.targets.items())
            turn = (turn + 1) % len(targets)
            for n, port in targets[turn:] + targets[:turn]:
                try:
                    st, body, dt = http_get(port, "/metrics", timeout=5)
                    if st != 200:
                        raise OSError(f"status {st}")
                    self.lat[n].append(dt * 1e3)
                    row[n] = [metric_prefix(body, k) for k in XCHECK["gpu-warden" if n.startswith("gpu-warden") else n]]
                except OSError:
                    self.errors[n] += 1
            try:
                t = time.perf_counter()
                p = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                out = p.stdout.read()
                _, status, ru = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                self.smi["runs"] += 1
                self.smi["cpu_s"] += ru.ru_utime + ru.ru_stime
                self.smi["wall_s"] += time.perf_counter() - t
                self.smi["peak_rss_kib"] = max(self.smi["peak_rss_kib"], ru.ru_maxrss)
                f = [x.strip() for x in out.splitlines()[0].split(",")]
                row["nvidia-smi"] = [float(f[0]), float(f[1]), float(f[2]), float(f[3])]
            except (OSError, ValueError, IndexError):
                pass
            self.rounds.append(row)
            nxt += 1.0
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def reset(self):
        self.lat = {n: [] for n in self.targets}
        self.errors = {n: 0 for n in self.targets}
        self.rounds = []
        self.smi = {"runs": 0, "cpu_s": 0.0, "wall_s": 0.0, "peak_rss_kib": 0}

    def stop(self):
        self.stop_ev.set()
        self.th.join(timeout=10)


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def peers_window(rep, a, tag, procs, scraper, seconds):
    """Measures every process in `procs` over the same window; returns {name: figures}."""
    scraper.reset()
    for p in procs.values():
        p.begin()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for p in procs.values():
            p.sample_rss()
        time.sleep(1.0)
    res = {n: p.end() for n, p in procs.items()}
    smi = dict(scraper.smi)
    lat = {n: list(v) for n, v in scraper.lat.items()}
    rounds = list(scraper.rounds)
    rep.put("peers", f"{tag}_procs", res)
    rep.put("peers", f"{tag}_smi", smi)
    rep.put("peers", f"{tag}_latency_ms", {n: {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99), "max": max(v) if v else None}
                                          for n, v in lat.items()})
    rep.put("peers", f"{tag}_errors", dict(scraper.errors))
    rep.put("peers", f"{tag}_rounds", rounds)
    return res, smi, lat, rounds


def peers_report(rep, tag, res, smi, lat, rounds, floor_name, nvml_only):
    rows = []
    fl = res.get(floor_name, {}).get("cpu_ms_per_s")
    floor_rss = res.get(nvml_only, {}).get("rss_mib_max")
    for n, r in res.items():
        lt = lat.get(n, [])
        rows.append([n, f3(r["cpu_pct"]), f3(r["cpu_ms_per_s"]),
                     f3(r["cpu_ms_per_s"] / fl, 2) if fl and r["cpu_ms_per_s"] is not None else "—",
                     f"{f3(r['rss_mib_end'], 1)} / {f3(r['rss_mib_max'], 1)}",
                     f3(r["rss_mib_max"] - floor_rss, 1) if floor_rss and r["rss_mib_max"] else "—",
                     r["threads"], f3(r["switches_per_s"], 1),
                     f"{f3(pct(lt, 50))} / {f3(pct(lt, 99))}" if lt else "—"])
    if smi["runs"]:
        w = res[next(iter(res))]["window_s"]
        rows.append(["nvidia-smi --query-gpu once a second", f3(smi["cpu_s"] / w * 100), f3(smi["cpu_s"] / w * 1e3),
                     f3(smi["cpu_s"] / w * 1e3 / fl, 2) if fl else "—", f"peak {smi['peak_rss_kib'] / 1024:.1f}",
                     "—", "—", "—", f"{smi['wall_s'] / smi['runs'] * 1e3:.1f} (wall per run)"])
    rep.table(["process", "CPU, % of one core", "CPU, ms/s", f"÷ {floor_name}", "RSS end / max, MiB",
               f"RSS max − {nvml_only}, MiB", "threads", "wake-ups/s (ctx switches)", "scrape p50 / p99, ms (1/s)"], rows)
    # What the resident memory is: anonymous, file-backed, and of the file-backed the
    # process's own executable, split by whether a page was used during the window.
    mrows = []
    for n, r in res.items():
        b = r.get("binary")
        mrows.append([n, f3(r.get("rss_anon_mib"), 1), f3(r.get("rss_file_mib"), 1),
                      f3(b["rss_kib"] / 1024, 2) if b else "—",
                      f3(b["referenced_kib"] / 1024, 2) if b else "—",
                      f3((b["rss_kib"] - b["referenced_kib"]) / 1024, 2) if b else "—"])
    rep.say("Resident memory at the end of the window, by kind (the executable's pages: resident, and"
            " of those used during the window — referenced bits cleared at its start — and not):")
    rep.table(["process", "anonymous, MiB", "file-backed, MiB", "its executable, MiB",
               "executable pages used in the window, MiB", "executable pages not used, MiB"], mrows)
    # Per-thread breakdown of the agent and the floors.
    for n, r in res.items():
        if n.startswith(("gpu-warden", "nvml_floor", "nvitop")):
            th = sorted(r["per_thread"].items(), key=lambda kv: -kv[1]["cpu_ms_per_s"])
            rep.say(f"{n} per thread: " + "; ".join(
                f"{k}×{v['threads']} {v['cpu_ms_per_s']:.3f} ms/s, {v['switches_per_s']:.1f} wake/s" for k, v in th))
            rep.say()
    # Cross-check: values read in the same second.
    names = [n for n in ("gpu-warden", "nvitop-exporter", "pynvml exporter", "nvidia-smi")]
    diffs = {n: [[], [], [], []] for n in names[1:]}
    for row in rounds:
        base = row.get("gpu-warden")
        if not base:
            continue
        for n in names[1:]:
            v = row.get(n)
            if not v:
                continue
            for i in range(4):
                if base[i] is not None and v[i] is not None:
                    diffs[n][i].append(abs(v[i] - base[i]))
    last = next((r for r in reversed(rounds) if all(r.get(n) for n in names)), None)
    xrows = []
    for n in names[1:]:
        xrows.append([n] + [f"{f3(statistics.median(d), 1)} / {f3(max(d), 1)} (n={len(d)})" if d else "—"
                            for d in diffs[n]])
    rep.say("Cross-check against gpu-warden, same second (|difference| median / max):")
    rep.table(["peer", "memory used, MiB", "GPU temperature, °C", "power, W", "SM clock, MHz"], xrows)
    if last:
        rep.say("Last full round: " + "; ".join(f"{n} {last[n]}" for n in names))
        rep.say()


def serve_pynvml(port):
    """`--serve-pynvml PORT`: the pynvml + prometheus_client exporter as teams write it, as a
    process of its own: every field every second (energy included), generate_latest per scrape."""
    class Quiet:
        def note(self, text):
            print(text, file=sys.stderr)
    nv.nvmlInit()
    ex = PyExporter(Quiet())
    prom.start_http_server(port, addr="127.0.0.1")
    nxt = time.monotonic()
    while True:
        ex.collect(True, True)
        nxt += 1.0
        time.sleep(max(0.0, nxt - time.monotonic()))


# The crowded GPU's CUDA processes. The run of 2026-12-01 asked hw/cuda_hold.py for 256 and
# got 99: `cuCtxCreate` returned 2 (CUDA_ERROR_OUT_OF_MEMORY) for the rest, although the GPU
# held only 52 GiB of its 141 (526 MiB per context) — not device memory running out. The
# holders were started 16 every 0.5 s without waiting, so up to ~150 contexts were being
# created at once; each context also opens its default 8 hardware work queues
# (CUDA_DEVICE_MAX_CONNECTIONS) and reserves its local-memory stack for every resident
# thread. The holder below (`--cuda-hold`) therefore: asks for one work queue
# (CUDA_DEVICE_MAX_CONNECTIONS=1) and lazy module loading; shrinks the context's stack,
# printf FIFO and malloc heap limits to the minimum before its one allocation; retries
# cuCtxCreate on OUT_OF_MEMORY (a transient of concurrent creation) with a back-off; and
# the harness starts them in waves (`--holder-wave`, waiting for each wave to be ready)
# and, when one still fails, records what might be the limit (host memory, the GPU's
# memory, locked-memory and process limits, a holder's RSS and GPU memory).

CUDA_HOLD_ENV = {"CUDA_MODULE_LOADING": "LAZY", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def cuda_hold(mib, seconds, retries=8):
    """`--cuda-hold MIB`: one minimal driver-API context on GPU 0 and one allocation of MIB,
    then sleep. Prints one JSON line: ready (with the attempts it took) or error."""
    import ctypes
    pid = os.getpid()
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(json.dumps({"event": "error", "call": "dlopen", "error": str(e), "pid": pid}), flush=True)
        return 1
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    rc = cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0)
    if rc:
        print(json.dumps({"event": "error", "call": "cuInit", "rc": rc, "pid": pid}), flush=True)
        return 1
    attempts, delay = 0, 0.2
    while True:
        attempts += 1
        rc = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        if rc == 0:
            break
        if rc != 2 or attempts > retries:
            print(json.dumps({"event": "error", "call": "cuCtxCreate", "rc": rc, "attempts": attempts,
                              "pid": pid}), flush=True)
            return 1
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
    # CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE: no kernel
    # ever runs here, so the smallest the driver accepts.
    limits = {}
    for name, limit, value in (("stack", 0, 16), ("printf_fifo", 1, 4096), ("malloc_heap", 2, 4096)):
        limits[name] = cu.cuCtxSetLimit(limit, ctypes.c_size_t(value))
    rc = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(1, mib) << 20))
    if rc:
        print(json.dumps({"event": "error", "call": "cuMemAlloc", "rc": rc, "pid": pid}), flush=True)
        return 1
    print(json.dumps({"event": "ready", "pid": pid, "attempts": attempts, "set_limit_rc": limits}), flush=True)
    time.sleep(seconds)
    return 0


def holder_state(p, path):
    try:
        s = open(path).read()
    except OSError:
        s = ""
    if '"ready"' in s:
        return "ready", s
    if '"error"' in s or p.poll() is not None:
        return "error", s
    return "starting", s


def crowd_limits(holders):
    """What may stop more contexts from being created: host and GPU memory, limits, and what
    one ready holder costs."""
    out = {}
    try:
        mi = dict(l.split(":", 1) for l in open("/proc/meminfo").read().splitlines() if ":" in l)
        out["host_mem_available_mib"] = int(mi["MemAvailable"].split()[0]) // 1024
        out["host_mem_total_mib"] = int(mi["MemTotal"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        import resource
        out["rlimit_memlock"] = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        out["rlimit_nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)
        out["rlimit_nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        pass
    for k, f in (("pid_max", "/proc/sys/kernel/pid_max"), ("overcommit_memory", "/proc/sys/vm/overcommit_memory"),
                 ("max_map_count", "/proc/sys/vm/max_map_count")):
        try:
            out[k] = open(f).read().strip()
        except OSError:
            pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                            "-i", "0"], capture_output=True, text=True, timeout=20)
        used, total = [int(x) for x in r.stdout.strip().split(",")[:2]]
        out["gpu_mem_used_mib"], out["gpu_mem_total_mib"] = used, total
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    ready = [p for p, path in holders if holder_state(p, path)[0] == "ready"]
    if ready:
        rss = [proc_status(p.pid).get("VmRSS_MiB") for p in ready[:16]]
        rss = [x for x in rss if x]
        if rss:
            out["holder_rss_mib_mean"] = round(sum(rss) / len(rss), 1)
        try:
            r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
            mine = {p.pid for p in ready}
            per = [int(l.split(",")[1]) for l in r.stdout.splitlines()
                   if l.strip() and int(l.split(",")[0]) in mine]
            if per:
                out["holder_gpu_mib_mean"] = round(sum(per) / len(per), 1)
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            pass
    return out


def holders_grow(rep, a, holders, n, timeout=240):
    """Starts holders until `n` run (or `timeout` passes): waves of `--holder-wave`, each
    waited for, so contexts are not all created at once; stops early when a whole wave
    fails."""
    t0 = time.monotonic()
    env = dict(os.environ, **CUDA_HOLD_ENV)
    wave = max(1, a.holder_wave)
    failed_wave = False
    while len(holders) < n and time.monotonic() - t0 < timeout and not failed_wave:
        batch = []
        for _ in range(min(wave, n - len(holders))):
            i = len(holders)
            path = os.path.join(a.workdir, f"hold-{i}.log")
            p = spawn([sys.executable, os.path.abspath(__file__), "--cuda-hold", "1"],
                      stdout=open(path, "w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
            holders.append((p, path))
            batch.append((p, path))
        while time.monotonic() - t0 < timeout:
            states = [holder_state(p, path)[0] for p, path in batch]
            if "starting" not in states:
                failed_wave = all(s == "error" for s in states)
                break
            time.sleep(0.2)
    while time.monotonic() - t0 < timeout:
        if all(holder_state(p, path)[0] != "starting" for p, path in holders):
            break
        time.sleep(0.5)
    states = [holder_state(p, path) for p, path in holders]
    ready = sum(1 for st, _ in states if st == "ready")
    errors = sum(1 for st, _ in states if st == "error")
    retried = 0
    for st, text in states:
        if st == "ready":
            try:
                retried += json.loads(text.strip().splitlines()[-1]).get("attempts", 1) > 1
            except (ValueError, IndexError):
                pass
    listed = gpu_process_count()
    took = time.monotonic() - t0
    rep.say(f"CUDA holders: {ready} ready ({retried} after a retry), {errors} failed, of {len(holders)} started "
            f"for {n}; the GPU lists {listed} processes ({took:.1f} s; waves of {wave})")
    limits = crowd_limits(holders)
    rep.put("crowded_holders", str(n), {"asked": n, "started": len(holders), "ready": ready, "errors": errors,
                                        "ready_after_retry": retried, "listed": listed, "seconds": round(took, 1),
                                        "limits": limits})
    rep.say("holder limits: " + ", ".join(f"{k} {v}" for k, v in limits.items()))
    if errors:
        bad = next((text for st, text in states if st == "error"), "")
        rep.note(f"a holder failed: {bad.strip()[-300:]}")
    rep.say()
    return listed


def holders_kill(holders):
    for p, _ in holders:
        try:
            p.kill()
        except OSError:
            pass
    for p, _ in holders:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    holders.clear()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        n = gpu_process_count()
        if n is None or n == 0:
            break
        time.sleep(0.5)


def floor_per_call(a, iterations):
    r = subprocess.run([a.floor, str(iterations), "--per-call"], capture_output=True, text=True, timeout=120)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(.+?): ([0-9.]+) µs mean over (\d+) calls", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out, r.stdout


def agent_argv(a, port, gpm_interval):
    argv = [a.agent, "--backend", "nvml", "--kube", "off", "--guard-mode", "off", "--poll-interval", "1s",
            "--listen", f"127.0.0.1:{port}"]
    if gpm_interval:
        argv += ["--gpm", "on", "--gpm-interval", gpm_interval]
    else:
        argv += ["--gpm", "off"]
    return argv


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith("GPU_WARDEN_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}


BASELINE = "gpu-warden, baseline build (--agent-baseline)"


def peers_plan(rep, a):
    """The issue-20 run: see the comment above."""
    holders = []
    logdir = a.workdir  # tails go to logs.txt when each process stops
    env = clean_env()
    nvt_env = dict(env)
    if a.nvitop_site:
        nvt_env["PYTHONPATH"] = a.nvitop_site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    sys_env = dict(env)
    sys_env.pop("PYTHONPATH", None)
    rep.say(f"## CUDA processes for the side-by-side phases ({a.peer_procs})")
    rep.say()
    holders_grow(rep, a, holders, a.peer_procs)
    ports = {"gpu-warden": free_port(), "nvitop-exporter": free_port(), "pynvml exporter": free_port()}
    peers = {}
    try:
        peers["nvitop-exporter"] = Proc("nvitop-exporter", [sys.executable, "-m", "nvitop_exporter", "--bind-address",
                                        "127.0.0.1", "--port", str(ports["nvitop-exporter"]), "--hostname", "h200",
                                        "--interval", "1.0"], env=nvt_env, logdir=logdir)
        wait_http(ports["nvitop-exporter"], "/metrics", 60, peers["nvitop-exporter"])
    except Exception as e:
        rep.note(f"nvitop-exporter did not start: {e}")
        peers.pop("nvitop-exporter", None)
        ports.pop("nvitop-exporter")
    try:
        peers["pynvml exporter"] = Proc("pynvml-exporter", [sys.executable, os.path.abspath(__file__), "--agent", "-",
                                        "--serve-pynvml", str(ports["pynvml exporter"])], env=sys_env, logdir=logdir)
        wait_http(ports["pynvml exporter"], "/metrics", 60, peers["pynvml exporter"])
    except Exception as e:
        rep.note(f"pynvml exporter did not start: {e}")
        peers.pop("pynvml exporter", None)
        ports.pop("pynvml exporter")
    for tag, gpm_iv, gpm_s in (("gpm_off", None, 0), ("gpm_10s", "10s", 10)):
        title = "GPM off" if not gpm_iv else f"GPM every {gpm_iv}"
        rep.say(f"## Side by side, {title}, {a.peer_procs} CUDA processes, {a.peer_seconds} s")
        rep.say()
        t0 = time.monotonic()
        procs = {}
        ports_b = {}
        agent = Proc(f"gpu-warden {tag}", agent_argv(a, ports["gpu-warden"], gpm_iv), env=env, logdir=logdir)
        fargs = ["--cadence", "--seconds", str(a.peer_seconds + 40), "--gpm-interval-s", str(gpm_s)]
        floor_x = Proc(f"nvml_floor {tag} +xid", [a.floor] + fargs + ["--xid"], env=env, logdir=logdir)
        floor_n = Proc(f"nvml_floor {tag}", [a.floor] + fargs, env=env, logdir=logdir)
        wait_http(ports["gpu-warden"], "/readyz", 30, agent)
        procs["gpu-warden"] = agent
        bases = []
        for k, (bpath, blabel, benv_extra) in enumerate(a.baselines):
            bport = free_port()
            benv = dict(env, **benv_extra)
            base = Proc(f"gpu-warden baseline{k or ''} {tag}", [bpath] + agent_argv(a, bport, gpm_iv)[1:], env=benv,
                        logdir=logdir)
            bases.append(base)
            try:
                wait_http(bport, "/readyz", 30, base)
                procs[blabel] = base
                ports_b[blabel] = bport
            except RuntimeError as e:
                rep.note(f"baseline agent {blabel}: {e}")
                continue
            if k in a.baseline_pageout:
                time.sleep(2)  # past start-up: a few polls and a scrape
                before = proc_status(base.p.pid).get("VmRSS_MiB")
                r = pageout_executable(base.p.pid)
                after = proc_status(base.p.pid).get("VmRSS_MiB")
                rep.say(f"{blabel}: executable paged out ({r} bytes advised): RSS {f3(before, 1)} → {f3(after, 1)} MiB")
                rep.say()
        procs["nvml_floor +xid (same calls, same cadence)"] = floor_x
        procs["nvml_floor, no XID wait"] = floor_n
        procs.update(peers)
        targets = dict(ports)
        targets.update(ports_b)
        scraper = Scraper(targets)
        scraper.start()
        time.sleep(3)  # a few polls and GPM windows before the window opens
        res, smi, lat, rounds = peers_window(rep, a, tag, procs, scraper, a.peer_seconds)
        scraper.stop()
        n1, s1 = poll_counters(ports["gpu-warden"])
        rep.put("peers", f"{tag}_agent_polls", [n1, s1])
        peers_report(rep, tag, res, smi, lat, rounds, "nvml_floor +xid (same calls, same cadence)",
                     "nvml_floor +xid (same calls, same cadence)")
        # /metrics under 64 concurrent scrapers (after the window, so it does not count in it).
        if a.scrape_load and tag == "gpm_10s":
            lrows = []
            for n, port in ports.items():
                for clients, per in ((1, 500), (64, 50)) if n == "gpu-warden" else ((64, 5),):
                    try:
                        r = subprocess.run([a.scrape_load, "--addr", f"127.0.0.1:{port}", "--path", "/metrics",
                                            "--clients", str(clients), "--requests-per-client", str(per)],
                                           capture_output=True, text=True, timeout=60)
                        j = json.loads(r.stdout.strip().splitlines()[-1])
                        rep.put("peers", f"scrape_{n}_{clients}", j)
                        lrows.append([n, f"{clients} × {per}", f3(j.get("p50_ms")), f3(j.get("p90_ms")),
                                      f3(j.get("p99_ms")), f3(j.get("max_ms")), j.get("errors"),
                                      j.get("bytes_per_response")])
                    except Exception as e:
                        rep.note(f"scrape_load {n} {clients}: {type(e).__name__}: {e}")
            rep.say("/metrics latency, compiled keep-alive client (examples/scrape_load.rs):")
            rep.table(["exporter", "clients × requests", "p50, ms", "p90, ms", "p99, ms", "max, ms", "errors",
                       "bytes"], lrows)
        agent.stop(rep)
        for base in bases:
            base.stop(rep)
        floor_x.stop(rep)
        floor_n.stop(rep)
        rep.say(f"_phase took {time.monotonic() - t0:.0f} s; {rep.elapsed():.0f} s since start_")
        rep.say()
        rep.save()
    for p in peers.values():
        p.stop(rep)
    crowded_phases(rep, a, holders, env, logdir)
    holders_kill(holders)



def crowded_phases(rep, a, holders, env, logdir):
    """The crowded GPU: for each count in `--crowded`, that many CUDA processes, the agent
    beside the floor at its cadence, then `nvml_floor --per-call`."""
    for n in a.crowded:
        if rep.elapsed() > a.deadline_seconds - 60:
            rep.note(f"skipped the {n}-process phase: {rep.elapsed():.0f} s elapsed")
            break
        rep.say(f"## Crowded GPU, {n} CUDA processes")
        rep.say()
        listed = holders_grow(rep, a, holders, n, timeout=a.holder_timeout)
        port = free_port()
        agent = Proc(f"gpu-warden crowded {n}", agent_argv(a, port, None), env=env, logdir=logdir)
        floor = Proc(f"nvml_floor crowded {n}", [a.floor, "--cadence", "--seconds", str(a.crowded_seconds + 60),
                                                  "--xid"], env=env, logdir=logdir)
        try:
            wait_http(port, "/readyz", 60, agent)
        except RuntimeError as e:
            rep.note(str(e))
        time.sleep(3)
        c0 = poll_counters(port)
        scraper = Scraper({"gpu-warden": port})
        scraper.start()
        res, smi, lat, rounds = peers_window(rep, a, f"crowded_{n}", {"gpu-warden": agent, "nvml_floor +xid": floor},
                                             scraper, a.crowded_seconds)
        scraper.stop()
        c1 = poll_counters(port)
        polls = c1[0] - c0[0] if c0[0] is not None and c1[0] is not None else None
        wall_ms = (c1[1] - c0[1]) / polls * 1e3 if polls else None
        pc, raw = floor_per_call(a, a.per_call_iterations if n <= 64 else max(5, a.per_call_iterations // 4))
        rep.put("crowded", f"{n}", {"listed": listed, "agent": res["gpu-warden"], "floor": res["nvml_floor +xid"],
                                    "agent_polls": polls, "agent_wall_per_poll_ms": wall_ms, "per_call_us": pc,
                                    "per_call_raw": raw})
        ag, fl = res["gpu-warden"], res["nvml_floor +xid"]
        rep.table(["process", "CPU, ms/s", "RSS max, MiB", "wake-ups/s", "wall per poll, ms"],
                  [["gpu-warden", f3(ag["cpu_ms_per_s"]), f3(ag["rss_mib_max"], 1), f3(ag["switches_per_s"], 1),
                    f3(wall_ms)],
                   ["nvml_floor --cadence --xid", f3(fl["cpu_ms_per_s"]), f3(fl["rss_mib_max"], 1),
                    f3(fl["switches_per_s"], 1), "—"],
                   ["ratio", f3(ag["cpu_ms_per_s"] / fl["cpu_ms_per_s"], 2) if fl["cpu_ms_per_s"] else "—", "", "",
                    ""]])
        for k in ("gpu-warden", "nvml_floor +xid"):
            th = sorted(res[k]["per_thread"].items(), key=lambda kv: -kv[1]["cpu_ms_per_s"])
            rep.say(f"{k} per thread: " + "; ".join(
                f"{t}×{v['threads']} {v['cpu_ms_per_s']:.3f} ms/s, {v['switches_per_s']:.1f} wake/s" for t, v in th))
            rep.say()
        rep.say("`nvml_floor --per-call` (µs per call, mean):")
        rep.table(["call", "µs"], [[k, f"{v:.1f}"] for k, v in sorted(pc.items(), key=lambda kv: -kv[1])])
        agent.stop(rep)
        floor.stop(rep)
        rep.save()


def crowded_plan(rep, a):
    """`--plan crowded`: only the crowded-GPU phases."""
    holders = []
    try:
        crowded_phases(rep, a, holders, clean_env(), a.workdir)
    finally:
        holders_kill(holders)


def scrape_modes_plan(rep, a):
    """`--plan scrape-modes`: three agents at once (GPM off) beside the floor at the same
    cadence, one scraped once a second on a new connection each time, one once a second on a
    kept-alive connection (as Prometheus does), one not scraped: what the HTTP side costs."""
    import threading
    env = clean_env()
    holders = []
    holders_grow(rep, a, holders, a.peer_procs)
    procs, ports = {}, {}
    for tag in ("new connection each scrape", "kept-alive connection", "not scraped"):
        ports[tag] = free_port()
        procs[f"gpu-warden, {tag}"] = Proc(f"gpu-warden {tag}", agent_argv(a, ports[tag], None), env=env,
                                           logdir=a.workdir)
    procs["nvml_floor --cadence --xid"] = Proc("nvml_floor", [a.floor, "--cadence", "--seconds",
                                               str(a.peer_seconds + 40), "--xid"], env=env, logdir=a.workdir)
    for tag, port in ports.items():
        wait_http(port, "/readyz", 30, procs[f"gpu-warden, {tag}"])
    stop_ev = threading.Event()
    lat = {"new": [], "keep": []}

    def new_conn():
        nxt = time.monotonic()
        while not stop_ev.is_set():
            try:
                lat["new"].append(http_get(ports["new connection each scrape"])[2] * 1e3)
            except OSError:
                pass
            nxt += 1.0
            stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def keep_alive():
        c = http.client.HTTPConnection("127.0.0.1", ports["kept-alive connection"], timeout=5)
        nxt = time.monotonic()
        while not stop_ev.is_set():
            try:
                t = time.perf_counter()
                c.request("GET", "/metrics")
                c.getresponse().read()
                lat["keep"].append((time.perf_counter() - t) * 1e3)
            except (OSError, http.client.HTTPException):
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", ports["kept-alive connection"], timeout=5)
            nxt += 1.0
            stop_ev.wait(max(0.0, nxt - time.monotonic()))
    ths = [threading.Thread(target=f, daemon=True) for f in (new_conn, keep_alive)]
    for t in ths:
        t.start()
    time.sleep(3)
    for p in procs.values():
        p.begin()
    end = time.monotonic() + a.peer_seconds
    while time.monotonic() < end:
        for p in procs.values():
            p.sample_rss()
        time.sleep(1.0)
    res = {n: p.end() for n, p in procs.items()}
    stop_ev.set()
    for t in ths:
        t.join(timeout=5)
    rep.put("scrape_modes", "procs", res)
    rep.put("scrape_modes", "latency_ms", {k: {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99)} for k, v in lat.items()})
    fl = res["nvml_floor --cadence --xid"]["cpu_ms_per_s"]
    rep.table(["process", "CPU, ms/s", "÷ floor", "RSS max, MiB", "wake-ups/s", "per thread (ms/s, wake-ups/s)"],
              [[n, f3(r["cpu_ms_per_s"]), f3(r["cpu_ms_per_s"] / fl, 2) if fl else "—", f3(r["rss_mib_max"], 1),
                f3(r["switches_per_s"], 1),
                "; ".join(f"{k}×{v['threads']} {v['cpu_ms_per_s']:.3f}, {v['switches_per_s']:.1f}"
                          for k, v in sorted(r["per_thread"].items(), key=lambda kv: -kv[1]["cpu_ms_per_s"]))]
               for n, r in res.items()])
    rep.say(f"scrape latency, ms (p50 / p99): new connection {f3(pct(lat['new'], 50))} / {f3(pct(lat['new'], 99))}; "
            f"kept alive {f3(pct(lat['keep'], 50))} / {f3(pct(lat['keep'], 99))}")
    rep.say()
    for p in procs.values():
        p.stop(rep)
    holders_kill(holders)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", required=True, help="target/dist/gpu-warden")
    ap.add_argument("--seconds", type=int, default=20, help="window of the 8/64-process phases (default 20)")
    ap.add_argument("--window-seconds", type=int, default=60,
                    help="window of the idle phase and of the fast-watch phase (RSS/CPU; default 60)")
    ap.add_argument("--procs", type=int, default=None, help="old form: --procs N means --procs-list 0,N")
    ap.add_argument("--procs-list", default=None, help="CUDA processes per phase (default 0,8,64)")
    ap.add_argument("--load-wait", type=float, default=90, help="longest wait for the loads to appear (default 90 s)")
    ap.add_argument("--floor", help="target/release/examples/nvml_floor (cargo build --release --example nvml_floor)")
    ap.add_argument("--floor-iterations", type=int, default=2000)
    ap.add_argument("--scrape-load", help="target/release/examples/scrape_load (cargo build --release --example scrape_load)")
    ap.add_argument("--scrape-runs", default="1x500,64x50", help="CLIENTSxREQUESTS_PER_CLIENT,... (default 1x500,64x50)")
    ap.add_argument("--double", help="target/release/apiserver-double (cargo build --release -p apiserver-double)")
    ap.add_argument("--pynvml-collections", type=int, default=200)
    ap.add_argument("--smi-runs", type=int, default=10)
    ap.add_argument("--deadline-seconds", type=float, default=290,
                    help="when the run is late, the fast-watch window shrinks (not below 20 s) and its control run "
                         "is dropped so the whole run ends about here (default 290)")
    ap.add_argument("--backend", choices=["nvml", "sim"], default="nvml",
                    help="sim: smoke test without a GPU (agent plays --scenario; load/NVML/nvidia-smi sections skipped)")
    ap.add_argument("--scenario", default=os.path.join(REPO, "examples", "a10g-timesliced.yaml"))
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT, else a temp dir)")
    ap.add_argument("--plan", choices=["issue7", "peers", "scrape-modes", "crowded"], default="issue7",
                    help="issue7: the per-poll run above; peers: issue 20's side-by-side run (nvitop-exporter, "
                         "the pynvml exporter, nvidia-smi, the floor at the agent's cadence, GPM off and 10 s, "
                         "64 scrapers, the crowded GPU)")
    ap.add_argument("--peer-procs", type=int, default=2, help="CUDA processes during the side-by-side phases")
    ap.add_argument("--peer-seconds", type=int, default=75, help="window of each side-by-side phase")
    ap.add_argument("--crowded", default="64,256", help="CUDA processes of the crowded phases")
    ap.add_argument("--crowded-seconds", type=int, default=20)
    ap.add_argument("--holder-wave", type=int, default=16,
                    help="CUDA holders started at once in the crowded phases; each wave is waited for (default 16)")
    ap.add_argument("--holder-timeout", type=float, default=240,
                    help="longest wait for the crowded phase's holders (default 240 s)")
    ap.add_argument("--per-call-iterations", type=int, default=100)
    ap.add_argument("--nvitop-site", default=None, help="folder holding nvitop and nvitop_exporter (PYTHONPATH of "
                    "nvitop-exporter alone)")
    ap.add_argument("--agent-baseline", action="append", default=[], help="(repeatable) ""a second gpu-warden build run beside --agent in the "
                    "side-by-side phases (e.g. main's release profile)")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="N:NAME=VALUE",
                    help="environment of the Nth --agent-baseline only (0-based; repeatable), e.g. "
                         "0:GPU_WARDEN_RUNTIME_WORKERS=2 with the same binary as --agent: the old two-worker runtime")
    ap.add_argument("--baseline-label", action="append", default=[],
                    help="the Nth baseline's name in the tables (repeatable, in --agent-baseline order)")
    ap.add_argument("--baseline-pageout", action="append", type=int, default=[], metavar="N",
                    help="run the Nth --agent-baseline from a private copy and page its executable out once "
                         "it is ready (process_madvise MADV_PAGEOUT; repeatable)")
    ap.add_argument("--serve-pynvml", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cuda-hold", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cuda-hold-seconds", type=float, default=900, help=argparse.SUPPRESS)
    if "--cuda-hold" in sys.argv:
        # A holder process: nothing else of the harness (no --agent needed).
        i = sys.argv.index("--cuda-hold")
        sys.exit(cuda_hold(int(sys.argv[i + 1]), 900))
    a = ap.parse_args()
    if a.serve_pynvml is not None:
        serve_pynvml(a.serve_pynvml)
        return
    a.crowded = [int(x) for x in a.crowded.split(",") if x.strip()]
    a.baselines = []
    for k, path in enumerate(a.agent_baseline):
        label = a.baseline_label[k] if k < len(a.baseline_label) else (BASELINE if k == 0 else f"{BASELINE} {k}")
        extra = {}
        for item in a.baseline_env:
            n, _, kv = item.partition(":")
            if n.isdigit() and int(n) == k and "=" in kv:
                extra.update([kv.split("=", 1)])
        a.baselines.append((os.path.abspath(path), label, extra))
    if a.procs_list is None:
        a.procs_list = f"0,{a.procs}" if a.procs is not None else "0,8,64"
    procs_list = sorted({int(x) for x in a.procs_list.split(",") if x.strip()})
    a.out = a.out or tempfile.mkdtemp(prefix="perf-h200-")
    os.makedirs(a.out, exist_ok=True)
    a.workdir = tempfile.mkdtemp(prefix="perf-h200-work-")
    for k in a.baseline_pageout:
        # A private copy: pages shared with another running copy are not paged out.
        if 0 <= k < len(a.baselines):
            path, label, extra = a.baselines[k]
            copy = os.path.join(a.workdir, f"gpu-warden-pageout{k}")
            shutil.copy2(path, copy)
            a.baselines[k] = (copy, label, extra)
    for name in ("agent", "scrape_load", "double", "floor", "nvitop_site"):
        v = getattr(a, name)
        if v:
            setattr(a, name, os.path.abspath(v))

    rep = Report(a.out)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    loads = Loads(a, rep)
    try:
        if a.plan == "peers":
            rep.say("# gpu-warden beside its peers (issue 20)")
            rep.say()
            section(rep, "info", "Setup", info_section, rep, a)
            section(rep, "peers", "Peers, floor, scrapers, crowded GPU", peers_plan, rep, a)
            return
        if a.plan == "crowded":
            rep.say("# gpu-warden on a crowded GPU (issue 20)")
            rep.say()
            section(rep, "info", "Setup", info_section, rep, a)
            section(rep, "crowded_plan", f"Crowded GPU: {a.crowded} CUDA processes", crowded_plan, rep, a)
            return
        if a.plan == "scrape-modes":
            rep.say("# gpu-warden: what the HTTP side costs (issue 20)")
            rep.say()
            section(rep, "info", "Setup", info_section, rep, a)
            section(rep, "scrape_modes", f"Three agents, {a.peer_seconds} s, GPM off", scrape_modes_plan, rep, a)
            return
        rep.say("# gpu-warden performance run (issue 7)")
        rep.say()
        section(rep, "info", "Setup", info_section, rep, a)
        first = True
        for n in procs_list:
            seconds = a.window_seconds if n == 0 else a.seconds
            title = (f"Agent, idle GPU ({seconds} s window)" if n == 0 else
                     f"Agent, {n} CUDA processes ({seconds} s window)")
            r = section(rep, f"procs_{n}", title, agent_phase, rep, a, loads, n, seconds, first)
            if r is not None:
                first = False
        if loads.procs:
            t0 = time.monotonic()
            left = loads.kill()
            rep.say(f"loads stopped in {time.monotonic() - t0:.1f} s; GPU compute processes now: {left}")
            rep.say()
        # Fast watch: shrink the window if the run is late, so it ends near --deadline-seconds.
        reserve = 25 if a.backend == "nvml" else 2  # pynvml + nvidia-smi + floor
        left = a.deadline_seconds - rep.elapsed() - reserve - 8
        window = a.window_seconds
        if left < window:
            window = max(20 if a.backend == "nvml" else 2, int(left))
        control = a.seconds if left - window - 8 >= a.seconds else 0
        if window != a.window_seconds:
            rep.note(f"run is late ({rep.elapsed():.0f} s): the fast-watch window is {window} s, not {a.window_seconds}")
        section(rep, "fast_watch", f"Agent with the guard's fast memory watch ({window} s window)",
                fast_watch_section, rep, a, window, control)
        section(rep, "pynvml", "Python exporter (pynvml + prometheus_client)", pynvml_section, rep, a)
        section(rep, "nvidia_smi", "nvidia-smi --query-gpu", smi_section, rep, a)
        section(rep, "floor", "NVML floor (examples/nvml_floor.rs)", floor_section, rep, a)
        section(rep, "summary", "Summary", summary_section, rep, a)
        section(rep, "ratios", "Ratios", ratios_section, rep, a)
    except KeyboardInterrupt as e:
        rep.note(f"interrupted ({e}); partial results kept")
    finally:
        try:
            loads.kill() if loads.procs else None
        except Exception:
            pass
        stop_all()
        rep.say(f"Total {rep.elapsed():.0f} s. Files: {os.path.join(a.out, 'perf.md')}, perf.json, logs.txt")
        rep.data["timing_s"]["total"] = round(rep.elapsed(), 1)
        rep.save()
        shutil.rmtree(a.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
