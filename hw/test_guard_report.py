#!/usr/bin/env python3
"""Offline tests of the H200 guard harness (hw/guard_h200.py, hw/guard_report.py): no
pynvml, no GPU. `python3 hw/test_guard_report.py` (the live job-pid tests run where
`unshare --pid` works, i.e. as root; they are skipped elsewhere, unless GUARD_TEST_PIDNS=1
makes that a failure). CI runs it (scripts/test.sh) on 2 cores that may be busy: every wait
here is on an event (a line in a log, a file, a process's state), with a generous bound only
as a safety net, never a fixed sleep."""
import contextlib
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import guard_h200 as gh  # noqa: E402  (imports without pynvml)
import guard_report as gr  # noqa: E402

EVIDENCE = os.path.join(HERE, "..", "docs", "evidence")
# scripts/test.sh sets it as root: PID namespaces must work there, so the live job-pid test
# fails instead of being skipped, and the end-to-end sweep must not fall back without them.
REQUIRE_PIDNS = os.environ.get("GUARD_TEST_PIDNS") == "1"


def fake_proc(root, pid, argv, nspid, ppid=1):
    d = os.path.join(root, str(pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "cmdline"), "wb") as f:
        f.write(b"".join(a.encode() + b"\0" for a in argv))
    with open(os.path.join(d, "status"), "w") as f:
        f.write(f"Name:\tx\nNSpid:\t{nspid}\n")
    with open(os.path.join(d, "stat"), "w") as f:
        f.write(f"{pid} (a (b) c) S {ppid} 0 0\n")


class JobPid(unittest.TestCase):
    """Bug 1: the greedy job's NVML pid."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def job_argv(self, pidns):
        gh.PIDNS = pidns
        return gh.as_job([sys.executable, os.path.join(HERE, "gpu_load.py"), "--device", "0",
                          "--grow-gib-per-s", "16"], "shell")

    def test_wrapper_and_shell_argv_hold_the_script_name(self):
        # The root cause: the old lookup matched b"gpu_load.py" anywhere in the cmdline and
        # took the first pid of cgroup.procs, the unshare wrapper, whose argv (like the job
        # shell's) carries the whole `sh -c` script text.
        argv = self.job_argv(True)
        self.assertEqual(argv[0], "unshare")
        self.assertIn("gpu_load.py", " ".join(argv))
        self.assertFalse(gh.runs_script(argv, "gpu_load.py"))
        self.assertFalse(gh.runs_script(argv[argv.index("sh"):], "gpu_load.py"))
        self.assertTrue(gh.runs_script([sys.executable, "-u", "/x/hw/gpu_load.py", "--device", "0"], "gpu_load.py"))
        self.assertFalse(gh.runs_script([sys.executable, "-c", "import gpu_load.py"], "gpu_load.py"))

    def test_fake_proc_tree(self):
        proc, cg = os.path.join(self.tmp, "proc"), os.path.join(self.tmp, "cg")
        os.makedirs(cg)
        argv = self.job_argv(True)
        sh = argv[argv.index("sh"):]
        fake_proc(proc, 556, argv, "556")
        fake_proc(proc, 557, sh, "557\t1", ppid=556)
        fake_proc(proc, 558, [sys.executable, "/d/hw/gpu_load.py", "--device", "0"], "558\t2", ppid=557)
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("556\n557\n")
        os.makedirs(os.path.join(cg, "sub"))
        with open(os.path.join(cg, "sub", "cgroup.procs"), "w") as f:
            f.write("558\n")  # in a child cgroup: found through the subtree
        self.assertEqual(gh.cgroup_tree_pids(cg), [556, 557, 558])
        self.assertEqual(sorted(gh.descendants(556, proc)), [557, 558])
        self.assertEqual(gh.find_job_pid(cg, 556, logged_pid=2, proc=proc, timeout=0), (558, "script argv + NSpid"))
        # Not in the cgroup at all: still found among the wrapper's descendants.
        with open(os.path.join(cg, "sub", "cgroup.procs"), "w") as f:
            f.write("")
        self.assertEqual(gh.find_job_pid(cg, 556, logged_pid=2, proc=proc, timeout=0)[0], 558)
        # No such process: None, and why.
        shutil.rmtree(os.path.join(proc, "558"))
        pid, how = gh.find_job_pid(cg, 556, logged_pid=2, proc=proc, timeout=0)
        self.assertIsNone(pid)
        self.assertIn("no process runs gpu_load.py", how)

    def live(self, pidns):
        """The real wrapper (as_job) around a stand-in gpu_load.py that logs "ready" with its
        os.getpid() as the real one does, found in the real /proc."""
        if pidns and not gh.have_pid_namespaces():
            if REQUIRE_PIDNS:
                self.fail("GUARD_TEST_PIDNS=1, but unshare --pid --fork --mount-proc does not work here")
            self.skipTest("unshare --pid does not work here (not root?)")
        d = os.path.join(self.tmp, "hw")
        os.makedirs(d)
        script = os.path.join(d, "gpu_load.py")
        with open(script, "w") as f:
            f.write("import json, os, time\nprint(json.dumps({'event': 'ready', 'pid': os.getpid()}), flush=True)\n"
                    "time.sleep(600)\n")  # killed below
        gh.PIDNS = pidns
        lp = os.path.join(self.tmp, "job.log")
        p = gh.spawn_in_cgroup(None, gh.as_job([sys.executable, script, "--device", "0"], "shell"), lp)
        try:
            self.assertTrue(gh.wait_ready(lp, 120), open(lp).read())
            # A stand-in for the container cgroup: cgroup.procs as the kernel lists it, the
            # wrapper first (what the old lookup returned).
            cg = os.path.join(self.tmp, "cg")
            os.makedirs(cg)
            tree = [p.pid] + sorted(gh.descendants(p.pid))
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write("".join(f"{x}\n" for x in tree))
            old = next(x for x in tree if b"gpu_load.py" in open(f"/proc/{x}/cmdline", "rb").read())
            self.assertEqual(old, p.pid, "the old substring match takes the wrapper")
            pid, how = gh.find_job_pid(cg, p.pid, logged_pid=gh.ready_pid(lp), timeout=60)
            self.assertIsNotNone(pid, how)
            self.assertNotEqual(pid, p.pid)
            self.assertTrue(gh.runs_script(gh.argv_of(pid), "gpu_load.py"))
            self.assertEqual(gh.ns_pid(pid), gh.ready_pid(lp))
            self.assertEqual(how, "script argv + NSpid")
            if pidns:
                self.assertNotEqual(pid, gh.ready_pid(lp), "inside its PID namespace the job logs another pid")
            # A kill of the job (what onDecision: kill does): the shell logs 137 and exits 0,
            # so the wrapper's status alone (the old `killed`) says nothing was killed.
            os.kill(pid, signal.SIGKILL)
            self.assertEqual(p.wait(timeout=60), 0)
            self.assertEqual(gh.job_exit(lp), 137)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def test_live_in_a_pid_namespace(self):
        self.live(True)

    def test_live_without_pid_namespaces(self):
        self.live(False)


def evidence(name):
    return json.load(open(os.path.join(EVIDENCE, name)))


class ReportFromEvidence(unittest.TestCase):
    def render(self, name):
        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out)
        with contextlib.redirect_stdout(io.StringIO()):
            gr.report_only(os.path.join(EVIDENCE, name), out)
        return open(os.path.join(out, "guard-report.md")).read()

    def test_pid_figures_of_the_faithful_kubelet_calls_are_unknown(self):
        # Every greedy pid of those calls was the unshare wrapper's: the columns must not
        # show the numbers computed from it.
        for name in ("guard-h200-faithful-kubelet-runs.json", "guard-h200-faithful-kubelet-call3-runs.json"):
            text = self.render(name)
            cells = [l for l in text.splitlines() if l.startswith("| guard") and "| faithful, shell |" in l]
            runs = [l for l in text.splitlines() if l.startswith("| guard") and l not in cells]
            self.assertTrue(cells and runs)
            for row in cells:
                self.assertEqual(row.count("invalid/unknown (greedy pid not verified)"), 2, row)
                self.assertIn(" (invalid/unknown) |", row)
            for row in runs:
                self.assertIn("| unknown (the recorded pid is the unshare wrapper) |", row)

    def test_a_verified_pid_is_used(self):
        rows = [(1000.0 + i * 0.01, 0, 20000 - i * 100, 0, {42: i * 100}) for i in range(100)]
        rows += [(1001.0 + i * 0.01, 0, 10000, 0, {}) for i in range(10)]
        r = dict(label="guard", rate=10.0, t0=1000.0, t1=1001.2, headroom="today", evictions=[(1000.5, "g", 201)],
                 greedy={0: dict(name="g", pid=42, pid_ok=True)}, decisions=[], kubelet_actions=[])
        gr.analyse([r], rows, {"today": (5000, 2000)})
        x = r["per_gpu"][0]
        self.assertTrue(x["pid_valid"])
        self.assertAlmostEqual(x["rate_measured"], 100 / 1024 / 0.01, delta=0.5)
        self.assertEqual(x["eviction_to_freed_ms"], 500.0)
        r["greedy"][0]["pid_ok"] = False
        gr.analyse([r], rows, {"today": (5000, 2000)})
        x = r["per_gpu"][0]
        self.assertFalse(x["pid_valid"])
        self.assertIsNone(x["rate_measured"])
        self.assertNotIn("eviction_to_freed_ms", x)


def job_log(case, text):
    """A greedy job's log holding `text`, in a directory removed after `case`."""
    d = tempfile.mkdtemp()
    case.addCleanup(shutil.rmtree, d)
    path = os.path.join(d, "g.log")
    with open(path, "w") as f:
        f.write(text)
    return path


