#!/usr/bin/env python3
"""A CUDA process for gpu-warden's real-hardware scripts.

Holds some VRAM, optionally keeps the SMs busy with bf16 matmuls, optionally grows its
VRAM at a fixed rate, and reports every CUDA out-of-memory error it meets (one JSON line
per event on stdout), so the guard scripts can count OOMs seen by each process.

    gpu_load.py --hold-gib 16 --compute --seconds 30
    gpu_load.py --hold-gib 1 --grow-gib-per-s 16 --chunk-mib 256 --seconds 20
"""
import argparse
import json
import os
import sys
import time

import torch


def log(event, **kw):
    kw.update(event=event, pid=os.getpid(), t=time.time())
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--hold-gib", type=float, default=1.0)
    ap.add_argument("--compute", action="store_true", help="keep the SMs busy")
    ap.add_argument("--matmul", type=int, default=4096, help="matmul size when computing")
    ap.add_argument("--grow-gib-per-s", type=float, default=0.0)
    ap.add_argument("--grow-max-gib", type=float, default=1e9)
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--start-delay", type=float, default=0.0,
                    help="seconds between \"ready\" (or, with --go-file, the go) and the growth")
    ap.add_argument("--go-file", help="after \"ready\", wait until this file exists: jobs launched "
                    "together then start their growth --start-delay apart, however long each took "
                    "to come up (CUDA start-up varies by a second and more)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--exit-on-oom", action="store_true")
    ap.add_argument("--release-s", type=float, default=0.02,
                    help="with --workspace-gib: how long each step runs without its workspace")
    ap.add_argument("--workspace-hold-s", type=float, default=0.0,
                    help="with --workspace-gib: keep computing with the workspace held for at least this "
                         "long each step (e.g. 0.15 with --release-s 0.15: a 10 GiB workspace every 0.3 s, "
                         "issue 38's trainer)")
    ap.add_argument("--workspace-gib", type=float, default=0.0,
                    help="with --compute: allocate this much afresh every step (and release it to "
                         "the driver), as a training step's activations would; an OOM here is what "
                         "a neighbour of a greedy job dies of")
    a = ap.parse_args()

    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    held = []
    try:
        n = int(a.hold_gib * (1 << 30))
        if n > 0:
            held.append(torch.empty(n, dtype=torch.uint8, device=dev))
            held[-1].fill_(1)
    except torch.cuda.OutOfMemoryError as e:
        log("oom", phase="hold", error=str(e)[:200])
        if a.exit_on_oom:
            sys.exit(3)
    torch.cuda.synchronize()
    log("ready", held_gib=a.hold_gib)
    if a.go_file:
        # Bounded: a harness that died before the go leaves no job waiting for ever.
        given_up = time.time() + 120
        while not os.path.exists(a.go_file) and time.time() < given_up:
            time.sleep(0.005)
    time.sleep(a.start_delay)
    log("go", start_delay=a.start_delay)

    x = y = None
    if a.compute:
        x = torch.randn(a.matmul, a.matmul, dtype=torch.bfloat16, device=dev)
        y = torch.randn(a.matmul, a.matmul, dtype=torch.bfloat16, device=dev)

    start = time.time()
    grown = 0.0
    chunk = a.chunk_mib << 20
    ooms = 0
    while time.time() - start < a.seconds:
        if a.grow_gib_per_s > 0 and grown < a.grow_max_gib:
            due = min(a.grow_max_gib, a.grow_gib_per_s * (time.time() - start))
            while grown + a.chunk_mib / 1024 <= due:
                try:
                    t = torch.empty(chunk, dtype=torch.uint8, device=dev)
                    t.fill_(1)
                    held.append(t)
                    grown += a.chunk_mib / 1024
                except torch.cuda.OutOfMemoryError as e:
                    ooms += 1
                    log("oom", phase="grow", grown_gib=grown, error=str(e)[:200])
                    if a.exit_on_oom:
                        sys.exit(3)
                    time.sleep(0.05)
                    break
        if a.compute:
            try:
                ws = None
                if a.workspace_gib > 0:
                    ws = torch.empty(int(a.workspace_gib * (1 << 30)), dtype=torch.uint8, device=dev)
                    ws.fill_(2)
                held_from = time.time()
                while True:
                    for _ in range(8):
                        z = x @ y
                    torch.cuda.synchronize()
                    if ws is None or time.time() - held_from >= a.workspace_hold_s:
                        break
                del z
                if ws is not None:
                    del ws
                    torch.cuda.empty_cache()
                    # The step's non-allocating phase (optimizer step, data loading): the
                    # workspace is back with the driver, and a neighbour can take it.
                    time.sleep(a.release_s)
            except torch.cuda.OutOfMemoryError as e:
                ooms += 1
                log("oom", phase="compute", error=str(e)[:200])
                torch.cuda.empty_cache()
                if a.exit_on_oom:
                    sys.exit(3)
                time.sleep(0.01)
        else:
            time.sleep(0.005)
    log("done", grown_gib=grown, ooms=ooms)


if __name__ == "__main__":
    main()
