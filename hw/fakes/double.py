#!/usr/bin/env python3
"""An API double that only says it is up (hw/fakes/README.md): writes --kubeconfig-out,
prints its URL, and waits for SIGTERM; records each start's argv and fixtures in
<fixtures>.starts."""
import signal
import sys
import time

a = sys.argv
# What it was started with, for the tests: one line per start beside the fixtures file.
if "--fixtures" in a:
    import json
    fx = a[a.index("--fixtures") + 1]
    with open(fx + ".starts", "a") as f:
        f.write(json.dumps({"argv": a[1:], "fixtures": json.load(open(fx))}) + "\n")
open(a[a.index("--kubeconfig-out") + 1], "w").write("apiVersion: v1\nkind: Config\n")
print("http://" + a[a.index("--listen") + 1], flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
