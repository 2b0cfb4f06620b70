"""The `paritywatch demo` subcommand's arguments, apart from the demo itself: every `paritywatch`
command builds this parser, and the demo's imports (httpx, the processes) cost most of a second."""
from __future__ import annotations

import argparse

JOIN_AT_FRACTION = 0.75  # with --duration: the wrong worker joins by this share of it at the latest
JOIN_DEADLINE_S = 120.0  # without: after this much training at the latest (a slow machine still shows the story)
MIN_HEALTHY_STEPS = 100  # never earlier: the story needs healthy curves before the change


def add_demo_command(sub) -> None:  # noqa: ANN001
    p = sub.add_parser("demo", help="run the dashboard with a simulated async GRPO run (the TRL bug)",
                       description=("Start the backend on SQLite and a simulated async GRPO run: one trainer and "
                                    "rollout-worker processes with a real tokenizer and a tiny random-weight model. "
                                    "It trains healthily, then an autoscaler adds a worker that loads the default "
                                    "processor (TRL's processing_class bug): the alignment metrics jump, Paritywatch "
                                    "raises the alerts and pauses the run. --healthy: no such worker, no alert."))
    p.add_argument("--healthy", action="store_true", help="no wrong worker joins: no alert, the run ends finished")
    p.add_argument("--duration", type=float, default=None,
                   help="exit after this many seconds of training, or once the run is paused (default: run "
                        "until the story is told, then keep the dashboard up until Ctrl-C)")
    p.add_argument("--workers", type=int, default=2, help="healthy rollout worker processes (default 2)")
    p.add_argument("--bad-worker-at", type=int, default=200, metavar="STEP",
                   help=f"trainer step at which the wrong worker joins (default 200; earlier, though not before step "
                        f"{MIN_HEALTHY_STEPS}, after {JOIN_DEADLINE_S:.0f} s of training or {JOIN_AT_FRACTION * 100:.0f}%% of --duration)")
    p.add_argument("--steps", type=int, default=2000, help="trainer steps (default 2000)")
    p.add_argument("--url", help="use a running backend instead of starting one")
    p.add_argument("--db", help="database URL for the started backend (default: ./paritywatch.db)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8321)
    p.add_argument("--model-dir", default=None, help="where to build the tiny model (default: a cache folder)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from paritywatch.demo.run import main

    return main(args)