class BeforeGrowth(unittest.TestCase):
    """A greedy job evicted before its growth began (its start-up alone) counts as a wrong
    victim and an eviction of another; runs recorded before the go (no `grew_from`) as before."""

    def run_(self, **greedy):
        r = dict(label="guard", rate=64.0, t0=1000.0, t1=1003.0, headroom="today",
                 evictions=[(1001.0, "g", 201)], greedy={0: dict(name="g", pid=42, pid_ok=True, **greedy)},
                 decisions=[], kubelet_actions=[])
        gr.analyse([r], [], {"today": (5000, 2000)})
        return r

    def test_evicted_before_it_grew(self):
        for greedy, wrong in [(dict(grew_from=1001.5), True), (dict(grew_from=None), True),
                              (dict(grew_from=1000.5), False), ({}, False)]:
            r = self.run_(**greedy)
            self.assertEqual(gr.first_victim(r), ("g", wrong), greedy)
            self.assertEqual(r["unneeded"], ["g"] if wrong else [], greedy)

    def test_the_harness_records_the_go(self):
        went = job_log(self, '{"event": "ready", "t": 1.0}\n{"event": "go", "t": 2.5}\nKilled\njob-exit=137\n')
        self.assertEqual(gh.grew_from(went), 2.5)
        self.assertIsNone(gh.grew_from(job_log(self, '{"event": "ready", "t": 1.0}\nKilled\njob-exit=137\n')))


EXPOSITION = """# HELP gpu_warden_evictions_total Eviction requests by the OOM guard, by pod namespace and result.
# TYPE gpu_warden_evictions_total counter
gpu_warden_evictions_total{namespace="ci",result="evicted"} 2
gpu_warden_evictions_total{namespace="ml",result="evicted"} 1
gpu_warden_evictions_total{namespace="ci",result="blocked"} 1
# TYPE gpu_warden_guard_decisions_total counter
gpu_warden_guard_decisions_total{mode="enforce",trigger="early_trend"} 3
gpu_warden_guard_stop_permitted 1
# TYPE gpu_warden_guard_stops_total counter
gpu_warden_guard_stops_total{result="stopped"} 2
gpu_warden_guard_stops_total{result="resumed"} 1
gpu_warden_guard_stops_total{result="killed"} 1 1796167876000
gpu_warden_guard_stops_total{result="not_permitted"} 1
gpu_warden_guard_held{gpu="0"} 1
gpu_warden_container_gpu_memory_used_bytes{namespace="ci",pod="a b",container="c"} 1e9
"""


class Counters(unittest.TestCase):
    """Bug 2: every stops_total and evictions_total series."""

    def test_every_series_is_kept(self):
        c = gr.parse_counters(EXPOSITION)
        self.assertEqual(c['gpu_warden_guard_stops_total{result="killed"}'], 1)
        self.assertEqual(gr.by_result(c, "gpu_warden_guard_stops_total"),
                         {"stopped": 2, "resumed": 1, "killed": 1, "not_permitted": 1})
        self.assertEqual(gr.by_result(c, "gpu_warden_evictions_total"), {"evicted": 3, "blocked": 1})
        self.assertEqual(c["gpu_warden_guard_stop_permitted"], 1)
        self.assertNotIn("gpu_warden_guard_held", " ".join(c))

    def test_the_families_the_agent_exports(self):
        # The families and label values the agent has (so a rename breaks this test, not a
        # GPU call's report).
        src = os.path.join(HERE, "..", "src")
        metrics = open(os.path.join(src, "publish", "self_metrics.rs")).read()
        for fam in gr.COUNTER_FAMILIES:
            self.assertIn(f'"{fam}"', metrics)
        stop = open(os.path.join(src, "act", "stop.rs")).read()
        for result in ("stopped", "killed", "resumed"):
            self.assertIn(f'"{result}"', stop)

    def test_older_keys_and_the_columns(self):
        # Call 2's keys, and a run of today's harness with fresh counters.
        self.assertEqual(gr.by_result({"gpu_warden_guard_stops_total{stopped}": 2.0,
                                       "gpu_warden_guard_stop_permitted": 1.0}, "gpu_warden_guard_stops_total"),
                         {"stopped": 2.0})
        r = dict(label="guard%a=kill", rate=16.0, run=0, headroom="a10g", kubelet="faithful", pid1="shell",
                 action="kill", evictions=[(1.0, "g", 201)], unneeded=[], train_ooms={0: 0},
                 train_alive_after={0: True}, greedy={0: dict(name="g", pid=5, pid_ok=True)},
                 per_gpu={0: dict(pid_valid=True)}, counters=gr.parse_counters(EXPOSITION), counters_fresh=True)
        row = gr.table([("guard%a=kill",)], [r])[2]
        self.assertIn("| 2 / 1 / 1 |", row)
        self.assertIn("not_permitted 1, evictions blocked 1, evictions evicted 3 |", row)
        self.assertNotIn("†", row)


