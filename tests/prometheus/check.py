#!/usr/bin/env python3
"""PromQL assertions against a real Prometheus server that scrapes gpu-warden
(tests/prometheus/run.sh starts both). Exits non-zero on the first failed check."""
import json
import sys
import time
import urllib.parse
import urllib.request

PROM = sys.argv[1]
failures = []


def query(q):
    url = f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (f"  ({detail})" if detail and not ok else ""))
    if not ok:
        failures.append(name)


def wait_for(q, seconds=40):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if query(q):
                return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


check("target is up", wait_for('up{job="gpu-warden"} == 1'))
check("first DCGM sample ingested", wait_for("DCGM_FI_DEV_FB_USED"))

LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
expected = {
    "DCGM_FI_DEV_FB_USED": {"0": 4096 + 2048 + 1024, "1": 8192},
    "DCGM_FI_DEV_FB_FREE": {"0": 23028 - 434 - 7168, "1": 23028 - 434 - 8192},
    "DCGM_FI_DEV_GPU_TEMP": {"0": 47, "1": 53},
    "DCGM_FI_DEV_POWER_USAGE": {"0": 212.5, "1": 98.25},
}
for family, values in expected.items():
    res = query(family)
    check(f"{family} has one series per GPU", len(res) == 2, f"{len(res)} series")
    for s in res:
        m = s["metric"]
        extra = set(m) - set(LABELS) - {"__name__", "job", "instance"}
        check(f"{family} gpu={m.get('gpu')} carries dcgm-exporter's labels", all(l in m for l in LABELS) and not extra, str(m))
        check(f"{family} gpu={m.get('gpu')} Hostname", m.get("Hostname") == "ci-node-1", m.get("Hostname"))
        check(f"{family} gpu={m.get('gpu')} modelName", m.get("modelName") == "NVIDIA A10G", m.get("modelName"))
        check(f"{family} gpu={m.get('gpu')} device", m.get("device") == f"nvidia{m.get('gpu')}", m.get("device"))
        check(f"{family} gpu={m.get('gpu')} driver", m.get("DCGM_FI_DRIVER_VERSION") == "580.95.05")
        want = values.get(m.get("gpu"))
        got = float(s["value"][1])
        check(f"{family} gpu={m.get('gpu')} == {want}", want is not None and abs(got - want) < 1e-9, f"got {got}")

# NVIDIA dashboard 12239's temperature panel.
res = query("avg(DCGM_FI_DEV_GPU_TEMP)")
check("avg(DCGM_FI_DEV_GPU_TEMP) answers 50", len(res) == 1 and abs(float(res[0]["value"][1]) - 50.0) < 1e-9, str(res))
res = query('sum(DCGM_FI_DEV_POWER_USAGE{Hostname="ci-node-1"})')
check("sum of power by Hostname", len(res) == 1 and abs(float(res[0]["value"][1]) - 310.75) < 1e-9, str(res))
# The energy counter grows and rate() works on it.
check("energy counter rate is ~power", wait_for("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s]) > 0", 20))

# Profiling families (NVML GPM on Hopper and newer): only GPU 1 has them. NVIDIA dashboard
# 12239's "Tensor Core Utilization" panel queries DCGM_FI_PROF_PIPE_TENSOR_ACTIVE with its
# instance/gpu template variables (".*" when "All" is picked).
prof = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.83,
    "DCGM_FI_PROF_SM_ACTIVE": 0.76,
    "DCGM_FI_PROF_SM_OCCUPANCY": 0.4,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.7,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.08,
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 1.2e9,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 3.4e8,
}
for family, want in prof.items():
    res = query(family)
    ok = len(res) == 1 and res[0]["metric"].get("gpu") == "1" and abs(float(res[0]["value"][1]) - want) < 1e-9
    check(f"{family} only on GPU 1 == {want}", ok, str(res))
for family in ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE"):
    res = query(family)
    check(f"{family} left out of the scenario: no series", res == [], str(res))
