"""`ParityMonitor`: the object a training or rollout process holds.

Usage::

    from trainer_hooks import ParityMonitor

    with ParityMonitor("grpo-qwen-7b", side="trainer") as monitor:
        monitor.register_processor(tokenizer, model.generation_config)
        for step, batch in enumerate(loader):
            monitor.wait_if_paused()          # blocks while the run is paused
            if monitor.should_stop:
                break
            loss = train_step(batch)
            monitor.log({"loss": loss}, step)  # enqueue only: never blocks, never raises

Like sentry-python's client it never hurts its host: `log()` only appends to a bounded queue;
network, disk and fingerprint work run on daemon threads inside a guard that swallows and counts
its own exceptions. Batches carry (client_id, seq), so retries and spool replays never duplicate.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import logging
import os
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from .control import ControlPoller, ControlState
from .spool import Spool
from .transport import LogOnce, Transport, TransportConfig, TransportError
from .worker import ComponentKey, Registry, RunKey, Worker

log = logging.getLogger("paritywatch")

DEFAULT_URL = "http://127.0.0.1:8321"
SIDES = ("trainer", "rollout")
_T = TypeVar("_T")
_LIVE: "weakref.WeakSet[ParityMonitor]" = weakref.WeakSet()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _default_worker_id(side: str) -> str:
    rank = os.environ.get("RANK")
    if rank is not None:
        return f"{side}-rank{rank}"
    return f"{socket.gethostname()}-{os.getpid()}"


def _default_spool_dir(url: str) -> Path:
    """One directory per backend URL: leftovers are only ever replayed to where they were headed."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "paritywatch" / "spool" / hashlib.sha1(url.encode()).hexdigest()[:12]


