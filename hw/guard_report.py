#!/usr/bin/env python3
"""The report of the H200 guard sweep (hw/guard_h200.py), apart from the harness so that it
imports without pynvml, a GPU or root: offline tests (hw/test_guard_report.py) and a report
regenerated from a runs file of an earlier call need none of them.

    python3 hw/guard_report.py docs/evidence/guard-h200-faithful-kubelet-runs.json --out /tmp/r
"""
import argparse
import gzip
import re
import json
import os
import sys

# Files the harness writes under $OUT beside the report.
RUN_LOGS = "run-logs.jsonl.gz"
TIMELINE = "timeline.csv.gz"


def read_timeline(path):
    """Rows (t, gpu, free MiB, used MiB, {pid: MiB}) of a timeline.csv (or .csv.gz)."""
    rows = []
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        parts = line.rstrip("\n").split(",")
        if len(parts) < 5:
            continue
        procs = {}
        for kv in parts[4].split(";"):
            if ":" in kv:
                pid, mib = kv.split(":")
                procs[int(pid)] = int(mib)
        rows.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), procs))
    return rows


def growth_rate(rows, pid):
    """GiB/s the greedy process actually grew at: from 1 GiB to 90 % of its peak."""
    pts = [(t, procs[pid]) for t, _, _, _, procs in rows if pid in procs]
    if not pts:
        return None
    peak = max(m for _, m in pts)
    a = next(((t, m) for t, m in pts if m >= 1024), None)
    b = next(((t, m) for t, m in pts if m >= 0.9 * peak), None)
    if a is None or b is None or b[0] - a[0] < 0.02:
        return None
    return (b[1] - a[1]) / 1024 / (b[0] - a[0])


def analyse(results, timeline, thresholds):
    """Each run's figures from the 10 ms timeline (`per_gpu`, `unneeded`), in place."""
    for r in results:
        soft_mib, hard_mib = thresholds[r["headroom"]]
        ev = sorted(r["evictions"])
        greedy_names = {v["name"] for v in r["greedy"].values()}
        r["unneeded"] = [name for at, name, _ in ev if name not in greedy_names or before_growth(r, name, at)]
        r["per_gpu"] = {}
        for g, gr in r["greedy"].items():
            # A greedy entry's key is its GPU, or "<gpu>b" for shape `two`'s second job.
            win = [row for row in timeline if row[1] == int(gr.get("gpu", g)) and r["t0"] - 0.5 <= row[0] <= r["t1"]]
            # The pid-derived figures (measured rate, memory freed, growth after the eviction)
            # only from a pid the harness found running gpu_load.py and NVML listed, and
            # that the timeline shows; else they are unknown, not computed from a wrong pid.
            pid = gr.get("pid") if pid_valid(gr) and any(gr.get("pid") in row[4] for row in win) else None
            soft_t = next((t for t, _, free, _, _ in win if free < soft_mib and t >= r["t0"]), None)
            hard_t = next((t for t, _, free, _, _ in win if free < hard_mib and t >= r["t0"]), None)
            x = dict(soft_crossed=soft_t, hard_crossed=hard_t, pid_valid=pid is not None,
                     rate_measured=None if pid is None else growth_rate(win, pid),
                     min_free_mib=min((free for t, _, free, _, _ in win if t >= r["t0"]), default=None))
            mine = [e for e in ev if e[1] == gr["name"]]
            if mine:
                te = mine[0][0]
                x["reaction_from_soft_ms"] = None if soft_t is None else round((te - soft_t) * 1000, 1)
                x["reaction_from_hard_ms"] = None if hard_t is None else round((te - hard_t) * 1000, 1)
                before = [free for t, _, free, _, _ in win if t <= te]
                x["free_at_eviction_mib"] = before[-1] if before else None
                # The budget: decision → eviction request → the greedy process gone from the
                # GPU's process list (the kubelet's kill and the CUDA teardown).
                ds = [d for d in r.get("decisions", []) if d[0] <= te + 0.001]
                if ds:
                    x["trigger"] = ds[-1][1]
                    x["decision_to_eviction_ms"] = round((te - ds[-1][0]) * 1000, 1)
                if pid is not None:
                    gone = next((t for t, _, _, _, procs in win if t > te and pid not in procs), None)
                    x["eviction_to_freed_ms"] = None if gone is None else round((gone - te) * 1000, 1)
                # What the greedy job grew by after the eviction: its VRAM then against its peak.
                at_ev = [procs.get(pid) for t, _, _, _, procs in win if t <= te and pid in procs]
                after = [procs[pid] for t, _, _, _, procs in win if t > te and pid in procs]
                if pid is not None and at_ev and after:
                    x["growth_after_eviction_gib"] = round(max(0, max(after) - at_ev[-1]) / 1024, 2)
                # Pod names repeat across series (ci-greedy-RATE-RUN) and the kubelet window opens
                # 1 s before the run: only what came after this eviction is this pod's.
                kub = [k for k in r.get("kubelet_actions", []) if k[1] == gr["name"] and k[0] >= te]
                for action in ("sigterm", "sigkill", "exited_on_sigterm", "deleted"):
                    ts = [k[0] for k in kub if k[2] == action]
                    if ts:
                        x[f"eviction_to_{action}_ms"] = round((ts[0] - te) * 1000, 1)
            r["per_gpu"][g] = x


