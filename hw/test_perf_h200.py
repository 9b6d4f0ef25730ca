#!/usr/bin/env python3
"""Offline tests of the performance harness (hw/perf_h200.py): no GPU, no pynvml.
`python3 hw/test_perf_h200.py` (CI runs it, scripts/test.sh)."""
import http.server
import os
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import perf_h200 as ph  # noqa: E402  (imports without pynvml)


class ScrapeOrder(unittest.TestCase):
    """The exporter read first after the second's idle answers slower, so the scraper changes
    which one comes first every round (an H100 run once charged that to one agent)."""

    def test_each_exporter_is_read_first_in_turn(self):
        arrivals = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                arrivals.append(self.server.server_port)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"x 1\n")

            def log_message(self, *args):
                pass

        servers = [http.server.HTTPServer(("127.0.0.1", 0), Handler) for _ in range(3)]
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
            self.addCleanup(s.server_close)
            self.addCleanup(s.shutdown)
        names = [f"exporter-{i}" for i in range(3)]
        for n in names:
            ph.XCHECK.setdefault(n, [])
        scraper = ph.Scraper({n: s.server_port for n, s in zip(names, servers)})
        scraper.start()
        deadline = time.monotonic() + 60  # a safety net: three rounds take about 2 s
        while len(scraper.rounds) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        scraper.stop()
        self.assertGreaterEqual(len(scraper.rounds), 3)
        ports = [s.server_port for s in servers]
        firsts = [ports.index(arrivals[i]) for i in range(0, 9, 3)]
        self.assertEqual(sorted(firsts), [0, 1, 2], f"first of each round: {firsts}")
        for n in names:
            self.assertEqual(len(scraper.lat[n]), len(scraper.rounds))


if __name__ == "__main__":
    unittest.main(verbosity=2)
