#!/usr/bin/env python3
"""An API double that only says it is up (hw/fakes/README.md): writes --kubeconfig-out,
prints its URL, and waits for SIGTERM."""
import signal
import sys
import time

a = sys.argv
open(a[a.index("--kubeconfig-out") + 1], "w").write("apiVersion: v1\nkind: Config\n")
print("http://" + a[a.index("--listen") + 1], flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
