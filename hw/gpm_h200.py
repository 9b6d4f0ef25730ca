#!/usr/bin/env python3
"""Hardware evidence for issue 9: DCGM_FI_PROF_* from NVML GPM, on a Hopper GPU (H200).

Runs the release agent with the NVML backend and reads DCGM_FI_PROF_* from /metrics under
four loads on one GPU — idle, a saturating bf16 matmul, a device-memory copy loop and a
host-to-device copy loop (PCIe) — beside two references: pynvml's raw GPM values and units
(nvmlGpmMetricsGet, when the installed nvidia-ml-py has it) and `nvidia-smi dmon
--gpm-metrics`. Also times GPM's per-poll cost (gpu_warden_poll_duration_seconds with
GPU_WARDEN_GPM=off vs on), and runs the agent as a non-root user to see whether GPM works
without root. Prints a markdown report; raw data goes to --out.

    cargo build --profile dist
    python3 hw/gpm_h200.py --agent target/dist/gpu-warden --out "$OUT"

Every child runs in its own process group and is killed on exit (normal, error, SIGTERM);
every wait has a timeout; --budget bounds the whole run (phases past it are skipped).
"""
import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

FAMILIES = [
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, "GRAPHICS_UTIL"),
    ("DCGM_FI_PROF_SM_ACTIVE", 2, "SM_UTIL"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", 3, "SM_OCCUPANCY"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 5, "ANY_TENSOR_UTIL"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 10, "DRAM_BW_UTIL"),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", 11, "FP64_UTIL"),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", 12, "FP32_UTIL"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 13, "FP16_UTIL"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", 20, "PCIE_TX_PER_SEC"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", 21, "PCIE_RX_PER_SEC"),
]
SHORT = {f: f.replace("DCGM_FI_PROF_", "") for f, _, _ in FAMILIES}
H200_DRAM_PEAK = 4.8e12  # bytes/s, NVIDIA's H200 SXM figure

CHILDREN = []
START = time.time()


# ---------------------------------------------------------------- process hygiene

def spawn(cmd, log_path=None, env=None, stdout=None):
    """Starts a child in its own process group; stderr (and stdout unless piped) to log_path."""
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    p = subprocess.Popen(cmd, stdout=stdout if stdout is not None else log, stderr=log, env=env,
                         start_new_session=True)
    CHILDREN.append(p)
    return p


def stop(p, grace=5.0):
    if p is None or p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def cleanup():
    for p in reversed(CHILDREN):
        stop(p, grace=2.0)


atexit.register(cleanup)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, lambda s, f: sys.exit(128 + s))


def over_budget(a, need):
    left = a.budget - (time.time() - START)
    if left < need:
        print(f"<!-- skipped: {left:.0f} s of budget left, {need:.0f} s needed -->", flush=True)
        return True
    return False


# ---------------------------------------------------------------- loads (child mode)

def run_load(kind, device, seconds):
    """Child process: one load on one GPU; prints one JSON line per second with the rate
    it achieved (the load's own figure, to compare the GPM readings with)."""
    import torch
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    end = time.time() + seconds
    if kind == "matmul":
        n = 8192
        a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        c = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
        per, unit = 2 * n ** 3, "flop/s"
        step = lambda: torch.matmul(a, b, out=c)  # noqa: E731
        batch = 20
    elif kind == "copy":
        nbytes = 4 << 30
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
        dst = torch.empty_like(src)
        per, unit = 2 * nbytes, "B/s (DRAM read+write)"
        step = lambda: dst.copy_(src)  # noqa: E731
        batch = 10
    elif kind == "h2d":
        nbytes = 1 << 30
        src = torch.empty(nbytes, dtype=torch.uint8).pin_memory().fill_(1)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        per, unit = nbytes, "B/s (host to device)"
        step = lambda: dst.copy_(src, non_blocking=True)  # noqa: E731
        batch = 4
    else:
        raise SystemExit(f"unknown load {kind}")
    torch.cuda.synchronize()
    print(json.dumps({"event": "ready", "unit": unit}), flush=True)
    while time.time() < end:
        t0, done = time.perf_counter(), 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(batch):
                step()
            torch.cuda.synchronize()
            done += batch
        dt = time.perf_counter() - t0
        print(json.dumps({"event": "rate", "t": time.time(), "rate": per * done / dt, "unit": unit}), flush=True)


