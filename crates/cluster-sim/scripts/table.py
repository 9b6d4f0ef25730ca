#!/usr/bin/env python3
"""Merges cluster-sim CSVs (runs split over several processes to use more than one core)
into the Markdown table `cluster-sim` prints, and an SVG plot (no matplotlib needed).

usage: table.py OUT.svg A.csv [B.csv ...] > table.md
Rows: one per (policy, onDecision, replicas), seeds in order, as report::markdown groups them.
"""
import csv
import sys

LABEL = {"device-plugin": "device plugin", "guard": "+ guard", "extender-guard": "+ extender + guard"}
ORDER = ["device-plugin", "guard", "extender-guard"]
ACTIONS = ["evict", "stop", "kill"]
COLOURS = ["#c0392b", "#e69f00", "#0072b2", "#009e73", "#cc79a7", "#56b4e9"]


def label(policy, action):
    return LABEL[policy] if policy == "device-plugin" else f"{LABEL[policy]} ({action})"


def rows(runs):
    groups = {}
    for r in runs:
        key = (r["policy"], r["on_decision"] if r["policy"] != "device-plugin" else "-", int(r["replicas"]))
        groups.setdefault(key, []).append(r)
    keys = sorted(groups, key=lambda k: (ORDER.index(k[0]), ACTIONS.index(k[1]) if k[1] in ACTIONS else 0, k[2]))
    return [(k, sorted(groups[k], key=lambda r: int(r["seed"]))) for k in keys]


def minutes(s):
    return f"{s:.0f} s" if s < 60 else f"{s / 60:.1f} min"


def markdown(grouped):
    out = ["| policy | replicas | OOM-killed, % of jobs, per seed | worst seed | OOM-killed within their declaration (all seeds) | jobs finished per GPU-hour (mean; min–max) | queue wait p95 (mean) | evictions per hour (mean) | evicted while not growing (all seeds; within their declaration) |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (policy, action, replicas), rs in grouped:
        shares = [float(r["oom_share"]) * 100 for r in rs]
        tput = [float(r["jobs_per_gpu_hour"]) for r in rs]
        within = sum(int(r["oom_within_declared"]) for r in rs)
        wait = sum(float(r["wait_p95_s"]) for r in rs) / len(rs)
        ev = sum(float(r["evictions_per_hour"]) for r in rs) / len(rs)
        idle = sum(int(r["evicted_not_growing"]) for r in rs)
        idle_within = sum(int(r["evicted_not_growing_within_declared"]) for r in rs)
        out.append(f"| {label(policy, action)} | {replicas} | {' / '.join(f'{x:.2f}' for x in shares)} | {max(shares):.2f} % | {within} | "
                   f"{sum(tput) / len(tput):.2f} ({min(tput):.2f}–{max(tput):.2f}) | {minutes(wait)} | {ev:.0f} | {idle} ({idle_within}) |")
    return "\n".join(out) + "\n"


def svg(grouped, caption):
    labels = []
    for (p, a, _), _rs in grouped:
        if label(p, a) not in labels:
            labels.append(label(p, a))
    reps = sorted({k[2] for k, _ in grouped})
    panels = [("Jobs killed by GPU OOM (% of jobs, worst seed)", lambda rs: max(float(r["oom_share"]) * 100 for r in rs), "{:.2f}"),
              ("Jobs finished per GPU-hour (mean)", lambda rs: sum(float(r["jobs_per_gpu_hour"]) for r in rs) / len(rs), "{:.2f}"),
              ("Evictions per hour (mean)", lambda rs: sum(float(r["evictions_per_hour"]) for r in rs) / len(rs), "{:.0f}")]
    s = ['<svg xmlns="http://www.w3.org/2000/svg" width="1060" height="350" viewBox="0 0 1060 350" font-family="sans-serif">',
         '<rect width="1060" height="350" fill="white"/>']
    w, h, top = 300.0, 220.0, 50.0
    for pi, (title, value, fmt) in enumerate(panels):
        x0 = 30.0 + pi * 350.0
        vals = {(label(k[0], k[1]), k[2]): value(rs) for k, rs in grouped}
        mx = max(list(vals.values()) + [1e-9])
        s.append(f'<text x="{x0 + w / 2:.0f}" y="30" font-size="14" text-anchor="middle">{title}</text>')
        s.append(f'<line x1="{x0:.0f}" y1="{top + h:.0f}" x2="{x0 + w:.0f}" y2="{top + h:.0f}" stroke="black"/>')
        group = w / len(reps)
        bar = group / (len(labels) + 1)
        for gi, rep in enumerate(reps):
            gx = x0 + gi * group
            s.append(f'<text x="{gx + group / 2:.1f}" y="{top + h + 18:.0f}" font-size="12" text-anchor="middle">replicas {rep}</text>')
            for li, l in enumerate(labels):
                if (l, rep) not in vals:
                    continue
                v = vals[(l, rep)]
                bh = h * v / mx
                bx = gx + bar * 0.5 + li * bar
                s.append(f'<rect x="{bx:.1f}" y="{top + h - bh:.1f}" width="{bar * 0.9:.1f}" height="{bh:.1f}" fill="{COLOURS[li % 6]}"/>')
                s.append(f'<text x="{bx + bar * 0.45:.1f}" y="{top + h - bh - 3:.1f}" font-size="9" text-anchor="middle">{fmt.format(v)}</text>')
    for i, l in enumerate(labels):
        x = 30.0 + i * 250.0
        s.append(f'<rect x="{x:.0f}" y="312" width="12" height="12" fill="{COLOURS[i % 6]}"/><text x="{x + 16:.0f}" y="322" font-size="12">{l}</text>')
    s.append(f'<text x="1050" y="344" font-size="9" text-anchor="end">{caption}</text>')
    s.append("</svg>")
    return "\n".join(s) + "\n"


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    runs = []
    for path in argv[2:]:
        with open(path, newline="") as f:
            runs.extend(csv.DictReader(f))
    grouped = rows(runs)
    sys.stdout.write(markdown(grouped))
    with open(argv[1], "w") as f:
        f.write(svg(grouped, "cluster-sim, seeds " + ",".join(sorted({r["seed"] for r in runs}))))


if __name__ == "__main__":
    main(sys.argv)