class DecisionLog(unittest.TestCase):
    """Bug 3: each run's decision lines come back, bounded."""

    LINES = [
        json.dumps({"timestamp": "2026-12-01T23:14:10.240Z", "level": "WARN", "fields": {
            "message": "GPU 0 (GPU-x): 22.1 GiB of 23.5 GiB used, 1.4 GiB free, high pressure (early_trend); "
                       "plan: evict 1 of 3 candidates [ci/ci-small] to reclaim 2.0 GiB",
            "gpu": 0, "decision": 7, "mode": "enforce", "trigger": "early_trend"}, "target": "gpu_warden::agent::core"}),
        json.dumps({"timestamp": "2026-12-01T23:14:10.241Z", "level": "WARN", "fields": {
            "message": "pod evicted to relieve GPU memory pressure", "decision": 7, "pod": "ci-small", "rank": 1,
            "use_mib": 3072, "outcome": "evicted"}}),
        json.dumps({"timestamp": "2026-12-01T23:14:09.000Z", "level": "INFO", "fields": {
            "message": "pod view synced", "pods": 5}}),
        json.dumps({"timestamp": "2026-12-01T23:14:09.000Z", "level": "INFO", "fields": {
            "message": "guard will stop the victim's GPU processes when it decides (CAP_KILL held)",
            "on_decision": "stop"}}),
        "thread 'main' panicked at src/act/stop.rs: kill failed",
        "",
    ]

    def test_kept_lines(self):
        kept, dropped = gr.decision_lines(self.LINES)
        self.assertEqual(dropped, 0)
        self.assertEqual(len(kept), 4)
        self.assertNotIn("pod view synced", " ".join(kept))
        self.assertIn('"use_mib": 3072', kept[1])

    def test_bounded(self):
        kept, dropped = gr.decision_lines([self.LINES[0]] * 500, cap=400, width=100)
        self.assertEqual((len(kept), dropped), (400, 100))
        self.assertTrue(all(len(l) <= 100 for l in kept))

    def test_chatter_cannot_crowd_out_a_late_decision(self):
        chatter = json.dumps({"level": "INFO", "fields": {"message": "fast memory watch", "on": True, "guard": 1}})
        chatter = chatter.replace("fast memory watch", "guard fast memory watch")
        kept, dropped = gr.decision_lines([chatter] * 1000 + [self.LINES[0]])
        self.assertEqual(kept[-1], self.LINES[0])
        self.assertEqual((len(kept), dropped), (101, 900))

    def test_the_hold_backs_before_a_decision_are_kept(self):
        # A trigger's hold-backs (debug) come on every full poll of each workspace's return all
        # run long; the ones that explain a decision are those just before it.
        def held(n):
            return json.dumps({"level": "DEBUG", "fields": {"message": f"trigger held back: the guard {n}"}})
        lines = [held(n) for n in range(300)] + [self.LINES[0]] + [held(n) for n in range(300, 320)]
        kept, dropped = gr.decision_lines(lines, minor_cap=50)
        self.assertEqual((len(kept), dropped), (51, 270))
        # the 30 nearest before the decision and the 20 before the log's end, none of the first
        self.assertEqual(kept[0], held(270))
        self.assertEqual(kept[29:32], [held(299), self.LINES[0], held(300)])
        self.assertEqual(kept[-1], held(319))

    def test_gzip_members_append(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, gr.RUN_LOGS)
        gr.append_run_log(path, dict(label="a", rate=1.0, run=0, agent_lines=self.LINES[:2]))
        gr.append_run_log(path, dict(label="a", rate=1.0, run=1, agent_lines=[]))
        got = gr.read_run_logs(path)
        self.assertEqual([g["run"] for g in got], [0, 1])
        self.assertEqual(got[0]["agent_lines"], self.LINES[:2])
        out = subprocess.run(["sh", "-c", f"zcat {path} | wc -l"], capture_output=True, text=True).stdout
        self.assertEqual(out.strip(), "2")

    def test_job_end(self):
        self.assertEqual(gr.job_end(dict(job_exit=137, wrapper_rc=0)), "exit 137 (signal 9)")
        self.assertEqual(gr.job_end(dict(job_exit=None, wrapper_rc=-9)), "with its shell, wrapper signal 9")
        self.assertEqual(gr.job_end(dict(killed=True)), "killed")  # an older runs file
        lp = job_log(self, '{"event": "ready"}\njob-exit=137\n')
        self.assertEqual(gh.job_exit(lp), 137)
        self.assertIsNone(gh.job_exit(os.path.join(os.path.dirname(lp), "none.log")))

    def test_listed_in_the_report(self):
        r = dict(label="guard", rate=16.0, run=0, t0=0.0, evictions=[(4.0, "g", 201)], greedy={0: dict(name="g")},
                 train_ooms={0: 0}, decision_log=dict(file=gr.RUN_LOGS, lines=12, dropped=3))
        lines = gr.run_table([r])
        self.assertIn(gr.RUN_LOGS, lines[0])
        self.assertTrue(lines[-1].endswith("| 12 (+3 dropped) |"), lines[-1])


class FirstVictim(unittest.TestCase):
    """Bug 4: the first evicted pod, a bystander first flagged and counted per cell."""

    def test_evidence(self):
        for name, label, runs in (("guard-h200-faithful-kubelet-runs.json", "guard*2%h=a10g", [(64.0, 1)]),
                                  ("guard-h200-faithful-kubelet-call3-runs.json", "guard*4%h=a10g", [(64.0, 2)])):
            d = evidence(name)
            wrong = [(r["rate"], r["run"]) for r in d["results"] if gr.first_victim(r)[1]]
            self.assertEqual(wrong, runs, name)
            r = next(r for r in d["results"] if (r["rate"], r["run"]) == runs[0] and r["label"] == label)
            self.assertEqual(gr.first_victim(r)[0], "ci-small")
            row = next(l for l in gr.table(d["sweep"], d["results"]) if l.startswith(f"| {label} |") and "| 64 (" in l)
            self.assertEqual(row.split(" | ")[9], "1", row)

    def test_no_eviction_and_order(self):
        g = {0: dict(name="ci-greedy")}
        self.assertEqual(gr.first_victim(dict(evictions=[], greedy=g)), (None, False))
        self.assertEqual(gr.first_victim(dict(evictions=[(2.0, "ci-small", 201), (1.0, "ci-greedy", 201)], greedy=g)),
                         ("ci-greedy", False))
        self.assertEqual(gr.first_victim(dict(evictions=[(2.0, "ci-greedy", 201), (1.0, "ci-small", 201)], greedy=g)),
                         ("ci-small", True))


