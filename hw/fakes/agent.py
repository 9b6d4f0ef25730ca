#!/usr/bin/env python3
"""An agent that serves /state and /metrics (hw/fakes/README.md): snapshot.seq moves on every
0.25 s, the guard's onDecision is the policy's (stop unset), and it logs, as tracing's JSON
does, one decision line, one outcome line and one line the harness should not keep."""
import json
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

a = sys.argv
host, port = a[a.index("--listen") + 1].rsplit(":", 1)
policy = open(a[a.index("--guard-config") + 1]).read()
action = next((l.split(":", 1)[1].strip() for l in policy.splitlines() if l.startswith("onDecision:")), "stop")
t0 = time.time()


def line(level, message, **fields):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1e6):06d}Z"
    print(json.dumps({"timestamp": stamp, "level": level, "fields": dict(message=message, **fields)}),
          file=sys.stderr, flush=True)


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        seq = int((time.time() - t0) / 0.25)
        if self.path == "/state":
            body = json.dumps({"snapshot": {"seq": seq}, "guard": {
                "held": None, "recentDecisions": [],
                "onDecision": {"onDecision": action, "permitted": True, "notPermittedReason": None,
                               "stopped": [], "recent": []}}})
        else:
            body = ("gpu_warden_guard_stop_permitted 1\n"
                    f'gpu_warden_guard_stops_total{{result="{"killed" if action == "kill" else "stopped"}"}} 1\n'
                    'gpu_warden_evictions_total{namespace="ci",result="evicted"} 1\n')
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_):
        pass


srv = ThreadingHTTPServer((host, int(port)), H)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
line("INFO", "pod view synced", pods=4)
line("WARN", "GPU 0 (GPU-fake): plan: evict 1 of 2 candidates [ci/ci-greedy] to reclaim 1.0 GiB",
     gpu=0, decision=1, mode="enforce", trigger="early_trend")
line("WARN", "pod evicted to relieve GPU memory pressure", decision=1, pod="ci-greedy", rank=1, use_mib=1024)
srv.serve_forever()
