#!/usr/bin/env python3
"""Hardware check for issue 39: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL against `nvidia-smi nvlink`.

gpu-warden reads NVML's NVLink data counters (NVLINK_THROUGHPUT_DATA_TX + _RX, scopeId
UINT_MAX: the sum over all links, through crates/nvml-scoped) and exports their sum in KiB.
`nvidia-smi nvlink -gt d` lists the same counters per link ("Link N: Data Tx: X KiB"). This
runs the agent with the NVML backend, then, for every GPU, reads both twice around an
interval (idle, or with --load running, e.g. a peer-to-peer copy between two GPUs) and
compares:

  - the absolute figure: agent vs the sum of nvidia-smi's per-link Tx + Rx (the reads are not
    simultaneous, so they may differ by what moved in between: within --tolerance of the
    larger, or within --slack-kib);
  - the change over the interval (the rate dashboards plot), same tolerance;
  - a GPU where nvidia-smi lists no link has no series (absent, not 0).

Also records the agent's poll duration with and without NVLink traffic (the field-values call
is made every full poll; its cost on an H200 has not been measured yet).

    cargo build --profile dist
    python3 hw/nvlink_h200.py --agent target/dist/gpu-warden --out "$OUT" \
        [--load "python3 -c 'import torch; a = torch.empty(1 << 30, dtype=torch.uint8, device=\"cuda:0\"); [a.to(\"cuda:1\") for _ in range(200)]; torch.cuda.synchronize()'"]

    # plumbing only, no GPU: the simulated 8 x H100 (no nvidia-smi comparison)
    python3 hw/nvlink_h200.py --agent target/debug/gpu-warden --backend sim \
        --scenario examples/h100x8.yaml --interval 2

Prints a markdown table; exit status 1 on a mismatch. Not run yet: no H200 was available in
the session that wrote it (issue 39); a later session records its output in docs/validation.md.
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

FAMILY = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
SERIES = re.compile(r'^' + FAMILY + r'\{([^}]*)\}\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SMI_GPU = re.compile(r'^GPU (\d+):')
SMI_LINK = re.compile(r'Link (\d+): Data (Tx|Rx): (\d+) KiB')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    """{gpu index: KiB} from the agent's /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in body.splitlines():
        m = SERIES.match(line)
        if m:
            labels = dict(LABEL.findall(m.group(1)))
            out[int(labels["gpu"])] = float(m.group(2))
    return out, body


def poll_seconds(body):
    """Mean full-poll duration so far, from the agent's histogram."""
    total = count = None
    for line in body.splitlines():
        if line.startswith("gpu_warden_poll_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("gpu_warden_poll_duration_seconds_count"):
            count = float(line.split()[-1])
    return total / count if total is not None and count else None


def smi():
    """{gpu index: (KiB Tx+Rx summed over links, links listed)} from nvidia-smi."""
    text = subprocess.run(["nvidia-smi", "nvlink", "-gt", "d"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    out, gpu = {}, None
    for line in text.splitlines():
        m = SMI_GPU.match(line.strip())
        if m:
            gpu = int(m.group(1))
            out[gpu] = (0, set())
            continue
        for link, _kind, kib in SMI_LINK.findall(line):
            if gpu is not None:
                total, links = out[gpu]
                links.add(int(link))
                out[gpu] = (total + int(kib), links)
    return {g: (kib, len(links)) for g, (kib, links) in out.items()}


def close(a, b, tol, slack):
    return abs(a - b) <= max(slack, tol * max(abs(a), abs(b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default="target/dist/gpu-warden")
    ap.add_argument("--backend", default="nvml", choices=["nvml", "sim"])
    ap.add_argument("--scenario", help="with --backend sim")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between the two reads")
    ap.add_argument("--load", help="a command run in the interval (NVLink traffic)")
    ap.add_argument("--tolerance", type=float, default=0.02, help="relative, of the larger figure")
    ap.add_argument("--slack-kib", type=float, default=64 * 1024, help="absolute, KiB")
    ap.add_argument("--out", help="folder for the raw scrapes and nvidia-smi output")
    a = ap.parse_args()

    port = free_port()
    cmd = [a.agent, "--backend", a.backend, "--kube", "off", "--listen", f"127.0.0.1:{port}",
           "--poll-interval", "1s", "--pod-resources", "off"]
    if a.scenario:
        cmd += ["--scenario", a.scenario]
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    load = None
    try:
        deadline = time.time() + 30
        while True:
            try:
                before, _ = scrape(port)
                break
            except OSError:
                if time.time() > deadline or agent.poll() is not None:
                    sys.exit(f"the agent did not start: {agent.stderr.read().decode()[-2000:]}")
                time.sleep(0.2)
        time.sleep(1.5)  # a full poll after readiness
        sim = a.backend == "sim"
        before, body0 = scrape(port)
        smi0 = {} if sim else smi()
        if a.load:
            load = subprocess.Popen(a.load, shell=True, start_new_session=True)
        time.sleep(a.interval)
        after, body1 = scrape(port)
        smi1 = {} if sim else smi()
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            for name, text in (("metrics-before.txt", body0), ("metrics-after.txt", body1)):
                with open(os.path.join(a.out, name), "w") as f:
                    f.write(text)
    finally:
        for p in (load, agent):
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)

    bad = []
    print(f"| GPU | links (nvidia-smi) | agent KiB | nvidia-smi KiB | agent Δ KiB/s | nvidia-smi Δ KiB/s | verdict |")
    print("|---|---|---|---|---|---|---|")
    gpus = sorted(set(before) | set(after) | set(smi0))
    for g in gpus:
        rate = (after.get(g, 0) - before.get(g, 0)) / a.interval if g in after and g in before else None
        links = smi1.get(g, (None, 0))[1] if not sim else "-"
        verdict = "ok"
        if sim:
            if g not in after:
                verdict = "no series"
        elif smi1.get(g, (0, 0))[1] == 0:
            verdict = "ok (no NVLink, no series)" if g not in after else "MISMATCH: a series on a GPU without NVLink"
        elif g not in after:
            verdict = "MISMATCH: no series on a GPU with NVLink"
        else:
            smi_rate = (smi1[g][0] - smi0[g][0]) / a.interval
            if not close(after[g], smi1[g][0], a.tolerance, a.slack_kib):
                verdict = "MISMATCH: absolute"
            elif not close(rate, smi_rate, a.tolerance, a.slack_kib / a.interval):
                verdict = "MISMATCH: rate"
        if verdict.startswith("MISMATCH"):
            bad.append(g)
        smi_abs = smi1.get(g, ("-",))[0] if not sim else "-"
        smi_rate = (f"{(smi1[g][0] - smi0[g][0]) / a.interval:.0f}"
                    if not sim and g in smi0 and g in smi1 else "-")
        print(f"| {g} | {links} | {after.get(g, '-')} | {smi_abs} | "
              f"{'-' if rate is None else f'{rate:.0f}'} | {smi_rate} | {verdict} |")
    p0, p1 = poll_seconds(body0), poll_seconds(body1)
    print(f"\nmean full poll: {p0 and p0 * 1e3:.3f} ms before, {p1 and p1 * 1e3:.3f} ms after (cumulative means)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
