"""Orchestrates `paritywatch demo`: backend (unless --url), model directory, trainer + workers,
the story in the terminal, one JSON summary line at the end.

The story: a healthy async GRPO run trains for a few hundred steps; then an autoscaler adds a
rollout worker that loads the processor by model name (TRL's processing_class bug); the
alignment metrics jump on its batches, the alert fires and Paritywatch pauses the run.

Stopping (Ctrl-C, SIGTERM, the end of --duration) ends every process the demo started: the
workers first (they close their monitors), then the backend."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from paritywatch.demo.command import JOIN_AT_FRACTION, JOIN_DEADLINE_S, MIN_HEALTHY_STEPS
from paritywatch.demo.model_dir import build_model_dir
from paritywatch.demo.processes import RECORDS_QUEUE_SLOTS, Channels, Job, rollout_main, set_parent_death_signal, trainer_main

PROJECT = "demo"
JUMPING_KEY = "align/prompt_rerender_mismatch_frac"
MISMATCH_GRACE_S = 30.0  # after a pause by the alignment rule, how long to wait for the fingerprint's alert
STOP_TIMEOUT_S = 20.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: for a demo that seems stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    demo = Demo(args)
    try:
        return demo.run()
    except KeyboardInterrupt:
        log("interrupted: stopping the demo's processes and backend")
        return 130
    except httpx.HTTPStatusError as exc:
        log(_refused(exc))
        return 1
    except httpx.HTTPError as exc:
        log(f"the backend at {demo.url} stopped answering ({exc!r}): stopping the demo")
        return 1
    finally:
        with _stop_signals_ignored():  # a second Ctrl-C must not cut the cleanup short
            demo.close()


def _refused(exc: httpx.HTTPStatusError) -> str:
    """What to do when the backend refused the demo's reads."""
    url = exc.request.url
    if exc.response.status_code in (401, 403):
        return (f"the backend refused the demo ({exc.response.status_code} on {url.path}): its database has "
                "API tokens, so it requires one. Set PARITYWATCH_TOKEN to an admin token, or give the demo a "
                "database of its own: paritywatch demo --db sqlite:///paritywatch-demo.db")
    return f"the backend answered {exc.response.status_code} on {url.path}: {exc.response.text[:300]}"


def _exit_on_sigterm(signum, frame) -> None:  # noqa: ANN001
    raise SystemExit(128 + signum)  # unwinds through main's `finally`, which ends the children