class SeriesNamedTwice(unittest.TestCase):
    """A series whose rates the sweep splits over two entries (§9r: `runner` at the A10G's
    headroom, 250 first, the other rates later) gets one row per rate, not one per entry."""

    def test_one_row_per_series_and_rate(self):
        d = evidence("guard-h200-issue38-table-fc39f4b-runs.json")
        self.assertEqual(sum(1 for label, *_ in d["sweep"] if label == "guard*5%s=runner%h=a10g"), 2)
        rows = [tuple(l.split(" | ")[i] for i in (0, 4)) for l in gr.table(d["sweep"], d["results"])[2:]]
        self.assertEqual(len(rows), len(set(rows)), rows)
        self.assertEqual(len(rows), len({(r["label"], r["rate"]) for r in d["results"]}))


class OnDecision(unittest.TestCase):
    """Bug 5: the onDecision column is the agent's action, its default named."""

    def args(self, sweep):
        import argparse
        return argparse.Namespace(sweep=sweep, modes="guard", rates="16", gpus="0", fast_interval="default", runs=1,
                                  hard=5, soft=10, grace="default")

    def test_sweep_keys_and_policy(self):
        sweep = gh.parse_sweep(self.args("guard:16;guard%a=stop:16;guard%a=kill:16;guard%a=evict:16"))
        self.assertEqual([o["a"] for *_, o in sweep], ["", "stop", "kill", "evict"])
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        policies = [open(gh.write_policy(self.args(None), d, "default", "today", o["a"])).read() for *_, o in sweep]
        self.assertNotIn("onDecision", policies[0])  # unset: the agent's default
        for p, a in zip(policies[1:], ("stop", "kill", "evict")):
            self.assertIn(f"onDecision: {a}\n", p)
        with self.assertRaises(SystemExit):
            gh.parse_sweep(self.args("guard%a=pause:16"))

    def test_a_series_can_run_the_second_agent(self):
        sweep = gh.parse_sweep(self.args("guard:16;guard%b=1:16"))
        self.assertEqual([o["b"] for *_, o in sweep], ["", "1"])
        args = self.args(None)
        args.agent, args.agent_b = "/x/gpu-warden", "/x/gpu-warden-b"
        self.assertEqual([gh.agent_of(args, o) for *_, o in sweep], ["/x/gpu-warden", "/x/gpu-warden-b"])
        with self.assertRaises(SystemExit):
            gh.parse_sweep(self.args("guard%b=2:16"))

    def test_column(self):
        base = dict(mode="guard", counters={})
        self.assertEqual(gr.effective_action(dict(base, action="default")), "stop (default)")
        self.assertEqual(gr.effective_action(dict(base, action="")), "stop (default)")
        for a in ("stop", "kill", "evict"):
            self.assertEqual(gr.effective_action(dict(base, action=a)), a)
        # What /state said wins; a signalling action without CAP_KILL evicts only.
        self.assertEqual(gr.effective_action(dict(base, action="default", on_decision=dict(onDecision="stop", permitted=True))),
                         "stop (default)")
        self.assertEqual(gr.effective_action(dict(base, action="kill", on_decision=dict(onDecision="kill", permitted=False))),
                         "kill, not permitted: evict only")
        self.assertEqual(gr.effective_action(dict(base, action="stop", counters={"gpu_warden_guard_stop_permitted": 0.0})),
                         "stop, not permitted: evict only")
        self.assertEqual(gr.effective_action(dict(base, action="evict", counters={"gpu_warden_guard_stop_permitted": 0.0})),
                         "evict")
        self.assertEqual(gr.effective_action(dict(mode="none", action="default")), "— (no agent)")
        d = evidence("guard-h200-faithful-kubelet-runs.json")
        cols = {l.split(" | ")[0][2:]: l.split(" | ")[3] for l in gr.table(d["sweep"], d["results"])[2:]}
        self.assertEqual(cols["guard*2%h=a10g"], "stop (default)")
        self.assertEqual(cols["guard*1%a=evict"], "evict")


STUB = """import json, os, signal, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
json.dump(args, open(os.path.join(out, "argv.json"), "w"))
def term(*_):
    open(os.path.join(out, "guard-report.md"), "w").write("report of the finished runs\\n")
    sys.exit(0)
mode = os.environ["STUB_MODE"]
if mode == "ok":
    term()
# Budget.sweep starts the sweep with SIGTERM blocked, a mask bash and timeout pass on: the
# backstop's SIGTERM waits, pending, until this stand-in's disposition is in place, however
# slowly the interpreter starts on a loaded machine (the real harness has had its handler
# for minutes when the backstop fires).
if signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, []):
    sys.exit("stub: SIGTERM was not blocked at its start: the backstop could come before its handler")
signal.signal(signal.SIGTERM, term if mode == "term" else signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
time.sleep(60)
"""