class Load:
    """A load child and the rates it reports."""

    def __init__(self, a, kind):
        self.kind, self.rates, self.unit, self.ready = kind, [], "", threading.Event()
        self.p = None
        if kind == "idle":
            self.ready.set()
            return
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self.p = spawn([sys.executable, os.path.abspath(__file__), "--load", kind, "--device", str(a.device),
                        "--seconds", str(int(a.seconds + a.warmup + 60))], env=env, stdout=subprocess.PIPE,
                       log_path=os.path.join(a.out, f"load-{kind}.log"))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self.unit = ev.get("unit", self.unit)
            if ev.get("event") == "ready":
                self.ready.set()
            elif ev.get("event") == "rate":
                self.rates.append((ev["t"], ev["rate"]))

    def wait_ready(self, timeout):
        # Poll in short steps: a child that died (a bad argument, no GPU) ends the wait at once.
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.ready.wait(0.2):
                break
            if self.p is not None and self.p.poll() is not None:
                return False
        return self.ready.is_set() and (self.p is None or self.p.poll() is None)

    def rate_between(self, t0, t1):
        r = [v for t, v in self.rates if t0 <= t <= t1 + 1.0]
        return statistics.median(r) if r else None

    def stop(self):
        stop(self.p)


# ---------------------------------------------------------------- agent and scraping

def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url, timeout=3.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def start_agent(a, name, env_extra=None, prefix=None, binary=None):
    port = free_port()
    env = dict(os.environ, **(env_extra or {}))
    cmd = (prefix or []) + [binary or a.agent, "--backend", a.backend, "--kube", "off", "--listen", f"127.0.0.1:{port}",
                            "--poll-interval", "1s", "--guard-mode", "off", "--annotations", "off",
                            "--node-name", "gpm-h200", "--log", "info,gpu_warden=debug"]
    if a.backend == "sim":
        cmd += ["--scenario", a.scenario]
    p = spawn(cmd, log_path=os.path.join(a.out, f"agent-{name}.log"), env=env)
    deadline = time.time() + 30
    while time.time() < deadline:
        if p.poll() is not None:
            return p, port, False
        try:
            get(f"http://127.0.0.1:{port}/readyz", 1.0)
            return p, port, True
        except Exception:
            time.sleep(0.2)
    return p, port, False


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        lab = {}
        for kv in labels.rstrip("}").split('",'):
            if "=" in kv:
                k, v = kv.split("=", 1)
                lab[k] = v.strip('"')
        try:
            out.setdefault(name, []).append((lab, float(value)))
        except ValueError:
            pass
    return out


def scrape(port):
    try:
        return parse_metrics(get(f"http://127.0.0.1:{port}/metrics"))
    except Exception as e:
        print(f"<!-- scrape failed: {e} -->", flush=True)
        return {}


def prof_of(m, gpu):
    v = {}
    for fam in SHORT:
        for lab, val in m.get(fam, []):
            if lab.get("gpu") == str(gpu):
                v[fam] = val
    return v


def poll_stats(m):
    s = m.get("gpu_warden_poll_duration_seconds_sum", [({}, 0.0)])[0][1]
    c = m.get("gpu_warden_poll_duration_seconds_count", [({}, 0.0)])[0][1]
    return s, c


# ---------------------------------------------------------------- references