for q in ('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~".*", gpu=~".*"}',
          'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~".*", gpu=~"1"}'):
    res = query(q)
    ok = len(res) == 1 and abs(float(res[0]["value"][1]) - 0.7) < 1e-9
    check(f"dashboard 12239 Tensor Core Utilization: {q} answers 0.7", ok, str(res))
    if res:
        m = res[0]["metric"]
        extra = set(m) - set(LABELS) - {"__name__", "job", "instance"}
        check("  ... with dcgm-exporter's labels", all(l in m for l in LABELS) and not extra, str(m))
        check("  ... for GPU-6666…", m.get("UUID") == "GPU-66666666-7777-8888-9999-000000000000"
              and m.get("pci_bus_id") == "00000000:00:1F.0" and m.get("device") == "nvidia1"
              and m.get("modelName") == "NVIDIA A10G" and m.get("Hostname") == "ci-node-1"
              and m.get("DCGM_FI_DRIVER_VERSION") == "580.95.05", str(m))
res = query("avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)")
check("avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) answers 0.7 (a GPU without GPM does not drag it to 0.35)",
      len(res) == 1 and abs(float(res[0]["value"][1]) - 0.7) < 1e-9, str(res))
res = query('avg by (Hostname) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) * 100')
check("tensor activity in percent by Hostname", len(res) == 1 and res[0]["metric"].get("Hostname") == "ci-node-1"
      and abs(float(res[0]["value"][1]) - 70.0) < 1e-9, str(res))
check("tensor activity gauge over time", wait_for("avg_over_time(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE[5s]) > 0.69", 20))

# Per-container families: the sum per GPU equals the per-process sum; host processes
# (no pod) appear with empty pod labels.
res = query("sum by (gpu) (gpu_warden_container_gpu_memory_used_bytes)")
sums = {s["metric"]["gpu"]: float(s["value"][1]) for s in res}
res = query("sum by (gpu) (gpu_warden_process_gpu_memory_used_bytes)")
psums = {s["metric"]["gpu"]: float(s["value"][1]) for s in res}
check("container sum == process sum per GPU", sums == psums and len(sums) == 2, f"{sums} vs {psums}")
check("container sum GPU 0 == 7 GiB", sums.get("0") == 7168 * 2**20, str(sums))
res = query('gpu_warden_container_gpu_memory_used_bytes{namespace="ci",pod="job-1",container="build"}')
check("pod job-1 container build holds 6 GiB", len(res) == 1 and float(res[0]["value"][1]) == 6144 * 2**20, str(res))
res = query('gpu_warden_container_gpu_memory_used_bytes{pod=""}')
check("host process has empty pod labels", len(res) == 1 and float(res[0]["value"][1]) == 1024 * 2**20, str(res))
res = query('gpu_warden_process_gpu_memory_used_bytes{pid="102"}')
check("hostile process name survives escaping", len(res) == 1 and res[0]["metric"].get("process_name") == "evil\nname", str(res))
res = query('gpu_warden_container_gpu_sm_utilization_ratio{pod="job-1"}')
check("container SM utilization 0.5", len(res) == 1 and abs(float(res[0]["value"][1]) - 0.5) < 1e-9, str(res))
# Self metrics.
check("poll duration histogram", bool(query("gpu_warden_poll_duration_seconds_count > 0")))
check("build info", bool(query("gpu_warden_build_info == 1")))
# The agent's own process, as Prometheus's Go client names them.
check("resident memory > 0", bool(query("process_resident_memory_bytes > 0")))
check("started within the last hour", bool(query("time() - process_start_time_seconds < 3600")))
check("open fds within the limit", bool(query("process_open_fds > 0 and process_open_fds <= process_max_fds")))
check("cpu seconds never reset", bool(query("resets(process_cpu_seconds_total[1m]) == 0")))

print(f"{'PASS' if not failures else 'FAIL'}: {len(failures)} failed")
sys.exit(1 if failures else 0)