def _guarded(default: Any) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """SDK work must never raise into the host: swallow, count, log the first of each kind."""

    def decorate(method: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(method)
        def wrapper(self: "ParityMonitor", *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                self._internal_errors += 1
                self._log_once.warning((method.__name__, type(exc)), "paritywatch: %s failed: %r",
                                       method.__name__, exc)
                return default

        return wrapper

    return decorate


class ParityMonitor:
    """Metrics, fingerprints, heartbeats and run control for one process of a run.

    `run` is a run name (created or reused within `project`) or the int id of an existing run.
    Defaults come from PARITYWATCH_URL, PARITYWATCH_TOKEN, PARITYWATCH_RUN, PARITYWATCH_PROJECT,
    PARITYWATCH_WORKER_ID and PARITYWATCH_SPOOL_DIR; PARITYWATCH_DISABLED=1 makes it a no-op.
    """

    def __init__(
        self,
        run: str | int | None = None,
        *,
        side: str = "trainer",
        url: str | None = None,
        token: str | None = None,
        project: str | None = None,
        worker_id: str | None = None,
        fail_closed: bool = False,
        spool_dir: str | os.PathLike[str] | None = None,
        max_queue: int = 100_000,
        flush_interval_s: float = 1.0,
        heartbeat_interval_s: float = 10.0,
        max_batch_points: int = 10_000,
        spool_max_bytes: int = 64 << 20,
        max_backoff_s: float = 10.0,
        poll_timeout_s: float = 25.0,
        request_timeout_s: float = 10.0,
        atexit_timeout_s: float = 2.0,
        tags: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        enabled: bool | None = None,
    ) -> None:
        # Wrong arguments fail here, loudly, never later inside a training step.
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        if run is not None and (isinstance(run, bool) or not isinstance(run, (str, int))):
            raise TypeError(f"run must be a run name (str) or run id (int), not {type(run).__name__}")
        if max_queue < 1 or flush_interval_s <= 0:
            raise ValueError("max_queue must be >= 1 and flush_interval_s > 0")
        self._init_args = dict(locals())
        del self._init_args["self"]
        self.side = side
        self.url = (url or os.environ.get("PARITYWATCH_URL") or DEFAULT_URL).rstrip("/")
        self.enabled = (not _env_flag("PARITYWATCH_DISABLED")) if enabled is None else enabled
        self.fail_closed = fail_closed
        self.atexit_timeout_s = atexit_timeout_s
        self._explicit_worker_id = worker_id or os.environ.get("PARITYWATCH_WORKER_ID")
        self._internal_errors = 0
        self._log_once = LogOnce()
        self._closed = False
        self._last_step = 0
        self._processor: Any = None
        self._pid = os.getpid()
        self._run_key = self._resolve_run_key(run, project)
        self._transport_config = TransportConfig(
            url=self.url, token=token or os.environ.get("PARITYWATCH_TOKEN"), timeout_s=request_timeout_s
        )
        self._spool_dir = Path(spool_dir or os.environ.get("PARITYWATCH_SPOOL_DIR") or _default_spool_dir(self.url))
        self._spool_max_bytes = spool_max_bytes
        self._registry = Registry(self._run_key, self._component_key(), dict(tags or {}), dict(config or {}))
        self._control = ControlState(fail_closed=fail_closed)
        self._worker = Worker(
            transport_factory=self._new_transport,
            registry=self._registry,
            spool_factory=self._new_spool,
            max_queue=max_queue,
            flush_interval_s=flush_interval_s,
            max_batch_points=max_batch_points,
            heartbeat_interval_s=heartbeat_interval_s,
            max_backoff_s=max_backoff_s,
            on_control=self._control.observe,
        )
        self._poller = ControlPoller(
            self._control,
            transport_factory=self._new_transport,
            resolve_run_id=lambda transport: self._registry.ids(transport)[0],
            poll_timeout_s=poll_timeout_s,
            max_backoff_s=max_backoff_s,
        )
        if self.enabled:
            _LIVE.add(self)
            self._start_threads()

    # ------------------------------------------------------------ construction helpers

    @staticmethod
    def _resolve_run_key(run: str | int | None, project: str | None) -> RunKey:
        project = project or os.environ.get("PARITYWATCH_PROJECT") or "default"
        if isinstance(run, int):
            return RunKey(run_id=run, project=project)
        name = run or os.environ.get("PARITYWATCH_RUN")
        if not name:
            name = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}"
            log.warning("paritywatch: no run name given (run= or PARITYWATCH_RUN); using %r. "
                        "Trainer and rollout workers must share a run name.", name)
        return RunKey(name=name, project=project)

    def _component_key(self) -> ComponentKey:
        worker_id = self._explicit_worker_id or _default_worker_id(self.side)
        return ComponentKey(self.side, worker_id, socket.gethostname(), os.getpid())

    def _new_transport(self) -> Transport:
        return Transport(self._transport_config)

    def _new_spool(self, owner: str) -> Spool:
        return Spool(self._spool_dir, owner, max_bytes=self._spool_max_bytes)

    def _start_threads(self) -> None:
        self._worker.start()
        self._worker.kick()  # register the component and replay leftovers now, not after a tick
        self._poller.start()

    def _after_fork(self) -> None:
        """First call in a forked child: a fresh client id, queue, threads, sockets and spool file.
        The parent's queued points stay the parent's to send."""
        self._pid = os.getpid()
        self._log_once = LogOnce()
        self._registry.after_fork(self._component_key())
        self._worker.reset_after_fork()
        self._control.reset_after_fork()
        self._poller.reset_after_fork()
        _register_fork_finalizer(self)
        if self.enabled and not self._closed:
            self._start_threads()

    # ------------------------------------------------------------ the hot path

    def log(self, metrics: Mapping[str, float], step: int) -> bool:
        """Queue metrics for `step`. Enqueue only: never blocks, never raises. False when dropped."""
        try:
            if self._closed or not self.enabled:
                return False
            if self._pid != os.getpid():
                self._after_fork()
            self._last_step = step
            return self._worker.submit(step, metrics)
        except Exception:
            self._internal_errors += 1
            return False

    # ------------------------------------------------------------ processors and rollouts

    @_guarded(default=None)
    def register_processor(self, processor: Any, generation_config: Any = None) -> "concurrent.futures.Future[dict[str, Any]]":
        """Fingerprint `processor` on a background thread and send it to the backend.
        Returns a Future of the fingerprint (its exception if fingerprinting failed)."""
        self._processor = processor
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        thread = threading.Thread(target=self._fingerprint_in_background, args=(processor, generation_config, future),
                                  name="paritywatch-fingerprint", daemon=True)
        thread.start()
        return future

    def _fingerprint_in_background(self, processor: Any, generation_config: Any,
                                   future: "concurrent.futures.Future[dict[str, Any]]") -> None:
        try:
            from .fingerprint import fingerprint_processor  # lazy: may import transformers

            fingerprint = fingerprint_processor(processor, generation_config)
            self.register_fingerprint(fingerprint)
            future.set_result(fingerprint)
        except Exception as exc:
            self._internal_errors += 1
            self._log_once.warning(("fingerprint", type(exc)), "paritywatch: could not fingerprint the processor: %r", exc)
            future.set_exception(exc)

    @_guarded(default=False)
    def register_fingerprint(self, fingerprint: Mapping[str, Any]) -> bool:
        """Send an already computed fingerprint (must carry its "digest")."""
        if not self.enabled or self._closed:
            return False
        if not isinstance(fingerprint.get("digest"), str):
            raise ValueError("fingerprint has no 'digest'")
        if self._pid != os.getpid():
            self._after_fork()
        self._worker.submit_fingerprint(dict(fingerprint))
        return True

    @_guarded(default=False)
    def log_rollout_batch(self, records: Any, processor: Any = None, trainer_logprobs: Any = None,
                          step: int | None = None) -> bool:
        """Compute the per-batch alignment metrics (docs: DESIGN.md) and log them.
        Runs on the caller's thread (a few ms for 64 x 1,024 tokens); never raises."""
        from .alignment import compute_alignment_metrics  # lazy: may import numpy / torch

        processor = processor if processor is not None else self._processor
        metrics = compute_alignment_metrics(records, processor, trainer_logprobs=trainer_logprobs)
        return self.log(metrics, self._last_step if step is None else step)

    # ------------------------------------------------------------ control

    def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Block while the run is paused; returns on resume or stop (check `should_stop`).
        False only when `timeout` ran out while still paused. Fail-open unless fail_closed."""
        try:
            if not self.enabled or self._closed:
                return True
            if self._pid != os.getpid():
                self._after_fork()
            return self._control.wait_if_paused(timeout)
        except Exception:
            self._internal_errors += 1
            return True

    @property
    def state(self) -> str:
        """"running", "paused", "stopping", "stopped", or "unknown" before the server answered."""
        return self._control.state if self.enabled else "disabled"

    @property
    def should_stop(self) -> bool:
        return self.enabled and self._control.should_stop

    @property
    def reachable(self) -> bool:
        return self._control.reachable

    # ------------------------------------------------------------ lifecycle

    @_guarded(default=False)
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything logged so far reached the backend; False at the deadline."""
        if not self.enabled or self._closed:
            return False
        return self._worker.flush(timeout)

    def close(self, timeout: float = 5.0) -> bool:
        """Flush with a deadline, then stop. Unsent points stay in the spool for a later process.
        A trainer closing while its run is `stopping` reports that its loop has ended, and the
        run becomes `stopped`."""
        if self._closed or not self.enabled:
            return True
        self._closed = True
        try:
            _LIVE.discard(self)
            self._poller.stop()
            deadline = time.monotonic() + timeout
            delivered = self._worker.close(timeout)
            self._acknowledge_stop(max(0.5, deadline - time.monotonic()))
            return delivered
        except Exception:
            self._internal_errors += 1
            return False

    def _acknowledge_stop(self, timeout: float) -> None:
        """Only the trainer answers for the run: rollout workers end when it does."""
        ids = self._registry.own_ids()
        if self.side != "trainer" or self._control.state != "stopping" or ids is None:
            return
        run_id, component_id = ids
        transport = self._new_transport()
        try:
            control = transport.request("POST", f"/runs/{run_id}/control/stopped",
                                        json={"component_id": component_id}, timeout=timeout)
            self._control.observe(control)
        except TransportError as exc:
            log.warning("paritywatch: could not report that the run stopped (the server marks it stopped once "
                        "the run's heartbeats cease): %s", exc)
        finally:
            transport.close()

    def stats(self) -> dict[str, Any]:
        """Counters for tests and debugging: sent, spooled, dropped, rejected, errors."""
        stats = dict(vars(self._worker.stats))
        stats.update(
            queued=len(self._worker.queue),
            queue_dropped_points=self._worker.queue_dropped_points,
            dropped_points=self._worker.dropped_points(),
            internal_errors=self._internal_errors + self._worker.stats.internal_errors + self._poller.internal_errors,
            client_id=self._worker.client_id,
        )
        return stats

    def __enter__(self) -> "ParityMonitor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its arguments, so a monitor can be handed to a 'spawn' child, which builds
        its own (threads and sockets never cross a process boundary)."""
        return (_rebuild, (self._init_args,))

    def __repr__(self) -> str:
        return f"ParityMonitor(run={self._run_key.name or self._run_key.run_id!r}, side={self.side!r}, url={self.url!r})"


def _rebuild(kwargs: dict[str, Any]) -> ParityMonitor:
    return ParityMonitor(**kwargs)


def _close_at_exit(ref: "weakref.ref[ParityMonitor]") -> None:
    monitor = ref()
    if monitor is not None and monitor._pid == os.getpid():
        monitor.close(monitor.atexit_timeout_s)


def _register_fork_finalizer(monitor: ParityMonitor) -> None:
    """multiprocessing's fork children leave through os._exit (no atexit); its finalizers run."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _close_at_exit, args=(weakref.ref(monitor),), exitpriority=100)


@atexit.register
def _close_all_at_exit() -> None:
    for monitor in list(_LIVE):
        _close_at_exit(weakref.ref(monitor))
