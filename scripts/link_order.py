#!/usr/bin/env python3
"""The link order of the agent's code: which functions a running agent executes, laid out
together by the linker so that the pages it touches are few (docs/performance.md,
"Resident memory").

Why: a release binary holds about 11 MiB of code, and the ~1.4 MiB a running agent executes
is spread over it. The kernel maps file pages 64 KiB at a time around each first touch
(fault-around), so the scattered functions kept about 6 MiB of the binary resident; packed
together they fit in well under 2 MiB. `build.rs` hands `link/hot-symbols.txt` to lld
(`--symbol-ordering-file`) for `dist` builds (`cargo build --profile dist`) of the `gpu-warden` binary.

    # record what runs (valgrind's callgrind; about 2 minutes), write link/hot-symbols.txt:
    python3 scripts/link_order.py record --agent target/dist/gpu-warden \\
        --double target/release/apiserver-double --ran-on-gpu link/h200-functions.txt
    # check that a dist binary was laid out by the list (CI, scripts/image-build.sh):
    python3 scripts/link_order.py check target/dist/gpu-warden

`record` runs the agent twice under callgrind with the simulated backend: standalone
(`--kube off`), and against the API server double with the guard in dry-run and node
annotations on, each scraped a few times. The NVML backend cannot run here: what it runs
comes from `--ran-on-gpu` (the functions `hw/record_link_order_h200.sh` recorded on the H200,
kept in `link/h200-functions.txt`, or that script's callgrind file), and every function of
`nvml_wrapper`, `libloading` and `gpu_warden_sample::nvml` is added besides. The list is
laid out in groups, each in the binary's present order (the code of one crate stays
together): what both the GPU agent and the simulated one ran; what only the GPU agent ran;
the rest of the NVML backend; what only the simulated agent ran (the scenario, its pods);
what only an agent in a cluster ran (the kube client, TLS, the watch, the annotator). Symbols are mangled names, which change with the compiler and with dependency
versions; a name the binary no longer has is ignored by lld and its function is laid out as
without the list. `check` fails only for a broken setup, the list missing or empty, or the
functions it finds spread as if the linker ignored it. A stale list (fewer than 80 % of its
names found) is a resident-memory regression, not a broken build: `check` prints a WARN line
with the share found and the fault-around estimate of the agent's resident code (the 64 KiB
windows its hot functions, found again under their new names, now span, against what they
would take packed), and the list is re-recorded when that figure matters.
"""

import argparse
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIST = os.path.join(ROOT, "link", "hot-symbols.txt")
SCENARIO = os.path.join(ROOT, "examples", "a10g-timesliced.yaml")
# Mangled path pieces of the code the NVML backend runs, which a machine without a GPU
# cannot execute.
NVML_PATTERNS = [r"11nvml_wrapper", r"10libloading", r"17gpu_warden_sample4nvml", r"10gpu_warden6sample4nvml"]
# `check`: how tightly the listed functions the binary has must be packed (their total size
# over the address span they occupy); looser, the linker did not use the list. Below FRESH of
# the listed names found, the list is stale: a warning with the estimate, not a failure.
MIN_PACKING = 0.85
FRESH = 0.80
# The kernel maps file pages this many bytes at a time around each first touch (fault-around):
# the unit of the resident-code estimate.
WINDOW = 64 * 1024


def symbols(binary):
    """{mangled name: (address, size)} of the binary's functions."""
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return syms


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, n, gap):
    for _ in range(n):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            c.request("GET", "/metrics")
            c.getresponse().read()
            c.close()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            c.request("GET", "/state")
            c.getresponse().read()
            c.close()
        except OSError:
            pass
        time.sleep(gap)


def functions_in(path):
    """The functions of a callgrind output file, or the lines of a plain list."""
    names, ids = set(), {}
    with open(path) as f:
        text = f.read()
    if not text.startswith(("# callgrind", "version:")):
        return {line.strip() for line in text.splitlines() if line.strip()}
    for line in text.splitlines():
        m = re.match(r"^c?fn=\((\d+)\)(?: (.*))?$", line.strip())
        if m:
            if m.group(2):
                ids[m.group(1)] = m.group(2)
            names.add(ids.get(m.group(1)))
    names.discard(None)
    return names


