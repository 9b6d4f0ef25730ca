#!/usr/bin/env python3
"""First real-GPU cost figures for gpu-warden (issue 7, partial): per-poll wall and CPU,
resident memory, /metrics latency, against nvidia-smi and a pynvml collection of the same
fields. Prints a markdown table.

    python3 scripts/perf_h200.py --agent target/release/gpu-warden --seconds 30 --procs 8
"""
import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time

import pynvml as nv

HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def scrape(port, path="/metrics"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    t = time.perf_counter()
    c.request("GET", path)
    body = c.getresponse().read()
    c.close()
    return time.perf_counter() - t, body


def metric(body, name):
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def latency(port, workers, per_worker):
    out = []
    lock = threading.Lock()

    def run():
        mine = [scrape(port)[0] for _ in range(per_worker)]
        with lock:
            out.extend(mine)
    ts = [threading.Thread(target=run) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.sort()
    return out[len(out) // 2] * 1000, out[int(len(out) * 0.99) - 1] * 1000


def pynvml_collection(h):
    nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    nv.nvmlDeviceGetUtilizationRates(h)
    nv.nvmlDeviceGetEncoderUtilization(h)
    nv.nvmlDeviceGetDecoderUtilization(h)
    nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    nv.nvmlDeviceGetPowerUsage(h)
    nv.nvmlDeviceGetTotalEnergyConsumption(h)
    nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
    nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
    nv.nvmlDeviceGetPcieReplayCounter(h)
    nv.nvmlDeviceGetFieldValues(h, [82, 142, 143, 144, 145])
    nv.nvmlDeviceGetComputeRunningProcesses(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", required=True)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--floor", help="target/release/examples/nvml_floor (cargo build --release --example nvml_floor)")
    a = ap.parse_args()
    rows = []
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    loads = []
    for phase, nprocs in (("idle", 0), (f"{a.procs} processes", a.procs)):
        while len(loads) < nprocs:
            loads.append(subprocess.Popen([sys.executable, os.path.join(HERE, "gpu_load.py"), "--hold-gib", "1",
                                           "--seconds", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if nprocs:
            deadline = time.time() + 60
            while len(nv.nvmlDeviceGetComputeRunningProcesses(h)) < nprocs and time.time() < deadline:
                time.sleep(0.2)
        port = 19500 + nprocs
        agent = subprocess.Popen([a.agent, "--backend", "nvml", "--kube", "off", "--listen", f"127.0.0.1:{port}",
                                  "--poll-interval", "1s", "--guard-mode", "off"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        c0, t0 = cpu_s(agent.pid), time.time()
        _, b0 = scrape(port)
        time.sleep(a.seconds)
        c1, t1 = cpu_s(agent.pid), time.time()
        _, b1 = scrape(port)
        polls = metric(b1, "gpu_warden_poll_duration_seconds_count") - metric(b0, "gpu_warden_poll_duration_seconds_count")
        poll_s = metric(b1, "gpu_warden_poll_duration_seconds_sum") - metric(b0, "gpu_warden_poll_duration_seconds_sum")
        p50_1, p99_1 = latency(port, 1, 200)
        p50_64, p99_64 = latency(port, 64, 20)
        rows.append((phase, polls, poll_s / polls * 1000, (c1 - c0) / (t1 - t0) * 100, (c1 - c0) / polls * 1000,
                     rss_mib(agent.pid), p50_1, p99_1, p50_64, p99_64))
        agent.terminate()
        agent.wait()
    # pynvml collection of the same fields, and nvidia-smi per collection.
    n = 200
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        pynvml_collection(h)
    py_wall, py_cpu = (time.perf_counter() - t) / n * 1000, (time.process_time() - c) / n * 1000
    q = ("index,uuid,pci.bus_id,name,driver_version,memory.total,memory.used,memory.free,memory.reserved,"
         "utilization.gpu,utilization.memory,utilization.encoder,utilization.decoder,temperature.gpu,"
         "temperature.memory,power.draw,clocks.current.sm,clocks.current.memory")
    smi = []
    for _ in range(10):
        t = time.perf_counter()
        subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True)
        smi.append((time.perf_counter() - t) * 1000)
    for p in loads:
        p.kill()
    print("| phase | polls | gpu-warden wall per poll, ms | CPU, % of one core | CPU per poll, ms | RSS, MiB | /metrics p50 / p99, 1 client, ms | p50 / p99, 64 clients, ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.0f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.1f} | {r[6]:.2f} / {r[7]:.2f} | {r[8]:.2f} / {r[9]:.2f} |")
    print()
    print(f"pynvml, the same fields per collection (1 GPU): {py_wall:.3f} ms wall, {py_cpu:.3f} ms CPU (mean of {n})")
    print(f"nvidia-smi --query-gpu (18 fields) per collection: median {statistics.median(smi):.1f} ms wall (10 runs)")
    if a.floor:
        for extra in ([], ["--with-slow-counters"]):
            out = subprocess.run([a.floor, "2000"] + extra, capture_output=True, text=True)
            print(out.stdout.strip() or out.stderr.strip())


if __name__ == "__main__":
    main()