class PynvmlGpm:
    """Raw GPM values and units through pynvml, over consecutive windows."""

    def __init__(self, index, enabled=True):
        self.ok, self.why, self.units = False, "", {}
        if not enabled:
            self.why = "not with the sim backend"
            return
        try:
            import pynvml as nv
            self.nv = nv
            nv.nvmlInit()
            self.h = nv.nvmlDeviceGetHandleByIndex(index)
            if not hasattr(nv, "nvmlGpmMetricsGet"):
                self.why = "this nvidia-ml-py has no nvmlGpmMetricsGet"
                return
            sup = nv.nvmlGpmQueryDeviceSupport(self.h)
            if not getattr(sup, "isSupportedDevice", 0):
                self.why = "nvmlGpmQueryDeviceSupport: not supported"
                return
            self.ok = True
        except Exception as e:  # no pynvml, no driver, …
            self.why = f"pynvml: {e!r}"

    def sample(self):
        s = self.nv.nvmlGpmSampleAlloc()
        self.nv.nvmlGpmSampleGet(self.h, s)
        return s

    def metrics(self, s1, s2):
        nv = self.nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(FAMILIES)
        mg.sample1, mg.sample2 = s1, s2
        for i, (_, mid, _) in enumerate(FAMILIES):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        out = {}
        for i, (fam, _, _) in enumerate(FAMILIES):
            m = mg.metrics[i]
            if m.nvmlReturn == 0:
                out[fam] = m.value
                try:
                    u = m.metricInfo.unit
                    self.units[fam] = u.decode() if isinstance(u, bytes) else str(u)
                except Exception:
                    pass
        return out

    def windows(self, seconds, stop_at):
        """Medians of raw values over 1 s windows until stop_at."""
        vals = {}
        prev = self.sample()
        while time.time() < stop_at:
            time.sleep(1.0)
            cur = self.sample()
            for k, v in self.metrics(prev, cur).items():
                vals.setdefault(k, []).append(v)
            self.nv.nvmlGpmSampleFree(prev)
            prev = cur
        self.nv.nvmlGpmSampleFree(prev)
        return {k: statistics.median(v) for k, v in vals.items()}

    def cost_ms(self, n=100):
        nv = self.nv
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        t = time.perf_counter()
        for _ in range(n):
            nv.nvmlGpmSampleGet(self.h, s1)
        sample_ms = (time.perf_counter() - t) / n * 1000
        nv.nvmlGpmSampleGet(self.h, s2)
        t = time.perf_counter()
        for _ in range(n):
            self.metrics(s1, s2)
        get_ms = (time.perf_counter() - t) / n * 1000
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)
        return sample_ms, get_ms


def dmon(index, count, out_path):
    """nvidia-smi dmon with GPM metrics: raw text, and per-column medians when parseable."""
    ids = ",".join(str(mid) for _, mid, _ in FAMILIES)
    cmd = ["nvidia-smi", "dmon", "-i", str(index), "-c", str(count), "-d", "1", "--gpm-metrics", ids]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=count + 20)
        text = r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        text = f"{' '.join(cmd)}: {e!r}"
    open(out_path, "w").write(text)
    names, rows = None, []
    for line in text.splitlines():
        if line.startswith("#") and names is None:
            names = line.lstrip("#").split()
        elif line.strip() and not line.startswith("#"):
            rows.append(line.split())
    med = {}
    if names and rows:
        for i, n in enumerate(names):
            try:
                med[n] = statistics.median(float(r[i]) for r in rows if len(r) > i and r[i] not in ("-", "N/A"))
            except (ValueError, statistics.StatisticsError):
                pass
    return text, med


# ---------------------------------------------------------------- the run

def measure(a, port, load, ref):
    """Warm up, then read /metrics every second for a.seconds (medians), with pynvml GPM
    and nvidia-smi dmon running over the same window."""
    time.sleep(a.warmup)
    t0 = time.time()
    stop_at = t0 + a.seconds
    ref_out, dmon_out = {}, {}

    def run_ref():
        try:
            ref_out.update(ref.windows(a.seconds, stop_at))
        except Exception as e:
            ref_out["error"] = repr(e)

    def run_dmon():
        text, med = dmon(a.device, int(max(3, a.seconds - 2)), os.path.join(a.out, f"dmon-{load.kind}.txt"))
        dmon_out.update(text=text, med=med)

    threads = []
    if ref.ok:
        threads.append(threading.Thread(target=run_ref, daemon=True))
    if a.backend == "nvml" and shutil.which("nvidia-smi"):
        threads.append(threading.Thread(target=run_dmon, daemon=True))
    for t in threads:
        t.start()
    vals = {}
    while time.time() < stop_at:
        time.sleep(1.0)
        for k, v in prof_of(scrape(port), a.device).items():
            vals.setdefault(k, []).append(v)
    for t in threads:
        t.join(timeout=a.seconds + 30)
    agent = {k: statistics.median(v) for k, v in vals.items()}
    return agent, ref_out, dmon_out, load.rate_between(t0, stop_at)


