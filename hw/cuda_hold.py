#!/usr/bin/env python3
"""A minimal CUDA process for the crowded-GPU phases (issue 20): one driver-API context on
GPU 0 through ctypes (no PyTorch: 256 PyTorch processes would not fit in host or GPU
memory), one small allocation, then it sleeps until killed. Prints one JSON line
(`ready` or `error`).

    cuda_hold.py [--mib 1] [--seconds 900]
"""
import ctypes
import json
import os
import sys
import time


def main():
    mib = int(sys.argv[sys.argv.index("--mib") + 1]) if "--mib" in sys.argv else 1
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 900
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        for name, call in (("cuInit", lambda: cu.cuInit(0)),
                           ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                           ("cuCtxCreate", lambda: cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)),
                           ("cuMemAlloc", lambda: cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)))):
            rc = call()
            if rc != 0:
                print(json.dumps({"event": "error", "call": name, "rc": rc, "pid": os.getpid()}), flush=True)
                return 1
    except OSError as e:
        print(json.dumps({"event": "error", "call": "dlopen", "error": str(e), "pid": os.getpid()}), flush=True)
        return 1
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