@contextlib.contextmanager
def _stop_signals_ignored():
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Demo:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.server: subprocess.Popen | None = None
        self.procs: DemoProcesses | None = None
        self.api: httpx.Client | None = None
        self.joined_at: int | None = None
        self.url: str | None = args.url

    def run(self) -> int:
        args = self.args
        self.url = url = args.url or self._start_server()
        token = os.environ.get("PARITYWATCH_TOKEN")
        self.api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=10)
        self._get("/api/v1/runs", limit=1)  # refused (a token needed)? say so before building anything
        model_dir = Path(args.model_dir or Path.home() / ".cache" / "paritywatch" / "demo-model")
        log(f"building the tiny model and tokenizer in {model_dir} ...")
        build_model_dir(model_dir)
        run_name = f"async-grpo-{'healthy' if args.healthy else 'buggy'}-{datetime.now():%Y%m%d-%H%M%S}"
        job = Job(url=url, run=run_name, project=PROJECT, model_dir=str(model_dir), token=token)
        self.procs = DemoProcesses(job, args)
        self.procs.start()
        log(f"run {PROJECT}/{run_name}: 1 trainer + {args.workers} rollout workers, training healthily"
            + ("" if args.healthy else f"; at step {args.bad_worker_at} an autoscaler adds a worker that loads the "
                                       "processor by model name (the TRL bug)"))
        run_id = self._wait_for_run(run_name)
        dashboard = f"{url}/#/runs/{run_id}"
        log(f"dashboard: {dashboard}  (the charts fill in live)")
        ending = self._watch(run_id)
        if ending != "paused":  # a clean end: the processes close, the run is `finished`
            self.procs.stop()
        summary = self._summary(run_id, run_name, dashboard)
        if ending == "paused":
            self._tell_what_to_click(dashboard, summary)
        print(json.dumps(summary), flush=True)
        if ending == "trainer_done" and self.procs.trainer.exitcode:
            log(f"the demo's trainer failed (exit code {self.procs.trainer.exitcode}; its error is above)")
            return 1
        if args.duration is None and self.server is not None:
            log("the dashboard stays up; Ctrl-C to quit")
            self.server.wait()
        elif args.duration is None and ending == "paused":  # --url: the processes wait for Resume or Stop
            log("the demo's processes wait for Resume or Stop in the dashboard; Ctrl-C to quit")
            signal.pause()
        return 0

    def close(self) -> None:
        if self.procs is not None:
            self.procs.stop()
        if self.api is not None:
            self.api.close()
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    # ------------------------------------------------------------------ the backend
    def _start_server(self) -> str:
        args = self.args
        url = f"http://{args.host}:{args.port}"
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            raise SystemExit(f"something already listens on {url}: stop it, or pass --url {url} to use it")
        except httpx.HTTPError:
            pass
        cmd = [sys.executable, "-m", "paritywatch.backend.cli", "serve", "--host", args.host, "--port", str(args.port),
               "--log-level", "warning"]
        if args.db:
            cmd += ["--db", args.db]
        # Its own session: the terminal's Ctrl-C reaches the demo, which stops the backend last.
        self.server = subprocess.Popen(cmd, start_new_session=True, preexec_fn=set_parent_death_signal)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise SystemExit("the backend failed to start (see above)")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("the backend did not answer within 60 s")

    # ------------------------------------------------------------------ the run
    def _get(self, path: str, **params: Any) -> Any:
        """A read of the API; an error answer raises (main() says what to do about it)."""
        res = self.api.get(path, params=params)
        res.raise_for_status()
        return res.json()

    def _wait_for_run(self, name: str) -> int:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            for r in self._get("/api/v1/runs", project=PROJECT)["runs"]:
                if r["name"] == name:
                    return r["id"]
            if not self.procs.trainer.is_alive():
                raise SystemExit("the demo's trainer exited before its run registered (see above)")
            time.sleep(0.3)
        raise SystemExit("the demo processes did not register within 180 s")

    def _watch(self, run_id: int) -> str:
        """Until the story is told ("paused"), the time is up ("duration") or the trainer ended."""
        duration = self.args.duration
        started = time.monotonic()
        last_line = ""
        paused_since = None
        while True:
            run = self._get(f"/api/v1/runs/{run_id}")
            alerts = self._get(f"/api/v1/runs/{run_id}/alerts", status="open")["alerts"]
            step = run["last_step"] or 0
            elapsed = time.monotonic() - started
            if self._should_join(step, elapsed):
                self.procs.let_the_wrong_worker_join()
                self.joined_at = step
                log(f"step {step}: an autoscaler adds rollout worker {self.procs.late_worker_id}; it loads the "
                    "processor by model name instead of the trainer's processing_class")
            line = (f"step {step // 25 * 25:>5}+ | state {run['control']['state']:<8} | {len(run['components'])} processes"
                    f" | {len(alerts)} open alert(s)" + "".join(f"\n    {a['severity']}: {a['title']}" for a in alerts))
            if line != last_line:
                log(line)
                last_line = line
            if self.joined_at is not None and run["control"]["state"] == "paused" and alerts:
                # Told once both detectors spoke (whichever paused the run): the processor fingerprint's
                # alert, and the wrong worker's batch in the alignment metrics (sent a flush later).
                paused_since = paused_since or time.monotonic()
                both = (any(a["kind"] == "processor_mismatch" for a in alerts)
                        and self._first_misaligned_step(run_id) is not None)
                if both or time.monotonic() - paused_since > MISMATCH_GRACE_S:
                    return "paused"
            if duration is not None and elapsed >= duration:
                return "duration"
            if not self.procs.trainer.is_alive():
                return "trainer_done"
            time.sleep(0.5)

    def _should_join(self, step: int, elapsed: float) -> bool:
        if self.procs.late is None or self.joined_at is not None:
            return False
        if step >= self.args.bad_worker_at:
            return True
        deadline = JOIN_DEADLINE_S if self.args.duration is None else JOIN_AT_FRACTION * self.args.duration
        return step >= min(MIN_HEALTHY_STEPS, self.args.bad_worker_at) and elapsed >= deadline

    def _summary(self, run_id: int, name: str, dashboard: str) -> dict:
        run = self._get(f"/api/v1/runs/{run_id}")
        alerts = self._get(f"/api/v1/runs/{run_id}/alerts")["alerts"]
        return {
            "run": name,
            "run_id": run_id,
            "run_state": run["control"]["state"],
            "alerts": [{"kind": a["kind"], "severity": a["severity"], "status": a["status"], "step": a["step"],
                        "components": a["detail"].get("components", [])} for a in alerts],
            "dashboard": dashboard,
            "last_step": run["last_step"],
            "bad_worker_joined_at_step": self.joined_at,
            "first_misaligned_step": self._first_misaligned_step(run_id),
        }

    def _first_misaligned_step(self, run_id: int) -> int | None:
        """The first step whose batch held the wrong worker's groups (None if none was scored)."""
        if self.joined_at is None:
            return None
        res = self.api.get(f"/api/v1/runs/{run_id}/series",
                           params={"key": JUMPING_KEY, "step_min": self.joined_at, "points": 4000})
        if res.status_code != 200:
            return None
        b = res.json()["buckets"]
        return next((step for step, high in zip(b["step"], b["max"]) if high > 0), None)

    def _tell_what_to_click(self, dashboard: str, summary: dict) -> None:
        log("")
        log(f"Paritywatch paused the run at step {summary['last_step']}. Open {dashboard}")
        log("  - the red banner: the new worker renders prompts with another chat template; "
            "'Show diff' opens both templates side by side")
        first = summary["first_misaligned_step"]
        jump = f"jumps from 0 to 1 at step {first}, the first batch of its groups" if first is not None else "stays 0"
        log(f"  - Metrics: {JUMPING_KEY} {jump} (the worker joined at step {self.joined_at}); "
            "the ▼ above a chart marks an alert")
        log("  - the run's controls: Resume or Stop it (this is what an on-call engineer decides)")
        log("")