def callgrind(argv, env, port, seconds, out):
    """Runs `argv` under callgrind for `seconds`, scraping it; returns the functions run."""
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--demangle=no", "--dump-instr=no",
                          f"--callgrind-out-file={out}"] + argv, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds / 2)
    scrape(port, 4, seconds / 8)
    p.send_signal(2)
    p.wait(timeout=60)
    return functions_in(out)


def record(a):
    syms = symbols(a.agent)
    work = tempfile.mkdtemp(prefix="link-order-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_WARDEN_") and k != "KUBECONFIG"}
    port = free_port()
    standalone = callgrind([a.agent, "--scenario", SCENARIO, "--kube", "off", "--listen", f"127.0.0.1:{port}",
                      "--poll-interval", "1s"], env, port, a.seconds, os.path.join(work, "standalone.out"))
    # Against the API server double: the pod watch, the node annotator, the guard (dry-run).
    fixtures = os.path.join(work, "fixtures.yaml")
    with open(fixtures, "w") as f:
        f.write(subprocess.run([a.agent, "--scenario", SCENARIO, "--node-name", "gpu-node-1", "--print-sim-pods"],
                               capture_output=True, text=True, check=True).stdout)
    kc, dport = os.path.join(work, "kubeconfig"), free_port()
    double = subprocess.Popen([a.double, "--listen", f"127.0.0.1:{dport}", "--fixtures", fixtures,
                               "--kubeconfig-out", kc], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not os.path.exists(kc) and time.monotonic() < deadline:
            time.sleep(0.1)
        port = free_port()
        cluster = callgrind([a.agent, "--scenario", SCENARIO, "--node-name", "gpu-node-1", "--guard-mode", "dry-run",
                          "--listen", f"127.0.0.1:{port}", "--poll-interval", "1s"], dict(env, KUBECONFIG=kc),
                         port, a.seconds, os.path.join(work, "cluster.out"))
    finally:
        double.terminate()
        double.wait(timeout=10)
    order = lambda names: sorted(names, key=lambda n: syms[n][0])  # noqa: E731
    kib = lambda names: sum(syms[n][1] for n in names) / 1024  # noqa: E731
    sim = {n for n in standalone if n in syms}
    # The H200 recording names the functions of the binary it ran; one built since (a rename,
    # the rooms' crates of issue 40, a new compiler) finds them by stem, as `check` does.
    ran = set()
    for path in a.ran_on_gpu:
        ran |= set(functions_in(path))
    gpu = {n for n in ran if n in syms}
    gpu |= under_new_names(ran - gpu, syms, taken=gpu)
    nvml = {n for n in syms if any(re.search(p, n) for p in NVML_PATTERNS)}
    groups = [("run by both the GPU and the simulated agent", sim & gpu),
              ("run by the GPU agent alone", gpu - sim),
              ("the rest of the NVML backend", nvml - gpu - sim),
              ("run by the simulated agent alone", sim - gpu - nvml),
              ("run only in a cluster", {n for n in cluster if n in syms} - sim - gpu - nvml)]
    listed = [n for _, g in groups for n in order(g)]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(listed) + "\n")
    print(f"{len(listed)} symbols -> {a.out}: " + "; ".join(f"{len(g)} {what} ({kib(g):.0f} KiB)" for what, g in groups))
    if a.save_gpu and gpu:
        with open(a.save_gpu, "w") as f:
            f.write("\n".join(order(gpu)) + "\n")


def stem(name):
    """A mangled name without what a new compiler or dependency version changes: the legacy
    scheme's hash, the v0 scheme's crate disambiguators. Approximate (generic instances of one
    function share a legacy stem), which is enough for an estimate."""
    name = re.sub(r"17h[0-9a-f]{16}E$", "E", name)
    # A room's items before each room was its own crate (`gpu_warden::guard::…` →
    # `gpu_warden_guard::…`), so a list recorded before the split still counts where it can.
    rooms = "act|agent|attribute|config|extender|guard|model|publish|sample"
    name = re.sub(rf"10gpu_warden\d({rooms})", lambda m: f"{11 + len(m.group(1))}gpu_warden_{m.group(1)}", name)
    name = re.sub(rf"gpu_warden\.\.({rooms})\.\.", r"gpu_warden_\1..", name)
    return re.sub(r"Cs[0-9A-Za-z]+_", "Cs_", name) if name.startswith("_R") else name