def fmt(fam, v):
    if v is None:
        return "—"
    if fam.startswith("DCGM_FI_PROF_PCIE"):
        return f"{v:.3g}"
    return f"{v:.3f}"


def non_root(a, load_kind):
    """The agent as uid/gid 65532 (no groups, no capabilities) with a copy of the binary in
    a world-readable directory. Returns (verdict, prof, log tail)."""
    if os.geteuid() != 0:
        prefix, binary, tmp = [], a.agent, None
        how = f"already non-root (uid {os.geteuid()})"
    else:
        tmp = tempfile.mkdtemp(prefix="gpm-nonroot-")
        os.chmod(tmp, 0o755)
        binary = os.path.join(tmp, "gpu-warden")
        shutil.copy2(a.agent, binary)
        os.chmod(binary, 0o755)
        if shutil.which("setpriv"):
            prefix = ["setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", "--inh-caps=-all", "--"]
            how = "setpriv --reuid=65532 --regid=65532 --clear-groups --inh-caps=-all"
        else:
            prefix = ["runuser", "-u", "nobody", "--"]
            how = "runuser -u nobody"
    p, port, ready = start_agent(a, "nonroot", prefix=prefix, binary=binary)
    prof = {}
    if ready:
        time.sleep(4)
        prof = prof_of(scrape(port), a.device)
    stop(p)
    log = open(os.path.join(a.out, "agent-nonroot.log"), errors="replace").read()
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    tail = "\n".join(l for l in log.splitlines() if "GPM" in l or "gpm" in l or "error" in l.lower())[-2000:]
    verdict = ("agent did not become ready" if not ready else
               f"{len(prof)} DCGM_FI_PROF_* families on GPU {a.device} during the {load_kind} load")
    return how, verdict, prof, tail


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default="target/dist/gpu-warden")
    ap.add_argument("--device", type=int, default=0, help="NVML index = CUDA index (PCI bus order)")
    ap.add_argument("--seconds", type=float, default=10, help="measured window per load")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--cost-seconds", type=int, default=15, help="per GPM on/off cost window")
    ap.add_argument("--loads", default="idle,matmul,copy,h2d")
    ap.add_argument("--budget", type=float, default=480, help="seconds for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpm-h200-"))
    ap.add_argument("--backend", default="nvml", choices=["nvml", "sim"], help="sim: plumbing smoke test only")
    ap.add_argument("--scenario", default="tests/prometheus/scenario.yaml", help="with --backend sim")
    ap.add_argument("--load", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.load:
        run_load(a.load, a.device, a.seconds)
        return
    os.makedirs(a.out, exist_ok=True)
    a.agent = os.path.abspath(a.agent)
    results = {"args": vars(a)}
    print("# GPM on the H200: DCGM_FI_PROF_* evidence (hw/gpm_h200.py)\n")
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id", "--format=csv,noheader"],
                ["sh", "-c", "ls -l /dev/nvidia* 2>&1 | head -8; grep -i -E 'profiling|RmProfilingAdminOnly' "
                 "/proc/driver/nvidia/params 2>&1"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            print("```\n$ " + " ".join(cmd) + "\n" + (r.stdout + r.stderr).strip() + "\n```")
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"`{cmd[0]}`: {e!r}")
    ref = PynvmlGpm(a.device, enabled=a.backend == "nvml")
    print(f"\npynvml GPM reference: {'yes' if ref.ok else 'no (' + ref.why + ')'}\n")

    # 1. Per-poll cost, idle: GPM off, then on (sequential, so the two never contend).
    cost = {}
    for mode in ("off", "on"):
        if over_budget(a, a.cost_seconds + 40):
            break
        p, port, ready = start_agent(a, f"cost-gpm-{mode}", env_extra={"GPU_WARDEN_GPM": mode})
        if not ready:
            print(f"agent (GPM {mode}) did not become ready; see {a.out}/agent-cost-gpm-{mode}.log")
            stop(p)
            continue
        time.sleep(2)
        s0, c0 = poll_stats(scrape(port))
        time.sleep(a.cost_seconds)
        m = scrape(port)
        s1, c1 = poll_stats(m)
        cost[mode] = {"polls": c1 - c0, "ms_per_poll": (s1 - s0) / max(c1 - c0, 1) * 1000,
                      "prof_families": len(prof_of(m, a.device))}
        stop(p)
    results["cost"] = cost
    print("## Per-poll cost (idle, all GPUs of the machine, --poll-interval 1s)\n")
    print("| GPU_WARDEN_GPM | polls | wall per full poll, ms | DCGM_FI_PROF_* families on GPU |")
    print("|---|---|---|---|")
    for mode, c in cost.items():
        print(f"| {mode} | {c['polls']:.0f} | {c['ms_per_poll']:.3f} | {c['prof_families']} |")
    if "on" in cost and "off" in cost:
        print(f"\nGPM adds {cost['on']['ms_per_poll'] - cost['off']['ms_per_poll']:.3f} ms per full poll.")
    try:
        first = [l for l in open(os.path.join(a.out, "agent-cost-gpm-on.log"), errors="replace")
                 if "GPM" in l and ("first GPM figures" in l or "NoPermission" in l or "unit" in l)]
        if first:
            print("\nThe agent's own log (raw NVML values and units at its first GPM window):\n")
            print("```\n" + "".join(first[-3:]).strip() + "\n```")
    except OSError:
        pass
    if ref.ok:
        try:
            sm, gm = ref.cost_ms()
            results["pynvml_cost_ms"] = {"sample_get": sm, "metrics_get": gm}
            print(f"pynvml: nvmlGpmSampleGet {sm:.3f} ms, nvmlGpmMetricsGet (10 metrics) {gm:.3f} ms (mean of 100).")
        except Exception as e:
            print(f"pynvml cost: {e!r}")

    # 2. Loads, with one agent (GPM on) across them.
    p, port, ready = start_agent(a, "loads")
    if not ready:
        print(f"\nagent did not become ready for the loads; see {a.out}/agent-loads.log")
        json.dump(results, open(os.path.join(a.out, "results.json"), "w"), indent=1, default=str)
        sys.exit(1)
    rows, nonroot = [], None
    for kind in [k for k in a.loads.split(",") if k]:
        if over_budget(a, a.seconds + a.warmup + 60):
            break
        load = Load(a, kind)
        if not load.wait_ready(90):
            print(f"\nload {kind} did not start; see {a.out}/load-{kind}.log")
            load.stop()
            continue
        agent, raw, dm, rate = measure(a, port, load, ref)
        rows.append((kind, agent, raw, dm, rate, load.unit))
        if kind == "matmul" and a.backend == "nvml" and not over_budget(a, 45):
            nonroot = non_root(a, kind)
        load.stop()
    stop(p)
    results["loads"] = [{"load": k, "agent": ag, "pynvml_raw": raw, "dmon_median": dm.get("med"), "load_rate": r,
                         "load_unit": u} for k, ag, raw, dm, r, u in rows]
    results["pynvml_units"] = getattr(ref, "units", {})

    print("\n## DCGM_FI_PROF_* by load (GPU %d, medians over %d s after %.0f s warm-up)\n" % (a.device, a.seconds, a.warmup))
    print("| load | source | " + " | ".join(SHORT[f] for f, _, _ in FAMILIES) + " | the load's own rate |")
    print("|---|---|" + "---|" * len(FAMILIES) + "---|")
    for kind, agent, raw, dm, rate, unit in rows:
        own = f"{rate:.3g} {unit}" if rate else "—"
        print(f"| {kind} | gpu-warden /metrics | " + " | ".join(fmt(f, agent.get(f)) for f, _, _ in FAMILIES) + f" | {own} |")
        if raw and "error" not in raw:
            print(f"| {kind} | pynvml GPM, raw | " + " | ".join(fmt("raw", raw.get(f)) for f, _, _ in FAMILIES) + " | |")
        elif raw:
            print(f"| {kind} | pynvml GPM | {raw['error']} |" + " |" * len(FAMILIES))
    if results["pynvml_units"]:
        print("\nUnits NVML reports (metricInfo.unit): " +
              ", ".join(f"{n}={results['pynvml_units'].get(f, '?')!r}" for f, _, n in FAMILIES))
    for kind, _, _, dm, _, _ in rows:
        if dm.get("text"):
            print(f"\n<details><summary>nvidia-smi dmon --gpm-metrics, {kind}</summary>\n\n```\n{dm['text'][-3000:]}\n```\n</details>")

    # 3. Verdicts the issue asks for, computed, not eyeballed.
    by = {k: (ag, raw, r) for k, ag, raw, _, r, _ in rows}
    checks = []

    def chk(name, ok, detail):
        checks.append((name, ok, detail))

    tensor = lambda k: by.get(k, ({},))[0].get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")  # noqa: E731
    dram = lambda k: by.get(k, ({},))[0].get("DCGM_FI_PROF_DRAM_ACTIVE")  # noqa: E731
    if tensor("matmul") is not None and tensor("idle") is not None:
        chk("bf16 matmul: PIPE_TENSOR_ACTIVE well above idle (>= 0.3 and >= idle + 0.25)",
            tensor("matmul") >= 0.3 and tensor("matmul") >= tensor("idle") + 0.25,
            f"matmul {tensor('matmul'):.3f}, idle {tensor('idle'):.3f}")
    if dram("copy") is not None:
        own = by["copy"][2]
        chk("device copy: DRAM_ACTIVE high (>= 0.5)", dram("copy") >= 0.5,
            f"{dram('copy'):.3f}; the loop moved {own or 0:.3g} B/s = {(own or 0) / H200_DRAM_PEAK:.2f} of 4.8 TB/s")
    for k, (ag, raw, _) in by.items():
        ratios = [v for f, v in ag.items() if not f.startswith("DCGM_FI_PROF_PCIE")]
        if ratios:
            chk(f"{k}: every ratio within 0..1", all(0 <= v <= 1 for v in ratios), f"max {max(ratios):.3f}")
        if raw and "error" not in raw:
            diffs = [abs(ag[f] - raw[f] / 100) for f, _, _ in FAMILIES
                     if f in ag and f in raw and not f.startswith("DCGM_FI_PROF_PCIE")]
            if diffs:
                chk(f"{k}: exported ratio == raw GPM percent / 100 (within 0.05; different windows)",
                    max(diffs) <= 0.05, f"max |diff| {max(diffs):.3f}")
            pd = [(ag[f], raw[f] * 1048576) for f, _, _ in FAMILIES if f in ag and f in raw and f.startswith("DCGM_FI_PROF_PCIE")]
            if pd:
                chk(f"{k}: exported PCIe bytes/s == raw GPM x 1048576 (within 2x; different windows)",
                    all(max(x, y) <= 2 * max(min(x, y), 1e6) for x, y in pd), str([f"{x:.3g} vs {y:.3g}" for x, y in pd]))
    if "h2d" in by and by["h2d"][2]:
        rx, own = by["h2d"][0].get("DCGM_FI_PROF_PCIE_RX_BYTES"), by["h2d"][2]
        if rx is not None:
            chk("host-to-device loop: PCIE_RX_BYTES ~ the bytes/s the loop moved (0.7x..1.5x: headers)",
                0.7 * own <= rx <= 1.5 * own, f"exported {rx:.3g} B/s, loop {own:.3g} B/s")
    print("\n## Checks\n")
    for name, ok, detail in checks:
        print(f"- {'PASS' if ok else 'FAIL'} — {name}: {detail}")
    results["checks"] = [{"check": n, "ok": o, "detail": d} for n, o, d in checks]

    if nonroot:
        how, verdict, prof, tail = nonroot
        results["non_root"] = {"how": how, "verdict": verdict, "prof": prof, "log": tail}
        print(f"\n## Non-root\n\n`{how}`: {verdict}.")
        if prof:
            print("PIPE_TENSOR_ACTIVE as non-root: " + fmt("x", prof.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")))
        print(f"\n```\n{tail or '(no GPM lines in the log)'}\n```")
    json.dump(results, open(os.path.join(a.out, "results.json"), "w"), indent=1, default=str)
    print(f"\nRaw data: {a.out} (results.json, agent-*.log, load-*.log, dmon-*.txt). Run took {time.time() - START:.0f} s.")


if __name__ == "__main__":
    main()