class DemoProcesses:
    """The trainer, the healthy rollout workers and (unless --healthy) the wrong worker, which is
    started with the others but held back until it joins: loading torch takes seconds on a busy
    machine, and the story wants it to join at a chosen step."""

    def __init__(self, job: Job, args: argparse.Namespace):
        ctx = mp.get_context("spawn")
        self.channels = Channels(records=ctx.Queue(maxsize=RECORDS_QUEUE_SLOTS), stop=ctx.Event())
        n = args.workers + (0 if args.healthy else 1)
        self.weights = [ctx.Queue(maxsize=2) for _ in range(n)]
        self.entered: dict[str, Any] = {}  # process name -> its Channels.entered flag

        def channels(name: str, **extra: Any) -> Channels:
            self.entered[name] = flag = ctx.RawValue("b", 0)
            return dataclasses.replace(self.channels, entered=flag, **extra)

        self.trainer = ctx.Process(target=trainer_main, args=(job, channels("trainer"), self.weights, args.steps, 0),
                                   name="trainer", daemon=True)
        self.workers = [ctx.Process(target=rollout_main, args=(job, f"worker-{i}", False, channels(f"rollout-{i}"),
                                                               self.weights[i], 100 + i),
                                    name=f"rollout-{i}", daemon=True) for i in range(args.workers)]
        self.late = self.join = None
        self.late_worker_id = f"worker-{args.workers}"
        if not args.healthy:
            self.join = ctx.Event()
            held = channels("rollout-autoscaled", join=self.join)
            self.late = ctx.Process(target=rollout_main, args=(job, self.late_worker_id, True, held, self.weights[-1], 100 + n),
                                    name="rollout-autoscaled", daemon=True)
        self.started: list = []

    def all(self) -> list:
        return [self.trainer, *self.workers, *([self.late] if self.late else [])]

    def start(self) -> None:
        for p in self.all():
            p.start()
            self.started.append(p)

    def let_the_wrong_worker_join(self) -> None:
        self.join.set()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask every process in the run to close its monitor and leave; terminate the ones that do
        not, and at once the ones still starting (importing torch can take longer than the timeout
        on a busy machine, and they have no monitor to close)."""
        self.channels.stop.set()
        for p in self.started:
            if not self.entered[p.name].value:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.started:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.started:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.channels.records, *self.weights):
            q.close()
            q.cancel_join_thread()
        self.started = []