class Outstanding(unittest.TestCase):
    """hw/outstanding_h200.sh: the card decides today's trainer, the budget is what is left,
    the failing cells come first, the batch outlives the call, and what comes back leaves the
    binaries out."""

    def batch(self, total_mib, left, before=False, sweep=None, b=False, **extra_env):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        for sub in ("hw", "bin", "b", "out"):
            os.makedirs(os.path.join(d, sub))
        for name in ("outstanding_h200.sh", "guard_sweep_h200.sh"):
            shutil.copy(os.path.join(HERE, name), os.path.join(d, "hw"))
        with open(os.path.join(d, "hw", "guard_h200.py"), "w") as f:
            f.write(STUB)
        with open(os.path.join(d, "bin", "nvidia-smi"), "w") as f:
            f.write(f"#!/bin/sh\necho {total_mib}\n")
        os.chmod(os.path.join(d, "bin", "nvidia-smi"), 0o755)
        for name in ("gpu-warden",) + (("gpu-warden-before",) if before else ()) + (("gpu-warden-b",) if b else ()):
            with open(os.path.join(d, "b", name), "wb") as f:
                f.write(b"x" * 4096)
            os.chmod(os.path.join(d, "b", name), 0o755)
        # WAIT_S: the batch's own wait on all.done, a safety net (it ends as soon as the file is there).
        env = dict(os.environ, OUT=os.path.join(d, "out"), LEFT=str(left), WAIT_S="300", STUB_MODE="ok",
                   OUTSTANDING_DIR=os.path.join(d, "r"), PATH=os.path.join(d, "bin") + os.pathsep + os.environ["PATH"])
        env.pop("OUTSTANDING_SWEEP", None)
        env.pop("IDLE_WATCH_RATES", None)
        env.update(extra_env)
        if sweep is not None:
            env["OUTSTANDING_SWEEP"] = sweep
        p = subprocess.run(["bash", os.path.join(d, "hw", "outstanding_h200.sh"), "start", os.path.join(d, "b")],
                           env=env, capture_output=True, text=True, timeout=360)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = os.path.join(d, "r")
        self.assertTrue(os.path.exists(os.path.join(r, "all.done")), p.stdout)
        names = subprocess.run(["tar", "tzf", os.path.join(d, "out", "outstanding.tgz")], capture_output=True,
                               text=True).stdout.split()
        self.assertFalse([n for n in names if "/bin/" in n], names)
        sweep = os.path.join(r, "guard", "argv.json")
        return json.load(open(sweep)) if os.path.exists(sweep) else None

    def test_an_h200_runs_the_failing_cells_first_with_the_time_left(self):
        sweep = self.batch(143771, 1000)
        self.assertEqual(sweep[sweep.index("--budget") + 1], "850")
        self.assertEqual(sweep[sweep.index("--train-gib") + 1], "100")
        cells = sweep[sweep.index("--sweep") + 1].split(";")
        self.assertEqual(cells[:2], ["guard*5%s=runner%h=a10g:250,128,64,16,4", "guard*5%s=two:128,64,16,4,250"])
        # Every shape at both headrooms, and the slow fresh read at both.
        for shape in ("two", "ws", "runner"):
            for hr in ("", "%h=a10g"):
                self.assertTrue(any(c.startswith(f"guard*5%s={shape}{hr}:") for c in cells), (shape, hr, cells))
        self.assertEqual(sum("%r=3s" in c for c in cells), 2)

    def test_the_cells_can_be_named_instead_of_the_table(self):
        cells = "guard*5%s=runner%h=a10g:250;guard*5%s=ws%h=a10g:250,64"
        sweep = self.batch(143771, 1000, sweep=cells)
        self.assertEqual(sweep[sweep.index("--sweep") + 1], cells)

    def test_an_h100_sets_todays_trainer_for_80_gib(self):
        sweep = self.batch(81559, 1000)
        self.assertEqual(sweep[sweep.index("--train-gib") + 1], "42")
        self.assertEqual(sweep[sweep.index("--budget") + 1], "850")

    def test_an_earlier_build_beside_it_is_measured_idle_against_it(self):
        self.assertNotIn("--idle-agents", self.batch(143771, 1000))
        sweep = self.batch(143771, 1000, before=True)
        agents = sweep[sweep.index("--idle-agents") + 1].split(",")
        self.assertEqual([os.path.basename(a) for a in agents], ["gpu-warden-before", "gpu-warden"])

    def test_the_agents_idle_cost_is_measured_at_each_watch_rate_asked(self):
        sweep = self.batch(143771, 1000, IDLE_WATCH_RATES="48Gi,256Gi")
        agents = sweep[sweep.index("--idle-agents") + 1].split(",")
        self.assertEqual([os.path.basename(a) for a in agents],
                         ["gpu-warden", "gpu-warden@48Gi", "gpu-warden@256Gi"])
        sweep = self.batch(143771, 1000, before=True, IDLE_WATCH_RATES="48Gi")
        agents = sweep[sweep.index("--idle-agents") + 1].split(",")
        self.assertEqual([os.path.basename(a) for a in agents],
                         ["gpu-warden-before", "gpu-warden", "gpu-warden@48Gi"])

    def test_a_second_build_in_the_batch_is_the_sweeps_agent_b(self):
        self.assertNotIn("--agent-b", self.batch(143771, 1000))
        sweep = self.batch(143771, 1000, b=True)
        self.assertEqual(os.path.basename(sweep[sweep.index("--agent-b") + 1]), "gpu-warden-b")

    def test_too_little_time_runs_nothing_and_still_ends(self):
        self.assertIsNone(self.batch(143771, 200))


class IdleWatchRates(unittest.TestCase):
    """An --idle-agents entry may name the watchRate its agent runs at; the row says which."""

    def test_an_entry_names_a_binary_and_maybe_a_rate(self):
        self.assertEqual(gh.idle_entry("/b/gpu-warden"), ("/b/gpu-warden", None))
        self.assertEqual(gh.idle_entry("/b/gpu-warden@48Gi"), ("/b/gpu-warden", "48Gi"))
        self.assertEqual(gh.idle_entry("/b/gpu-warden@200%"), ("/b/gpu-warden", "200%"))
        for bad in ("/b/gpu-warden@", "/b/gpu-warden@fast", "@48Gi", "/b/gpu-warden@48 Gi"):
            with self.assertRaises(SystemExit, msg=bad) as e:
                gh.idle_entry(bad)
            self.assertIn("BINARY@RATE", str(e.exception))

    def test_the_rate_is_added_to_a_copy_of_the_policy(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        policy = os.path.join(d, "policy-default-a10g-default.yaml")
        with open(policy, "w") as f:
            f.write("mode: enforce\nhard: 5%\n")
        self.assertEqual(gh.with_watch_rate(policy, None), policy)
        copy = gh.with_watch_rate(policy, "256Gi")
        self.assertNotEqual(copy, policy)
        self.assertEqual(open(copy).read(), "mode: enforce\nhard: 5%\nwatchRate: 256Gi\n")
        self.assertEqual(open(policy).read(), "mode: enforce\nhard: 5%\n")

    def test_the_report_names_each_rows_rate(self):
        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out)
        rows = [dict(binary="gpu-warden", watch_rate="default", condition="idle GPU (a10g)", seconds=15.0,
                     cpu_pct=0.2),
                dict(binary="gpu-warden", watch_rate="256Gi", condition="idle GPU (a10g)", seconds=15.0,
                     cpu_pct=0.5)]
        with contextlib.redirect_stdout(io.StringIO()):
            gr.report(out, {}, [], [], None, {"today": (1, 1)}, 1, idle_rows=rows)
        text = open(os.path.join(out, "guard-report.md")).read()
        self.assertIn("| gpu-warden | 256Gi | idle GPU (a10g) | 15.0 | 0.5 |", text)
        self.assertIn("| gpu-warden | default | idle GPU (a10g) | 15.0 | 0.2 |", text)


