#!/usr/bin/env python3
"""Compare gpu-warden's exposition with nvidia-smi (and pynvml for the figures
nvidia-smi's CSV query cannot give), field by field and process by process.

    compare_nvidia_smi.py METRICS.txt SMI_GPU.csv SMI_APPS.csv [NVML.json] > table.md

Exit status 1 when a figure differs beyond its tolerance or a family is missing
without being unsupported by NVML on that GPU.
"""
import csv
import json
import re
import sys

LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(path):
    series = []
    for line in open(path):
        if line.startswith('#') or not line.strip():
            continue
        m = LINE.match(line.strip())
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(3) or ''))
        series.append((m.group(1), labels, float(m.group(4))))
    return series


def num(s):
    s = s.strip().split(' ')[0]
    try:
        return float(s)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def main():
    metrics = parse_metrics(sys.argv[1])
    gpus = list(csv.DictReader(open(sys.argv[2]), skipinitialspace=True))
    apps = list(csv.DictReader(open(sys.argv[3]), skipinitialspace=True))
    nvml = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else {}

    def ours(name, gpu):
        for n, l, v in metrics:
            if n == name and l.get('gpu') == str(gpu):
                return v
        return None

    # (family, nvidia-smi column or nvml key, tolerance(abs), note)
    checks = [
        ('DCGM_FI_DEV_FB_USED', 'memory.used [MiB]', 64, 'MiB'),
        ('DCGM_FI_DEV_FB_FREE', 'memory.free [MiB]', 64, 'MiB'),
        ('DCGM_FI_DEV_FB_RESERVED', 'memory.reserved [MiB]', 1, 'MiB'),
        ('DCGM_FI_DEV_GPU_TEMP', 'temperature.gpu', 3, '°C'),
        ('DCGM_FI_DEV_MEMORY_TEMP', 'temperature.memory', 3, '°C'),
        ('DCGM_FI_DEV_POWER_USAGE', 'power.draw [W]', None, 'W (±20 %)'),
        ('DCGM_FI_DEV_SM_CLOCK', 'clocks.current.sm [MHz]', None, 'MHz (±15 %)'),
        ('DCGM_FI_DEV_MEM_CLOCK', 'clocks.current.memory [MHz]', None, 'MHz (±15 %)'),
        ('DCGM_FI_DEV_GPU_UTIL', 'utilization.gpu [%]', 30, '% (sampling windows differ)'),
        ('DCGM_FI_DEV_MEM_COPY_UTIL', 'utilization.memory [%]', 30, '%'),
        ('DCGM_FI_DEV_ENC_UTIL', 'utilization.encoder [%]', 5, '%'),
        ('DCGM_FI_DEV_DEC_UTIL', 'utilization.decoder [%]', 5, '%'),
        ('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION', 'nvml:energy_mj', None, 'mJ (± 2 s of power)'),
        ('DCGM_FI_DEV_PCIE_REPLAY_COUNTER', 'nvml:pcie_replay', 0, 'count'),
        ('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', 'nvml:remap_cor', 0, 'rows'),
        ('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', 'nvml:remap_unc', 0, 'rows'),
        ('DCGM_FI_DEV_ROW_REMAP_FAILURE', 'nvml:remap_failure', 0, '0/1'),
        ('DCGM_FI_DEV_XID_ERRORS', 'nvml:xid', 0, 'last XID (0 = none since start)'),
    ]
    failed = 0
    print('| GPU | family | gpu-warden | reference | source | verdict |')
    print('|---|---|---|---|---|---|')
    for g in gpus:
        idx = int(g['index'])
        ref_nvml = nvml.get(str(idx), {})
        for fam, col, tol, unit in checks:
            mine = ours(fam, idx)
            if col.startswith('nvml:'):
                ref = ref_nvml.get(col[5:])
                src = 'pynvml'
            else:
                ref = num(g.get(col, ''))
                src = 'nvidia-smi'
            if mine is None and ref is None:
                verdict = 'absent in both (not supported)'
            elif mine is None:
                verdict = 'MISSING'
                failed += 1
            elif ref is None:
                verdict = 'no reference'
            else:
                if fam == 'DCGM_FI_DEV_POWER_USAGE' or 'CLOCK' in fam:
                    frac = 0.2 if 'POWER' in fam else 0.15
                    ok = abs(mine - ref) <= max(frac * ref, 5)
                elif fam == 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION':
                    watts = ours('DCGM_FI_DEV_POWER_USAGE', idx) or 700
                    ok = abs(mine - ref) <= watts * 1000 * 3
                else:
                    ok = abs(mine - ref) <= tol
                verdict = 'ok' if ok else 'DIFFERS'
                failed += 0 if ok else 1
            fmt = lambda v: '—' if v is None else ('%g' % v)
            print(f'| {idx} | {fam} | {fmt(mine)} | {fmt(ref)} | {src} | {verdict} ({unit}) |')
    print()
    print('| pid | GPU | gpu-warden MiB | nvidia-smi MiB | verdict |')
    print('|---|---|---|---|---|')
    uuid_to_idx = {g['uuid']: int(g['index']) for g in gpus}
    per_proc = {(l.get('pid'), l.get('gpu')): v for n, l, v in metrics
                if n == 'gpu_warden_process_gpu_memory_used_bytes'}
    for a in apps:
        pid = a['pid']
        idx = uuid_to_idx.get(a['gpu_uuid'])
        ref = num(a['used_gpu_memory [MiB]'])
        mine = per_proc.get((pid, str(idx)))
        mine_mib = None if mine is None else mine / (1 << 20)
        ok = mine_mib is not None and ref is not None and abs(mine_mib - ref) <= 2
        failed += 0 if ok else 1
        print(f"| {pid} | {idx} | {'—' if mine_mib is None else '%.0f' % mine_mib} | {ref} | {'ok' if ok else 'DIFFERS'} |")
    total = {}
    for (pid, gpu), v in per_proc.items():
        total[gpu] = total.get(gpu, 0) + v
    containers = {}
    for n, l, v in metrics:
        if n == 'gpu_warden_container_gpu_memory_used_bytes':
            containers[l['gpu']] = containers.get(l['gpu'], 0) + v
    print()
    for gpu in sorted(total):
        same = abs(total[gpu] - containers.get(gpu, -1)) < 1
        failed += 0 if same else 1
        print(f"GPU {gpu}: sum over processes {total[gpu]/(1<<20):.0f} MiB, sum over containers "
              f"{containers.get(gpu, 0)/(1<<20):.0f} MiB: {'equal' if same else 'DIFFERENT'}")
    print()
    print('RESULT:', 'PASS' if failed == 0 else f'FAIL ({failed} mismatches)')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