def under_new_names(names, syms, taken):
    """The functions of `syms` that `names` (functions of an older binary) are now, found by
    stem. `taken` are already found under their own names, so they are no candidates (one
    instance of a generic function kept its name, another was renamed: the renamed one is
    found). A stem that more candidates share than `names` has (the instances of one generic
    function) cannot say which of them is meant and is left out."""
    wanted, by_stem = {}, {}
    for n in names:
        wanted.setdefault(stem(n), []).append(n)
    for n in syms:
        if n not in taken:
            by_stem.setdefault(stem(n), []).append(n)
    found = set()
    for key, old in wanted.items():
        new = by_stem.get(key, [])
        if len(new) <= len(old):
            found.update(new)
    return found


def windows(spans):
    """How many WINDOW-sized pieces of the file the (address, size) spans touch."""
    touched = set()
    for addr, size in spans:
        touched.update(range(addr // WINDOW, (addr + max(size, 1) - 1) // WINDOW + 1))
    return len(touched)


def check(a):
    # A broken setup fails: without the list a dist build is linked with no order at all.
    if not os.path.isfile(a.list):
        sys.exit(f"link order: {a.list} is missing: build.rs links dist builds without an order; restore it or "
                 f"re-record it (python3 scripts/link_order.py record ...)")
    with open(a.list) as f:
        listed = [line.strip() for line in f if line.strip()]
    if not listed:
        sys.exit(f"link order: {a.list} is empty; re-record it (python3 scripts/link_order.py record ...)")
    syms = symbols(a.binary)
    present = [n for n in listed if n in syms]
    share = len(present) / len(listed)
    if len(present) >= 2:
        lo = min(syms[n][0] for n in present)
        hi = max(syms[n][0] + syms[n][1] for n in present)
        size = sum(syms[n][1] for n in present)
        packing = size / (hi - lo) if hi > lo else 0.0
        if packing < MIN_PACKING:
            sys.exit(f"link order: the {len(present)} listed functions of {a.binary} ({size / 1024:.0f} KiB) are "
                     f"spread over {(hi - lo) / 1024:.0f} KiB (packing {packing:.2f}, at least {MIN_PACKING} "
                     f"wanted): the dist build did not use {a.list} (build.rs, lld's --symbol-ordering-file)")
        print(f"link order: {len(present)} of {len(listed)} listed functions present ({share:.0%}), "
              f"{size / 1024:.0f} KiB packed in {(hi - lo) / 1024:.0f} KiB ({packing:.2f})")
    if share >= FRESH:
        return
    # Stale: the functions missing from the binary under their listed names are mostly the
    # same functions under new ones, laid out as without the list. Where they sit now is the
    # regression, measured in fault-around windows.
    taken = set(present)
    found = under_new_names({n for n in listed if n not in taken}, syms, taken)
    hot = [syms[n] for n in taken | found]
    now = windows(hot) * WINDOW
    packed = -(-sum(size for _, size in hot) // WINDOW) * WINDOW
    mib = lambda b: b / 1024 / 1024  # noqa: E731
    verified = "" if len(present) >= 2 else "; too few are left to tell whether the linker used the list"
    print(f"WARN link order: {a.list} is stale: {len(present)} of {len(listed)} listed functions are in "
          f"{a.binary} ({share:.0%}; a fresh list has at least {FRESH:.0%}){verified}. {len(found)} of the "
          f"{len(listed) - len(present)} missing were found under new names, outside the order: the hot code "
          f"found spans {mib(now):.1f} MiB of 64 KiB fault-around windows where packed it would take "
          f"{mib(packed):.1f} MiB, about {mib(now - packed):.1f} MiB more of the binary resident "
          f"(docs/performance.md, \"Resident memory\"). Re-record the list: python3 scripts/link_order.py record ...")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the functions a running agent executes")
    r.add_argument("--agent", required=True)
    r.add_argument("--double", required=True)
    r.add_argument("--seconds", type=float, default=40)
    r.add_argument("--ran-on-gpu", action="append", default=[], metavar="FILE",
                   help="functions a GPU agent ran: a callgrind file of hw/record_link_order_h200.sh or a list "
                        "(repeatable)")
    r.add_argument("--save-gpu", metavar="FILE", help="write the GPU functions found in the binary to FILE "
                   "(link/h200-functions.txt), so the list can be recorded again without a GPU")
    r.add_argument("--out", default=LIST)
    c = sub.add_parser("check", help="check a dist binary was laid out by the list")
    c.add_argument("binary")
    c.add_argument("--list", default=LIST)
    a = ap.parse_args()
    record(a) if a.cmd == "record" else check(a)


if __name__ == "__main__":
    main()