class BaseLoads(unittest.TestCase):
    """Every shape at today's headroom leaves about the same free memory on the card it runs
    on: TRAIN_GIB (100 on an H200, 42 on an H100) plus about 7 GiB in use. The runner shape,
    sized for the H200 only, once left 3.9 GiB free on an H100 (below hard) before any run."""

    def in_use(self, train_gib, shape):
        args = type("A", (), dict(train_gib=train_gib, workspace_gib=2))()
        train, _, small, host = gh.base_load(args, "today", shape)
        hold = float(train[train.index("--hold-gib") + 1])
        ws = float(train[train.index("--workspace-gib") + 1])
        return hold + ws + sum(small) + host

    def test_todays_shapes_fit_the_card(self):
        for train_gib in (100, 42):
            for shape in ("ws", "runner"):
                self.assertAlmostEqual(self.in_use(train_gib, shape), train_gib + 7, delta=2.5,
                                       msg=(train_gib, shape))
        # The H200's runner is the seed's: an innocent 24 GiB job beside another.
        args = type("A", (), dict(train_gib=100, workspace_gib=2))()
        self.assertEqual(gh.base_load(args, "today", "runner")[2], [24, 24])


class SettledFree(unittest.TestCase):
    """A headroom's setup reads free memory once the GPU holds no compute process: on the H100
    a process that ended 60 ms into the harness was counted, and the first shape's emulated
    A10G had 621 MiB more free than the next ones'."""

    class Nv:
        class NVMLError(Exception):
            pass

        def __init__(self, gone_after):
            self.calls, self.gone_after = 0, gone_after

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetComputeRunningProcesses(self, h):
            self.calls += 1
            return [] if self.calls > self.gone_after else [type("P", (), dict(pid=584))()]

        def nvmlDeviceGetMemoryInfo(self, h):
            free = 81079 if self.calls > self.gone_after else 80458
            return type("M", (), dict(free=free * gh.MIB))()

    def setUp(self):
        was = getattr(gh, "nv", None)
        self.addCleanup(setattr, gh, "nv", was)

    def test_waits_for_the_process_to_end(self):
        gh.nv = self.Nv(gone_after=3)
        self.assertEqual(gh.settled_free(0, timeout=30), (81079, []))
        self.assertEqual(gh.nv.calls, 4)

    def test_says_what_is_still_there_at_the_bound(self):
        gh.nv = self.Nv(gone_after=10 ** 9)
        self.assertEqual(gh.settled_free(0, timeout=0), (80458, [584]))


class Cli(unittest.TestCase):
    def test_help_and_report_only_without_pynvml(self):
        for script in ("guard_h200.py", "guard_report.py"):
            p = subprocess.run([sys.executable, os.path.join(HERE, script), "--help"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)  # a bare % in a help string broke --help
        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out)
        p = subprocess.run([sys.executable, os.path.join(HERE, "guard_h200.py"), "--report-only",
                            os.path.join(EVIDENCE, "guard-h200-faithful-kubelet-call3-runs.json"), "--out", out],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("| guard*2%h=a10g%a=kill |", open(os.path.join(out, "guard-report.md")).read())


class Budget(unittest.TestCase):
    """The sweep cannot run past its budget without a report."""

    def sweep(self, mode, budget="0", kill_after="1"):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        os.makedirs(os.path.join(d, "hw"))
        os.makedirs(os.path.join(d, "bin"))
        shutil.copy(os.path.join(HERE, "guard_sweep_h200.sh"), os.path.join(d, "hw"))
        with open(os.path.join(d, "hw", "guard_h200.py"), "w") as f:
            f.write(STUB)
        with open(os.path.join(d, "bin", "nvidia-smi"), "w") as f:
            f.write("#!/bin/sh\necho name, memory.total\n")
        os.chmod(os.path.join(d, "bin", "nvidia-smi"), 0o755)
        out = os.path.join(d, "out")
        env = dict(os.environ, OUT=out, BUDGET=budget, BACKSTOP_S="1", KILL_AFTER_S=kill_after, STUB_MODE=mode,
                   PATH=os.path.join(d, "bin") + os.pathsep + os.environ["PATH"])
        t = time.time()
        # SIGTERM blocked from the start (STUB says why); the stub unblocks it.
        p = subprocess.run(["bash", os.path.join(d, "hw", "guard_sweep_h200.sh"), "agent", "double"], env=env,
                           capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM]))
        return p, out, time.time() - t

    def test_a_harness_that_ends_in_time(self):
        p, out, _ = self.sweep("ok", budget="300")
        self.assertEqual(p.returncode, 0, p.stderr)
        argv = json.load(open(os.path.join(out, "argv.json")))
        self.assertEqual(argv[argv.index("--budget") + 1], "300")
        self.assertNotIn("--idle-agents", argv)  # the empty array under set -u
        self.assertTrue(os.path.exists(os.path.join(out, "sweep.log")))

    def test_sigterm_at_the_backstop_writes_the_report(self):
        # The SIGKILL's margin is generous here: what ends this harness is its SIGTERM handler.
        p, out, took = self.sweep("term", kill_after="60")
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("its report covers the runs that finished", p.stderr)
        self.assertIn("(timeout status 124)", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "guard-report.md")))
        self.assertLess(took, 10)

    def test_a_hung_harness_is_killed(self):
        p, out, took = self.sweep("hang")
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("no report was written", p.stderr)
        self.assertIn("(timeout status 137)", p.stderr)  # the SIGKILL, not the SIGTERM, ended it
        self.assertLess(took, 10)

    def test_a_bad_budget(self):
        p, _, _ = self.sweep("ok", budget="5m")
        self.assertEqual(p.returncode, 2)

    def test_run_estimate(self):
        self.assertEqual(gh.run_estimate(None, 20.0), 20.0 + gh.RUN_OVERHEAD_S)
        self.assertEqual(gh.run_estimate([12.0, 17.5], 40.0), 18.5)

    def test_kill_group_takes_the_job_shells_child(self):
        # Without PID namespaces the job shell's child outlived a SIGKILL of the shell alone.
        gh.PIDNS = False
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        lp = os.path.join(d, "job.log")
        code = "import json, os, time; print(json.dumps({'event': 'ready', 'pid': os.getpid()}), flush=True); time.sleep(30)"
        p = gh.spawn_in_cgroup(None, gh.as_job([sys.executable, "-c", code], "shell"), lp)
        self.assertTrue(gh.wait_ready(lp, 120))
        child = gh.ready_pid(lp)
        self.assertNotEqual(child, p.pid)
        gh.kill_group(p)

        def running(pid):
            try:  # a zombie (Z) is dead, waiting for its new parent to reap it
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        deadline = time.time() + 60  # a safety net: it is dead as soon as the SIGKILL lands
        while running(child) and time.time() < deadline:
            time.sleep(0.05)
        alive = running(child)
        self.assertFalse(alive)


