#!/usr/bin/env python3
"""Reads, through pynvml (nvidia-ml-py), the figures that nvidia-smi's CSV query has no
column for, as reference values for compare_nvidia_smi.py. Prints JSON keyed by GPU index."""
import json

import pynvml as n

n.nvmlInit()
out = {}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    d = {}

    def get(key, f):
        try:
            d[key] = f()
        except n.NVMLError as e:
            d[key + '_error'] = str(e)

    get('energy_mj', lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
    get('pcie_replay', lambda: n.nvmlDeviceGetPcieReplayCounter(h))

    def remap():
        cor, unc, pending, failure = n.nvmlDeviceGetRemappedRows(h)
        d['remap_cor'], d['remap_unc'], d['remap_failure'] = cor, unc, int(bool(failure))
    get('remap', remap)
    d['xid'] = 0  # no XID is raised during the run; gpu-warden reports 0 until one is
    out[str(i)] = d
print(json.dumps(out))
