"""One training or rollout process for tests/e2e/test_run_lifecycle.py: a real ParityMonitor that
logs a step every 0.5 s until it reads "close" on stdin, then closes and exits.

    python -m tests.e2e.lifecycle_process URL RUN SIDE WORKER_ID SPOOL_DIR
"""
from __future__ import annotations

import sys
import threading
import time

from trainer_hooks.monitor import ParityMonitor


def main() -> int:
    url, run, side, worker_id, spool = sys.argv[1:6]
    monitor = ParityMonitor(run, project="lifecycle", side=side, url=url, worker_id=worker_id, spool_dir=spool,
                            flush_interval_s=0.5, heartbeat_interval_s=1.0, poll_timeout_s=2.0)
    closing = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), closing.set()), daemon=True).start()
    deadline = time.monotonic() + 30
    while monitor.state == "unknown" and time.monotonic() < deadline:  # the server's first answer
        time.sleep(0.01)
    print("ready", monitor.state, flush=True)
    step = 0
    while not closing.wait(0.5):
        monitor.wait_if_paused(timeout=1.0)
        monitor.log({f"{side}/loss": 1.0 / (step + 1)}, step)
        step += 1
    delivered = monitor.close(timeout=10.0)
    print("closed", delivered, monitor.state, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