class EndToEnd(unittest.TestCase):
    """The whole harness on hw/fakes (no GPU, no agent): its main loop, the greedy jobs under
    the real job shell (in a PID namespace where unshare works), the NVML pid, the counters
    from a newer publication, the run logs, the budget and SIGTERM, the report."""

    def harness(self, sweep, budget, extra=(), term_after_runs=None, after_runs=None):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        for sub in ("gpu", "cg", "work", "out"):
            os.makedirs(os.path.join(d, sub))
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "fakes"), FAKE_GPU_DIR=os.path.join(d, "gpu"),
                   GUARD_CG_ROOT=os.path.join(d, "cg"), GUARD_WORKDIR=os.path.join(d, "work"))
        out = os.path.join(d, "out")
        self.work = os.path.join(d, "work")
        cmd = [sys.executable, os.path.join(HERE, "guard_h200.py"), "--agent", os.path.join(HERE, "fakes", "agent.py"),
               "--double", os.path.join(HERE, "fakes", "double.py"), "--skip-attribution", "--hold-after-full", "1",
               "--budget", str(budget), "--out", out, "--sweep", sweep, *extra]
        log = open(os.path.join(d, "harness.log"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        t = time.time()

        def end():
            # SIGTERM first: the harness then stops what it started (its loads are sessions of
            # their own, which a SIGKILL of the harness alone would leave running).
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

        def wait_for(what, done, timeout=240):
            """Waits for an event of the running harness (`done()`): fails if the harness ends
            first; `timeout` is a safety net only."""
            deadline = time.time() + timeout
            while not done():
                if p.poll() is not None or time.time() > deadline:
                    why = "the harness ended" if p.poll() is not None else f"{timeout} s passed"
                    end()
                    self.fail(f"{why} before {what}:\n" + open(os.path.join(d, "harness.log")).read()[-3000:])
                time.sleep(0.1)

        def runs_recorded():
            try:
                return len(json.load(open(os.path.join(out, "guard-runs.json")))["results"])
            except (OSError, ValueError):  # not written yet (it is replaced whole, never partly)
                return 0

        def greedy_jobs_ready():
            """Greedy jobs that logged "ready" (one per run of a one-GPU sweep of the default shape)."""
            n = 0
            for path in glob.glob(os.path.join(self.work, "greedy-*.log")):
                try:
                    n += '"ready"' in open(path).read()
                except OSError:
                    pass
            return n
        try:
            if after_runs is not None:
                wait_for(f"{after_runs[0]} runs were recorded", lambda: runs_recorded() >= after_runs[0])
                after_runs[1]()
            if term_after_runs is not None:
                # SIGTERM into the next run: once its greedy job is up, the runs before it are
                # recorded and it is in progress (no fixed delay that a loaded machine outruns).
                wait_for(f"run {term_after_runs}'s greedy job got ready",
                         lambda: greedy_jobs_ready() > term_after_runs)
                p.send_signal(signal.SIGTERM)
            p.wait(timeout=300)
        finally:
            end()
        took = time.time() - t
        text = open(os.path.join(d, "harness.log")).read()
        # Nothing of the sweep still holds (fake) GPU memory: every load and job is gone.
        sys.path.insert(0, os.path.join(HERE, "fakes"))
        os.environ["FAKE_GPU_DIR"] = os.path.join(d, "gpu")
        import pynvml as fake_nv
        fake_nv._DIR = os.path.join(d, "gpu")
        deadline = time.time() + 60  # a safety net: SIGKILLed processes are gone at once
        while fake_nv.nvmlDeviceGetComputeRunningProcesses(0) and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(fake_nv.nvmlDeviceGetComputeRunningProcesses(0), [], text[-3000:])
        return p.returncode, out, text, took

    def test_a_sweep(self):
        # The last series runs the second agent (an A/B): a copy of the fake under another name.
        b = os.path.join(tempfile.mkdtemp(), "agent_b.py")
        self.addCleanup(shutil.rmtree, os.path.dirname(b))
        shutil.copy(os.path.join(HERE, "fakes", "agent.py"), b)
        rc, out, text, _ = self.harness("guard*2:64;none*1:64;guard*1%a=kill%b=1:64", 200, extra=("--agent-b", b))
        self.assertEqual(rc, 0, text[-3000:])
        d = json.load(open(os.path.join(out, "guard-runs.json")))
        self.assertEqual(len(d["results"]), 4)
        self.assertEqual([r["agent"] for r in d["results"]], ["agent.py", "agent.py", None, "agent_b.py"])
        pidns = gh.have_pid_namespaces()
        self.assertEqual(d["pid_namespaces"], pidns)
        if REQUIRE_PIDNS:
            self.assertTrue(pidns, "GUARD_TEST_PIDNS=1, but unshare --pid does not work here")
        for r in d["results"]:
            g = r["greedy"]["0"]
            self.assertTrue(g["pid_ok"], g)
            self.assertEqual(g["pid_how"], "script argv + NSpid")
            self.assertNotEqual(g["pid"], g["wrapper_pid"])
            x = r["per_gpu"]["0"]
            self.assertTrue(x["pid_valid"])
            # The growth of the right pid (the wrapper's shows none); the fakes on a loaded CI
            # machine grow slower than asked, so only roughly.
            self.assertTrue(32 < x["rate_measured"] < 96, x["rate_measured"])
            if r["mode"] == "guard":
                self.assertTrue(r["counters_fresh"])
                self.assertEqual(r["decision_log"]["lines"], 2)
        self.assertEqual([gr.effective_action(r) for r in d["results"]],
                         ["stop (default)", "stop (default)", "— (no agent)", "kill"])
        self.assertEqual(gr.by_result(d["results"][3]["counters"], "gpu_warden_guard_stops_total"), {"killed": 1})
        logs = gr.read_run_logs(os.path.join(out, gr.RUN_LOGS))
        self.assertEqual([(l["label"], l["run"]) for l in logs],
                         [("guard*2", 0), ("guard*2", 1), ("none*1", 0), ("guard*1%a=kill%b=1", 0)])
        self.assertIn("plan: evict 1 of 2 candidates", logs[0]["agent_lines"][0])
        self.assertNotIn("pod view synced", " ".join(logs[0]["agent_lines"]))
        self.assertIn('"ready"', logs[0]["greedy_logs"]["0"])
        # Nobody killed the jobs (the fake agent evicts nothing): each ran out and exited 0.
        self.assertEqual({r["greedy"]["0"]["job_exit"] for r in d["results"]}, {0})
        self.assertEqual(logs[0]["guard_state"]["onDecision"]["onDecision"], "stop")
        self.assertTrue(gr.read_timeline(os.path.join(out, gr.TIMELINE)))
        report = open(os.path.join(out, "guard-report.md")).read()
        self.assertRegex(report, r"\| guard\*1%a=kill%b=1 \| today \| faithful, shell \| kill \| 64 \(\d+\.\d\) \|")
        self.assertIn("| 0 / 0 / 1 | evictions evicted 1 |", report)
        self.assertIn("| none*1 | today | faithful, shell | — (no agent) |", report)
        self.assertNotIn("invalid/unknown", report)
        self.assertNotIn("†", report)
        # The report again from the files that came back, the timeline included.
        again = os.path.join(out, "again")
        with contextlib.redirect_stdout(io.StringIO()):
            gr.report_only(os.path.join(out, "guard-runs.json"), again, os.path.join(out, gr.TIMELINE))
        self.assertEqual(open(os.path.join(again, "guard-report.md")).read(), report)

    def test_a_series_of_the_second_agent_needs_it(self):
        rc, _, text, _ = self.harness("guard*1%b=1:64", 60)
        self.assertNotEqual(rc, 0)
        self.assertIn("b=1 runs the agent of --agent-b, which is not given", text)

    def test_the_neighbour_shapes_of_issue_38(self):
        # Each shape sets up its own base load; `two` starts a second greedy job on the same GPU
        # one second after the first, and each is found and reported by its own key; `r` reaches
        # the double as --slow-pod-reads.
        rc, out, text, _ = self.harness("guard*1%s=two%r=3s:64;guard*1%s=runner:64;guard*1%s=ws:64", 240)
        self.assertEqual(rc, 0, text[-3000:])
        d = json.load(open(os.path.join(out, "guard-runs.json")))
        self.assertEqual([(r["shape"], r["slow_reads"]) for r in d["results"]],
                         [("two", "3s"), ("runner", ""), ("ws", "")])
        two = d["results"][0]
        self.assertEqual(sorted(two["greedy"]), ["0", "0b"])
        for k, g in two["greedy"].items():
            self.assertTrue(g["pid_ok"], (k, g))
            self.assertEqual(g["gpu"], 0)
        self.assertNotEqual(two["greedy"]["0"]["name"], two["greedy"]["0b"]["name"])
        self.assertEqual(sorted(two["per_gpu"]), ["0", "0b"])
        # The second job's growth starts a second after the first's, both once both are up:
        # when each is up (an interpreter in a PID namespace of its own, CUDA on a GPU) is the
        # machine's doing, and on the H100 it set the gap anywhere from 0.1 to 2 s.
        rows = gr.read_timeline(os.path.join(out, gr.TIMELINE))
        first = {k: next(t for t, _, _, _, procs in rows if procs.get(g["pid"], 0) >= 1024)
                 for k, g in two["greedy"].items()}
        ready, go = {}, {}
        for k in two["greedy"]:
            [path] = glob.glob(os.path.join(self.work, f"greedy-today-guardx1-stwo-r3s-*-{k}.log"))
            events = [json.loads(l) for l in open(path) if l.startswith("{")]
            ready[k] = next(e["t"] for e in events if e["event"] == "ready")
            go[k] = next(e["t"] for e in events if e["event"] == "go")
        self.assertGreater(min(go.values()), max(ready.values()), (ready, go))
        self.assertGreater(go["0b"] - go["0"], 0.95, go)
        self.assertGreater(first["0b"] - first["0"], 0.7, (first, go))
        # What each run's double was started with (hw/fakes/double.py records it).
        starts = [json.loads(l) for l in open(os.path.join(self.work, "fixtures-run.json.starts"))]
        self.assertEqual(len(starts), 3)
        self.assertEqual(starts[0]["argv"][-2:], ["--slow-pod-reads", "3s"])
        self.assertNotIn("--slow-pod-reads", starts[1]["argv"])

        def pod(start, name):
            return next(p for p in start["fixtures"]["pods"] if p["metadata"]["name"] == name)
        # `two`: both greedy pods are served; `runner`: the "train" pod is a CI job at priority 0
        # with its declaration (48 + 8 GiB), beside two steady 24 GiB jobs; `ws`: the trainer.
        self.assertEqual({pod(starts[0], g["name"])["metadata"]["namespace"] for g in two["greedy"].values()}, {"ci"})
        runner = pod(starts[1], "train-0")
        self.assertEqual((runner["metadata"]["namespace"], runner["spec"]["priority"]), ("ci", 0))
        self.assertEqual(runner["metadata"]["annotations"], {"gpu-warden.io/vram-request-mib": "57344"})
        self.assertEqual(pod(starts[2], "train-0")["metadata"]["namespace"], "ml")
        # Each shape's base load logs to its own files, each with one "ready": a log shared by
        # the shapes of a headroom answered the next shape's readiness wait at once.
        small = sorted(l for l in os.listdir(self.work) if l.startswith("small-today-"))
        self.assertEqual(small, ["small-today-runner-0-0.log", "small-today-runner-0-1.log",
                                 "small-today-two-0-0.log", "small-today-ws-0-0.log"])
        for name in small + [l for l in os.listdir(self.work) if l.startswith("train-today-")]:
            self.assertEqual(open(os.path.join(self.work, name)).read().count('"ready"'), 1, name)

    def test_the_budget_skips_runs_that_would_not_end_in_it(self):
        # 70 s: the headroom's setup fits (45 s kept for it), then runs of ~5 s until the
        # estimate no longer fits before 70 - 15 s.
        budget = 70
        rc, out, text, took = self.harness("guard*20:64", budget)
        self.assertEqual(rc, 0, text[-3000:])
        d = json.load(open(os.path.join(out, "guard-runs.json")))
        self.assertTrue(0 < len(d["results"]) < 20, len(d["results"]))
        self.assertEqual(len(d["results"]) + len(d["meta"]["skipped"]), 20)
        self.assertLessEqual(d["meta"]["ended_after_s"], budget)
        self.assertIn("Skipped to stay inside the budget", open(os.path.join(out, "guard-report.md")).read())

    def test_a_trainer_that_died_is_restarted_and_the_budget_stands(self):
        # The restart's own wait once reused the name of the budget's deadline: a sweep that
        # restarted a trainer then ran on past its budget.
        def kill_trainer():
            os.kill(gh.ready_pid(os.path.join(self.work, "train-today-trainer-0.log")), signal.SIGKILL)
        rc, out, text, _ = self.harness("guard*20:64", 70, after_runs=(1, kill_trainer))
        self.assertEqual(rc, 0, text[-3000:])
        d = json.load(open(os.path.join(out, "guard-runs.json")))
        self.assertIn([0], [r["train_restarted_before"] for r in d["results"]], text[-2000:])
        self.assertTrue(d["meta"]["skipped"])
        self.assertLessEqual(d["meta"]["ended_after_s"], 70)

    def test_sigterm_mid_sweep_reports_the_finished_runs(self):
        rc, out, text, _ = self.harness("guard*5:16", 300, term_after_runs=1)
        self.assertEqual(rc, 0, text[-3000:])
        d = json.load(open(os.path.join(out, "guard-runs.json")))
        self.assertGreaterEqual(len(d["results"]), 1)
        self.assertLess(len(d["results"]), 5)
        self.assertEqual(d["meta"]["interrupted"], "SIGTERM")
        report = open(os.path.join(out, "guard-report.md")).read()
        self.assertIn("**Stopped by SIGTERM**", report)


if __name__ == "__main__":
    unittest.main(verbosity=2, warnings="ignore")