# The agent's guard counters the report keeps (src/publish/self_metrics.rs): every series,
# whatever its labels (`gpu_warden_guard_stops_total{result}`: stopped, killed, resumed,
# refused, gone, denied, error, not_permitted in src/act/stop.rs;
# `gpu_warden_evictions_total{namespace,result}`: evicted, already_gone, blocked, failed,
# throttled, forbidden, in_doubt, skipped, aborted in src/guard/decision.rs).
COUNTER_FAMILIES = ("gpu_warden_guard_stops_total", "gpu_warden_evictions_total",
                    "gpu_warden_guard_decisions_total", "gpu_warden_guard_stop_permitted")


def parse_labels(text):
    """{name: value} of a Prometheus label set `a="x",b="y"` (escapes undone)."""
    out, i = {}, 0
    while i < len(text):
        eq = text.index("=", i)
        name = text[i:eq].strip().lstrip(",").strip()
        j, val = eq + 2, []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                val.append({"n": "\n"}.get(text[j], text[j]))
            else:
                val.append(text[j])
            j += 1
        out[name] = "".join(val)
        i = j + 1
    return out


def parse_counters(text):
    """{'family{label="value",...}': value} of every series of COUNTER_FAMILIES in an
    exposition (labels sorted; a family without labels keyed by its name)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in COUNTER_FAMILIES:
            continue
        labels, rest = {}, line[len(name):]
        if rest.startswith("{"):
            close = line.rindex("}")
            labels, rest = parse_labels(line[len(name) + 1:close]), line[close + 1:]
        try:
            v = float(rest.split()[0])  # a timestamp may follow the value
        except (ValueError, IndexError):
            continue
        key = name + ("{" + ",".join(f'{k}="{labels[k]}"' for k in sorted(labels)) + "}" if labels else "")
        out[key] = out.get(key, 0) + v
    return out


def by_result(counters, family):
    """{result: sum over the other labels} of `family` in a run's counters. Also reads the
    older runs files' keys, `family{stopped}` (the result label's value alone)."""
    out = {}
    for k, v in counters.items():
        if not k.startswith(family + "{"):
            continue
        inner = k[len(family) + 1:-1]
        result = parse_labels(inner).get("result", "") if "=" in inner else inner
        out[result] = out.get(result, 0) + v
    return out


# An agent log line worth keeping for a run: a decision (its summary names the plan), the
# eviction walk's outcome per candidate (rank, use_mib), a stop/kill/resume, or any warning.
DECISION_WORDS = re.compile(r"evict|stop|kill|resum|decid|decision|candidate|signal|plan|victim|guard", re.I)
DECISION_FIELDS = ("decision", "trigger", "on_decision", "use_mib", "rank", "pids", "pod")


def decision_lines(lines, cap=400, width=4000, minor_cap=100):
    """The lines of an agent's JSON log (tracing's format) about decisions, bounded: those
    with a decision's fields or at WARN/ERROR first (at most `cap`), lines that only mention
    the guard's words at most `minor_cap` (so chatter cannot crowd out a late decision), each
    cut at `width` characters, in log order. Of those minor lines (a trigger's hold-back at
    debug level, on every full poll of a climb and of each workspace's return), the ones
    nearest before a kept decision line, or before the log's end, are kept: they say why
    nothing acted sooner, where the run's first ones say only what the base load did.
    Returns (kept, how many matching were dropped)."""
    major, minor = [], []
    for i, line in enumerate(lines):
        try:
            e = json.loads(line)
            f = e.get("fields", {})
            important = e.get("level") in ("WARN", "ERROR") or any(k in f for k in DECISION_FIELDS)
            mentions = bool(DECISION_WORDS.search(str(f.get("message", ""))))
        except (ValueError, AttributeError):
            important, mentions = False, bool(DECISION_WORDS.search(line))  # not JSON (a panic)
        if important:
            major.append(i)
        elif mentions:
            minor.append(i)
    keep = set(major[:cap])
    # Each minor line's distance, in lines, to the next kept decision line (or the log's end).
    anchors, nearest, a = sorted(keep) + [len(lines)], [], 0
    for i in minor:
        while anchors[a] < i:
            a += 1
        nearest.append((anchors[a] - i, i))
    keep.update(i for _, i in sorted(nearest)[:minor_cap])
    dropped = len(major) + len(minor) - len(keep)
    return [lines[i][:width] for i in sorted(keep)], dropped


def append_run_log(path, record):
    """One run's record as a line of a gzip'd JSON-lines file; each run is its own gzip
    member, so what a killed harness wrote before stays readable (zcat, gzip.open)."""
    with gzip.open(path, "at") as f:
        f.write(json.dumps(record, default=str) + "\n")


def read_run_logs(path):
    """The records of a run-logs file; a last member cut short (the harness killed while
    writing it) is dropped."""
    out = []
    try:
        with gzip.open(path, "rt") as f:
            for line in f:
                if line.strip():
                    out.append(json.loads(line))
    except (EOFError, ValueError):
        pass
    return out


def on_decision_of(guard_state):
    """What /state says the executor does: {onDecision, permitted, notPermittedReason}."""
    od = (guard_state or {}).get("onDecision")
    if not isinstance(od, dict):
        return None
    return {k: od.get(k) for k in ("onDecision", "permitted", "notPermittedReason")}


def before_growth(r, name, at):
    """Whether pod `name` is a greedy job evicted at `at`, before its growth began (`grew_from`:
    its "go", recorded since the harness gives one; None: it never began). A job taken for
    its start-up alone is a bystander in all but name: on the H100 (validation §9f) two
    were, before the go made the class visible."""
    for g in r["greedy"].values():
        if g["name"] == name and "grew_from" in g:
            return g["grew_from"] is None or at < g["grew_from"]
    return False


def first_victim(r):
    """(the first pod a run evicted or None, whether it was not a greedy one, or one evicted
    before it grew): a guard that evicts a bystander first lets the greedy job grow on until
    it decides again (§3d's a10g 64 GiB/s failures)."""
    ev = sorted(r.get("evictions", []))
    if not ev:
        return None, False
    greedy = {v["name"] for v in r["greedy"].values()}
    return ev[0][1], ev[0][1] not in greedy or before_growth(r, ev[0][1], ev[0][0])


def effective_action(r):
    """The agent's onDecision in a run, as it acted: what its /state said (runs since it was
    recorded), else the policy's key with the agent's default, `stop`, for an unset one; a
    signalling action the agent was not permitted (no CAP_KILL) is evict-only."""
    if r.get("mode") == "none":
        return "— (no agent)"
    asked = r.get("action") or "default"
    od = r.get("on_decision") or {}
    act = od.get("onDecision") or ("stop" if asked == "default" else asked)
    permitted = od.get("permitted")
    if permitted is None and "gpu_warden_guard_stop_permitted" in r.get("counters", {}):
        permitted = r["counters"]["gpu_warden_guard_stop_permitted"] > 0
    text = act + (" (default)" if asked == "default" else "")
    if act != "evict" and permitted is False:
        text += ", not permitted: evict only"
    return text


def job_end(greedy):
    """How a greedy job ended: the status its job shell logged for gpu_load.py, else the
    wrapper's (the shell died with the job: the kubelet's cgroup.kill)."""
    code = greedy.get("job_exit")
    if code is not None:
        return f"exit {code}" + (f" (signal {code - 128})" if code > 128 else "")
    rc = greedy.get("wrapper_rc")
    if rc is None:
        return "killed" if greedy.get("killed") else "—"
    return f"with its shell, wrapper {'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)}"


def counters_fresh(r):
    """Whether a run's counters are from a publication after its end (a run without an
    agent has none to be stale)."""
    return r.get("mode") == "none" or bool(r.get("counters_fresh"))


def pid_valid(greedy):
    """Whether the greedy job's recorded pid is its NVML pid. Runs files before this check
    (no `pid_ok`) took the `unshare` wrapper's pid, which NVML never lists: invalid."""
    return bool(greedy.get("pid_ok")) and greedy.get("pid") is not None


# Figures computed from the greedy job's NVML pid: shown only where that pid is known.
PID_FIGURES = ("rate_measured", "eviction_to_freed_ms", "growth_after_eviction_gib")


def table(sweep, results):
    """The report's table: one row per series and rate."""
    lines = ["| series | headroom | kubelet, PID 1 | onDecision (the agent's) | GiB/s asked (measured, median) | runs | "
             "runs with training OOMs | training OOM events | evictions (greedy / other) | wrong first victim (runs) | triggers | "
             "free at eviction, MiB (min) | min free, MiB | eviction → SIGTERM, ms | eviction → SIGKILL, ms | "
             "eviction → memory freed, ms (median, max) | greedy growth after the eviction, GiB (median, max) | "
             "processes stopped / resumed / killed (sum) | other stop results, evictions by result (sum) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None
    # A series named twice in the sweep (its rates split over two entries) is one series.
    for label in dict.fromkeys(label for label, *_ in sweep):
        for rate in sorted({r["rate"] for r in results if r["label"] == label}):
            rs = [r for r in results if r["label"] == label and r["rate"] == rate]
            pg = [x for r in rs for x in r["per_gpu"].values()]
            col = lambda k: [x[k] for x in pg if x.get(k) is not None]
            # A runs file that says a pid is valid per GPU (`pid_valid`), or, older, whose
            # greedy entries say so (`pid_ok`): figures from the other runs are dropped.
            ok = [(r["per_gpu"][g].get("pid_valid", pid_valid(gr)) if g in r["per_gpu"] else False)
                  for r in rs for g, gr in r["greedy"].items()]
            pgv = [x for r in rs for g, x in r["per_gpu"].items() if x.get("pid_valid", pid_valid(r["greedy"][g]))]
            vcol = lambda k: [x[k] for x in pgv if x.get(k) is not None]
            measured = vcol("rate_measured")
            freed = vcol("eviction_to_freed_ms")
            growth = vcol("growth_after_eviction_gib")
            unknown = "invalid/unknown (greedy pid not verified)"
            note = "" if all(ok) else f" [pid known in {sum(ok)} of {len(ok)}]"
            greedy_ev = sum(1 for r in rs for _, n, _ in r["evictions"] if n not in r["unneeded"])
            other_ev = sum(len(r["unneeded"]) for r in rs)
            bad = sum(1 for r in rs if any(r["train_ooms"].values()) or not all(r["train_alive_after"].values()))
            stops, evs = {}, {}
            for r in rs:
                for k, v in by_result(r.get("counters", {}), "gpu_warden_guard_stops_total").items():
                    stops[k] = stops.get(k, 0) + v
                for k, v in by_result(r.get("counters", {}), "gpu_warden_evictions_total").items():
                    evs[k] = evs.get(k, 0) + v
            # Counters read before a publication newer than the run's end (runs files before
            # `counters_fresh`) may miss the last action: marked †.
            stale = "" if all(counters_fresh(r) for r in rs) else " †"
            other = ", ".join([f"{k} {v:g}" for k, v in sorted(stops.items()) if k not in ("stopped", "resumed", "killed")]
                              + [f"evictions {k} {v:g}" for k, v in sorted(evs.items())]) or "—"
            if not evs and not any("counters_fresh" in r for r in rs) and any(r.get("mode") != "none" for r in rs):
                other = ((other + " ") if other != "—" else "") + "(gpu_warden_evictions_total not captured)"
            m = med(measured)
            r0 = rs[0]
            wrong = sum(1 for r in rs if first_victim(r)[1])
            actions = ", ".join(dict.fromkeys(effective_action(r) for r in rs))
            lines.append(f"| {label} | {r0['headroom']} | {r0['kubelet']}, {r0['pid1']} | {actions} | "
                         f"{rate:g} ({('invalid/unknown' if not any(ok) else '—') if m is None else f'{m:.1f}'}{note if any(ok) else ''}) | "
                         f"{len(rs)} | {bad} | "
                         f"{sum(sum(r['train_ooms'].values()) for r in rs)} | {greedy_ev} / {other_ev} | {wrong} | "
                         f"{', '.join(sorted({x['trigger'] for x in pg if x.get('trigger')})) or '—'} | "
                         f"{min(col('free_at_eviction_mib'), default=None)} | "
                         f"{min(col('min_free_mib'), default=None)} | "
                         f"{med(col('eviction_to_sigterm_ms'))} | {med(col('eviction_to_sigkill_ms'))} | "
                         f"{f'{med(freed)}, {max(freed) if freed else None}{note}' if any(ok) else unknown} | "
                         f"{f'{med(growth)}, {max(growth) if growth else None}{note}' if any(ok) else unknown} | "
                         f"{stops.get('stopped', 0):g} / {stops.get('resumed', 0):g} / {stops.get('killed', 0):g}{stale} | "
                         f"{other}{stale} |")
    return lines


def run_table(results):
    """One row per run: the first victim (a wrong one flagged), the evictions in order, what
    the agent did, the greedy pid and where the run's decision log is."""
    lines = ["Runs (decision logs: each run's agent log lines about decisions, stops and evictions, the "
             f"guard's /state and the greedy job's log are one JSON line of `{RUN_LOGS}`, keyed by series, rate "
             "and run):", "",
             "| series | GiB/s | run | first evicted (s after launch) | wrong first victim | evictions in order | "
             "onDecision (the agent's) | stopped / resumed / killed | training OOM events | greedy pid (found by) | "
             "greedy job's end | decision log lines |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        first, wrong = first_victim(r)
        ev = sorted(r.get("evictions", []))
        at = f" ({ev[0][0] - r['t0']:.2f})" if ev and "t0" in r else ""
        st = by_result(r.get("counters", {}), "gpu_warden_guard_stops_total")
        pids = "; ".join(f"{v.get('pid')} ({v.get('pid_how', 'wrapper pid, not verified')})" if pid_valid(v)
                         else f"unknown ({v.get('pid_how', 'the recorded pid is the unshare wrapper')})"
                         for v in r["greedy"].values())
        dl = r.get("decision_log")
        lines.append(f"| {r['label']} | {r['rate']:g} | {r['run']} | {first or '—'}{at} | {'**yes**' if wrong else 'no'} | "
                     f"{', '.join(n for _, n, _ in ev) or '—'} | {effective_action(r)} | "
                     f"{st.get('stopped', 0):g} / {st.get('resumed', 0):g} / {st.get('killed', 0):g}"
                     f"{'' if counters_fresh(r) else ' †'} | {sum(r['train_ooms'].values())} | {pids} | "
                     f"{'; '.join(job_end(v) for v in r['greedy'].values())} | "
                     f"{'not recorded' if not dl else str(dl['lines']) + (' (+' + str(dl['dropped']) + ' dropped)' if dl.get('dropped') else '')} |")
    return lines


def write_runs(out, results, thresholds, total_mib, setups, pid_namespaces, sweep, meta, skipped=None):
    """guard-runs.json (atomically: a harness killed while writing leaves the previous one)."""
    if skipped is not None:
        meta = dict(meta, skipped=skipped)
    tmp = os.path.join(out, ".guard-runs.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(results=results, thresholds=thresholds, total_mib=total_mib, setups=setups,
                       pid_namespaces=pid_namespaces, sweep=sweep, meta=meta), f, indent=1, default=str)
    os.replace(tmp, os.path.join(out, "guard-runs.json"))


def report(out, meta, sweep, results, timeline, thresholds, total_mib, pods_by_pid=None, idle_rows=(),
           setups=None, pid_namespaces=None):
    """Writes guard-runs.json and guard-report.md (and the plot) under `out`. `timeline`
    None: the runs' figures stand as recorded (a report regenerated from a runs file)."""
    if timeline is not None:
        analyse(results, timeline, thresholds)
    write_runs(out, results, thresholds, total_mib, setups, pid_namespaces, sweep, meta)
    lines = table(sweep, results)
    nr = "(not recorded)"
    with open(os.path.join(out, "guard-report.md"), "w") as f:
        f.write(f"GPUs {meta.get('gpus', nr)}, {total_mib} MiB each; thresholds per headroom (soft, hard MiB free): "
                f"{ {k: (round(v[0]), round(v[1])) for k, v in thresholds.items()} }; base loads: {setups}; "
                f"default fast interval {meta.get('fast_interval', nr)}; policy evictionGracePeriodSeconds "
                f"{meta.get('grace', nr)}; kubelet watch latency {meta.get('watch_latency', nr)}; "
                f"job shells in PID namespaces: {pid_namespaces}.\n\n")
        if meta.get("interrupted"):
            f.write(f"**Stopped by {meta['interrupted']}** after {meta.get('ended_after_s')} s: the run in "
                    "progress is not reported.\n\n")
        if meta.get("skipped"):
            f.write(f"Skipped to stay inside the budget ({meta.get('budget')} s): "
                    + "; ".join(f"{lb} {rt:g} GiB/s run {rn} ({why})" for lb, rt, rn, why in meta["skipped"]) + ".\n\n")
        f.write("\n".join(lines) + "\n")
        f.write("\n" + "\n".join(run_table(results)) + "\n")
        if any(not counters_fresh(r) for r in results):
            f.write("\n† counters read 0.3 s after the greedy job ended, before the agent's next poll had "
                    "rendered /metrics again: an action in the run's last second may be missing (a kill "
                    "ends the job at once, so kill runs show none).\n")
        if idle_rows:
            f.write("\nCPU with the guard armed and no pressure (every thread, /proc/PID/stat):\n\n"
                    "| agent | watchRate | GPU | seconds | CPU, % of one core |\n|---|---|---|---|---|\n")
            for r in idle_rows:
                f.write(f"| {r['binary']} | {r.get('watch_rate', 'default')} | {r['condition']} | {r['seconds']} "
                        f"| {r['cpu_pct']} |\n")
    print("\n".join(lines))
    print(json.dumps(list(idle_rows)))
    if timeline is not None:
        soft_mib, hard_mib = thresholds["today"]
        try:
            plot(out, results, timeline, pods_by_pid or {}, soft_mib, hard_mib)
        except Exception as e:  # the plot is a picture: it must not cost the report
            print("plot failed:", e, file=sys.stderr)


def report_only(runs_path, out, timeline_path=None):
    """The report again from a guard-runs.json (an earlier call's evidence): nothing is
    re-measured; the runs' recorded figures are rendered by today's table code, or computed
    again from that call's timeline when it is given."""
    with open(runs_path) as f:
        d = json.load(f)
    os.makedirs(out, exist_ok=True)
    timeline = read_timeline(timeline_path) if timeline_path else None
    report(out, d.get("meta") or {}, d["sweep"], d["results"], timeline, d["thresholds"], d["total_mib"],
           setups=d.get("setups"), pid_namespaces=d.get("pid_namespaces"))


def plot(out, results, timeline, pods_by_pid, soft_mib, hard_mib):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = []
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        r = next((x for x in rs if x["rate"] == 16), rs[0])
        panels += [(r, g) for g in r["greedy"]]
    panels = panels[:4]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4 * len(panels)), squeeze=False)
    for ax, (r, g) in zip(axes[:, 0], panels):
        gpu = int(r["greedy"][g].get("gpu", g))
        win = [row for row in timeline if row[1] == gpu and r["t0"] - 0.5 <= row[0] <= r["t1"]]
        ts = [row[0] - r["t0"] for row in win]
        names = dict(pods_by_pid)
        for gg, gr in r["greedy"].items():
            names[gr["pid"]] = ("ci", gr["name"], "build")
        for pid, (ns, pod, _) in names.items():
            ys = [row[4].get(pid, 0) / 1024 for row in win]
            if any(ys):
                ax.plot(ts, ys, label=f"{ns}/{pod}")
        ax.plot(ts, [row[2] / 1024 for row in win], "k--", label="free")
        ax.axhline(soft_mib / 1024, color="orange", lw=0.8, label="soft")
        ax.axhline(hard_mib / 1024, color="red", lw=0.8, label="hard")
        here = {r["greedy"][g]["name"]} | set(r["unneeded"])
        for te, name, status in (e for e in r["evictions"] if e[1] in here):
            ax.axvline(te - r["t0"], color="purple", lw=1.5, label=f"eviction of {name} ({status})")
        ax.set_title(f"GPU {g}, {r['label']} ({'guard, enforce, fast ' + r['fast'] if r['mode'] == 'guard' else 'no guard'}, "
                     f"{r['headroom']}, {r['kubelet']} kubelet): "
                     f"greedy at {r['rate']:g} GiB/s; training OOM events: {r['train_ooms'].get(gpu, r['train_ooms'].get(str(gpu), 0))}")
        ax.set_xlabel("seconds since the greedy job was launched")
        ax.set_ylabel("GiB")
        ax.legend(fontsize=7, loc="center left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "guard-vram.png"), dpi=110)



def main(argv=None):
    ap = argparse.ArgumentParser(description="the guard sweep's report from a guard-runs.json")
    ap.add_argument("runs", help="a guard-runs.json written by hw/guard_h200.py")
    ap.add_argument("--out", required=True, help="where guard-report.md (and guard-runs.json) go")
    ap.add_argument("--timeline", help="that call's timeline.csv(.gz): the runs' figures computed again")
    a = ap.parse_args(argv)
    report_only(a.runs, a.out, a.timeline)


if __name__ == "__main__":
    main()
