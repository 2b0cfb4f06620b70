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

This class is the facade: it checks arguments, builds the process's parts and re-arms them in a
forked child; its methods delegate to the rooms that do the work (docs/design.md, "The hooks
client"): `composer.py` (the fingerprint), `attester.py` (weight attestation), `closer.py` (the
close protocol), `worker.py` (queue, batches, uploads), `control.py`, `health.py`.
"""
from __future__ import annotations

import concurrent.futures
import os
import socket
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

from . import contract
from .attester import WeightAttester
from .closer import Closer, close_at_exit, register_fork_finalizer, skip_at_exit
from .composer import FingerprintComposer
from .control import ControlPoller, ControlState
from .fingerprint.model_config import model_components
from .guard import Guard, guarded
from .health import BackendHealth
from .logs import log
from .records import record_problem
from .registry import ComponentKey, Registry, RunKey
from .settings import HookSettings
from .spool import Spool
from .transport import Transport, TransportConfig
from .worker import Worker

SIDES = contract.SIDES


class ParityMonitor:
    """Metrics, fingerprints, heartbeats and run control for one process of a run.

    `run` is a run name (created or reused within `project`) or the int id of an existing run.
    Arguments left out come from the environment (`trainer_hooks.settings.HookSettings`):
    PARITYWATCH_URL, PARITYWATCH_TOKEN, PARITYWATCH_RUN, PARITYWATCH_PROJECT, PARITYWATCH_WORKER_ID,
    PARITYWATCH_SPOOL_DIR, PARITYWATCH_FAIL_CLOSED; PARITYWATCH_DISABLED=1 makes it a no-op.

    When the backend cannot be reached the monitor says so on stderr at once (a WARNING through
    the "paritywatch" logger), then at most once a minute while it lasts: the run is unprotected,
    since no pause or stop can reach it. `healthy` and `stats()` show the same. Training goes on
    (fail-open) unless `fail_closed=True`: then `wait_if_paused()` holds the loop until the
    backend answers, the way to refuse to train unmonitored.

    `packs=["verl"]` enables framework metric packs for the run (rules on that framework's own
    mismatch metrics at its documented levels; `GET /api/v1/packs` lists them).
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
        fail_closed: bool | None = None,
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
        packs: Sequence[str] | None = None,
        enabled: bool | None = None,
        audit_top_k: int = contract.AUDIT_DEFAULT_TOP_K,
        audit_window: int = contract.AUDIT_DEFAULT_WINDOW,
    ) -> None:
        # Wrong arguments fail here, loudly, never later inside a training step.
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        if run is not None and (isinstance(run, bool) or not isinstance(run, (str, int))):
            raise TypeError(f"run must be a run name (str) or run id (int), not {type(run).__name__}")
        if max_queue < 1 or flush_interval_s <= 0:
            raise ValueError("max_queue must be >= 1 and flush_interval_s > 0")
        packs = _check_packs(packs, run)
        if not 0 <= audit_top_k <= contract.AUDIT_MAX_SAMPLES or not 0 <= audit_window <= contract.AUDIT_MAX_WINDOW:
            raise ValueError(f"audit_top_k must be in [0, {contract.AUDIT_MAX_SAMPLES}] and audit_window "
                             f"in [0, {contract.AUDIT_MAX_WINDOW}]")
        self._init_args = dict(locals())
        del self._init_args["self"]
        self._settings = settings = HookSettings.from_env()
        self.side = side
        self.url = (url or settings.url).rstrip("/")
        self.enabled = (not settings.disabled) if enabled is None else enabled
        self.fail_closed = settings.fail_closed if fail_closed is None else fail_closed
        self.atexit_timeout_s = atexit_timeout_s
        self._explicit_worker_id = worker_id or settings.worker_id
        self._guard = Guard()
        self._closed = False
        self._last_step = 0
        self._audit_top_k, self._audit_window = audit_top_k, audit_window
        self._pid = os.getpid()
        self._run_key = self._resolve_run_key(run, project or settings.project)
        self._transport_config = TransportConfig(url=self.url, token=token or settings.token,
                                                 timeout_s=request_timeout_s)
        self._spool_dir = settings.spool_directory(self.url, spool_dir)
        self._spool_max_bytes = spool_max_bytes
        self._registry = Registry(self._run_key, self._component_key(), dict(tags or {}), dict(config or {}), packs)
        self._control = ControlState(fail_closed=self.fail_closed)
        self._health = BackendHealth(self.url, fail_closed=self.fail_closed, spool_dir=self._spool_dir,
                                     on_change=self._control.set_reachable,
                                     undelivered=lambda: self._worker.undelivered())
        self._worker = Worker(
            backend=self.url,
            transport_factory=self._new_transport,
            registry=self._registry,
            spool_factory=self._new_spool,
            max_queue=max_queue,
            flush_interval_s=flush_interval_s,
            max_batch_points=max_batch_points,
            heartbeat_interval_s=heartbeat_interval_s,
            max_backoff_s=max_backoff_s,
            on_control=self._control.observe,
            on_tick=self._health.check,
            drops_batches=lambda: self._health.drops_batches,
        )
        self._poller = ControlPoller(
            self._control,
            transport_factory=self._new_transport,
            resolve_run_id=lambda transport: self._registry.ids(transport)[0],
            poll_timeout_s=poll_timeout_s,
            max_backoff_s=max_backoff_s,
        )
        self._fingerprints = FingerprintComposer(self._worker.submit_fingerprint, self._open, self._guard)
        self._attester = WeightAttester(self._worker.submit_attestation, self._open, self._rearm_if_forked,
                                        self._guard)
        self._closer = Closer(side=side, url=self.url, spool_dir=self._spool_dir, worker=self._worker,
                              poller=self._poller, health=self._health, registry=self._registry,
                              control=self._control, new_transport=self._new_transport)
        if self.enabled:
            close_at_exit(self)
            self._start_threads()

    # ------------------------------------------------------------ construction helpers

    def _resolve_run_key(self, run: str | int | None, project: str) -> RunKey:
        if isinstance(run, int):
            return RunKey(run_id=run, project=project)
        name = run or self._settings.run
        if not name:
            name = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}"
            log.warning("paritywatch: no run name given (run= or PARITYWATCH_RUN); using %r. "
                        "Trainer and rollout workers must share a run name.", name)
        return RunKey(name=name, project=project)

    def _component_key(self) -> ComponentKey:
        worker_id = self._explicit_worker_id or self._default_worker_id()
        return ComponentKey(self.side, worker_id, socket.gethostname(), os.getpid())

    def _default_worker_id(self) -> str:
        if self._settings.rank is not None:
            return f"{self.side}-rank{self._settings.rank}"
        return f"{socket.gethostname()}-{os.getpid()}"

    def _new_transport(self) -> Transport:
        return Transport(self._transport_config, observer=self._health.observe)

    def _new_spool(self, owner: str) -> Spool:
        return Spool(self._spool_dir, owner, max_bytes=self._spool_max_bytes,
                     accept=lambda record: record_problem(record, self.url))

    def _start_threads(self) -> None:
        self._worker.start()
        self._worker.kick()  # register the component and replay leftovers now, not after a tick
        self._poller.start()

    def _after_fork(self) -> None:
        """First call in a forked child: a fresh client id, queue, threads, sockets and spool file.
        The parent's queued points stay the parent's to send."""
        self._pid = os.getpid()
        self._guard.reset_after_fork()
        self._fingerprints.after_fork()
        self._registry.after_fork(self._component_key())
        self._worker.reset_after_fork()
        self._control.reset_after_fork()
        self._health.reset_after_fork()
        self._poller.reset_after_fork()
        register_fork_finalizer(self)
        if self.enabled and not self._closed:
            self._start_threads()

    def _rearm_if_forked(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()

    def _open(self) -> bool:
        """Whether this monitor still works (enabled, not closed); a forked child is re-armed first."""
        if not self.enabled or self._closed:
            return False
        self._rearm_if_forked()
        return True

    # ------------------------------------------------------------ the hot path

    @guarded(default=False)
    def log(self, metrics: Mapping[str, float], step: int) -> bool:
        """Queue metrics for `step`. Enqueue only: never blocks, never raises. False when dropped."""
        if not self._open():
            return False
        self._last_step = step
        return self._worker.submit(step, metrics)

    # ------------------------------------------------------------ processors and rollouts

    @guarded(default=None)
    def register_processor(self, processor: Any, generation_config: Any = None, *,
                           chat_template_kwargs: Mapping[str, Any] | None = None,
                           ) -> "concurrent.futures.Future[dict[str, Any]]":
        """Fingerprint `processor` on a background thread and send it to the backend.
        `chat_template_kwargs`: the template variables this process renders prompts with (e.g.
        `{"enable_thinking": False}`); the chat probes are rendered with them.
        Returns a Future of the fingerprint (its exception if fingerprinting failed)."""
        return self._fingerprints.register_processor(processor, generation_config, chat_template_kwargs)

    def register_fingerprint(self, fingerprint: Mapping[str, Any]) -> bool:
        """Send an already computed fingerprint (must carry its "digest")."""
        return self._fingerprints.register_fingerprint(fingerprint)  # guarded there: its thread posts through it too

    @guarded(default=False)
    def report_sampling_params(self, params: Any = None, *, logprobs_mode: str | None = None,
                               source: str = "manual", filled_from_generation_config: Any = (),
                               **overrides: Any) -> bool:
        """Report how this process samples (rollout) or scores (trainer) tokens: the
        `sampling_params` component of its fingerprint (docs/fingerprint.md, "Sampling parameters").

        Rollout: the parameters requests were really served with, after the engine filled its
        defaults (the integrations do this: `integrations.vllm.watch_llm_sampling`,
        `openai_server.report_request_sampling`, `transformers_generate.report_generate_sampling`).
        Report the requests whose samples are trained on.
        Trainer: what the log-prob recompute assumes: its temperature, and top_p/top_k/min_p only if
        it masks the logits the same way (TRL's recompute does not); `logprobs_mode="processed"`
        when it scores at that temperature.

        `params`: a mapping, a vLLM `SamplingParams` or a transformers `GenerationConfig`; keyword
        `overrides` (temperature=0.6, top_k=20...) go on top. `logprobs_mode`: "raw"/"processed" (or
        vLLM's names), None when not known. Cheap enough for every request: the fingerprint is
        re-posted only when the normalised values change (the latest report wins).
        Returns False when disabled or closed (and when the values could not be read).
        """
        return self._open() and self._fingerprints.report_sampling_params(
            params, logprobs_mode=logprobs_mode, source=source,
            filled_from_generation_config=filled_from_generation_config, overrides=overrides)

    @guarded(default=False)
    def register_model(self, model: Any, **components: Any) -> bool:
        """Report the model this process computes logits with, and the engine running it: the
        `model_config`, `lora_adapter` and `engine_config` components (docs/fingerprint.md, "Model
        and engine"). `model`: a transformers `PreTrainedModel`, a peft `PeftModel` (the adapter
        really active), a `vllm.LLM`, a config, or a model directory. Keyword `components` replace
        whole components (e.g. `lora_adapter=None` for a rollout known to serve no adapter).
        Cheap (config fields only); re-posts only when a value changes. Call it after
        `register_processor`: it then joins the processor's fingerprint (one post); before any
        processor it is posted alone (kind "model"). Returns False when disabled or closed."""
        if not self._open():
            return False
        values, env = model_components(model)
        return self.report_model_components({**values, **components}, env)

    @guarded(default=False)
    def report_model_components(self, values: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> bool:
        """Set model / engine components (plain JSON values) as the integrations learn them, e.g.
        `engine_config` once a prefix-cache reset after a weight sync was seen; the others stay."""
        return self._open() and self._fingerprints.report_model_components(values, env)

    @guarded(default=False)
    def log_rollout_batch(self, records: Any, processor: Any = None, trainer_logprobs: Any = None,
                          step: int | None = None, *, audit: bool = True, trainer_ids: Any = None,
                          trainer_images: Any = None) -> bool:
        """Compute the per-batch alignment metrics (docs/design.md, "Alignment metrics") and log them;
        with `audit` (the default) also send the batch's per-sample audit (`audit_rollout_batch`,
        which takes `trainer_ids` and `trainer_images`), rendering each prompt once for both. The
        eos ids of the generation config given to `register_processor` count as eos. Runs on the
        caller's thread (a few ms for 64 x 1,024 tokens, plus what the processor's renders cost);
        never raises."""
        from .alignment import compute_alignment_metrics, render_prompts  # lazy: may import numpy / torch

        records = list(records)
        processor = processor if processor is not None else self._fingerprints.processor
        step = self._last_step if step is None else step
        rendered = render_prompts(records, processor) if processor is not None else None
        metrics = compute_alignment_metrics(records, processor, trainer_logprobs=trainer_logprobs, rendered=rendered,
                                            generation_config=self._fingerprints.generation_config)
        self.add_samples(len(records))
        logged = self.log(metrics, step)
        if audit:
            self.audit_rollout_batch(records, processor, trainer_logprobs, step, rendered=rendered,
                                     trainer_ids=trainer_ids, trainer_images=trainer_images)
        return logged

    @guarded(default=False)
    def audit_rollout_batch(self, records: Any, processor: Any = None, trainer_logprobs: Any = None,
                            step: int | None = None, *, trainer_eos_ids: Any = None, rendered: Any = None,
                            trainer_ids: Any = None, trainer_images: Any = None) -> bool:
        """Audit each sample of a rollout batch (length parity of ids and log-probs, first
        re-render mismatch, the ids trained on against the ids sampled, finish reason, eos ids
        sampled past, image features; trainer_hooks/audit.py) and queue the batch's counts with its
        `audit_top_k` worst samples for the worker thread to post. `trainer_ids`: per record the
        completion ids the trainer trains on; `trainer_images`: per record the trainer's
        `sample_identity.image_features`. `trainer_eos_ids`: what counts as eos (default: the
        processor's eos id and the registered generation config's). Never blocks on the network,
        never raises; False when disabled or closed."""
        from .audit import audit_batch

        if not self._open():
            return False
        processor = processor if processor is not None else self._fingerprints.processor
        audit = audit_batch(records, processor, trainer_logprobs=trainer_logprobs, trainer_eos_ids=trainer_eos_ids,
                            trainer_ids=trainer_ids, trainer_images=trainer_images,
                            generation_config=self._fingerprints.generation_config,
                            step=contract.step_value(self._last_step if step is None else step),
                            top_k=self._audit_top_k, window=self._audit_window, rendered=rendered)
        self._worker.submit_audit(audit)
        return True

    # ------------------------------------------------------------ progress (the workers view)

    @guarded(default=None)
    def set_policy_version(self, version: int) -> None:
        """The weights version this process works with: the trainer calls it with the version it
        just published, a rollout worker with the version it now serves. Heartbeats carry it (a
        new one beats within a few seconds), and the dashboard shows each worker's lag behind the
        trainer. An int in [0, 2**53]; anything else is logged once and ignored. Never blocks."""
        if not self._open():
            return
        self._worker.set_policy_version(version)

    @property
    def policy_version(self) -> int | None:
        """The version last given to `set_policy_version` (None before any)."""
        return self._worker.heartbeat.progress.policy_version

    @guarded(default=None)
    def add_samples(self, n: int) -> None:
        """Count `n` samples (rollouts) this process produced: heartbeats report samples/s.
        `log_rollout_batch` counts its records itself."""
        if not self._open():
            return
        self._worker.add_samples(n)

    # ------------------------------------------------------------ weight sync

    @guarded(default=None)
    def attest_weights(self, model_or_state_dict: Any, version: int, *, mode: str = "full",
                       algo: str = "", threads: int = 0, block_bytes: int | None = None,
                       chunk_bytes: int | None = None, chunks: int | None = None) -> dict[str, Any] | None:
        """Attest the weights this process holds for `version` (docs/design.md, "Weight-sync
        attestation"): the trainer right before it sends them, each rollout worker right after it
        loaded them. `model_or_state_dict`: a module (its state_dict), a mapping or an iterable of
        (name, tensor) pairs: the tensors as sent (after any cast or gather). `version`: an int
        that grows with every sync (the trainer's step). `mode="sampled"` hashes a fixed number of
        chunks per tensor (for very large models; both sides must use the same settings).

        The digests are computed on the caller's thread, because the bytes must be read before the
        next optimizer step changes them (about 1 GB/s per core with xxhash; bench/attest.py); the
        upload is queued like a fingerprint and never blocks or raises. Returns the attestation
        without its tensor list (None if it could not be computed)."""
        return self._attester.attest(model_or_state_dict, version, mode=mode, algo=algo, threads=threads,
                                     block_bytes=block_bytes, chunk_bytes=chunk_bytes, chunks=chunks)

    def attest_stream(self, named_tensors: Iterable[tuple[str, Any]], version: int, **options: Any,
                      ) -> Iterator[tuple[str, Any]]:
        """Yield `named_tensors` unchanged, hashing each tensor on the way; once they are all through,
        the attestation is queued. For syncs that stream their tensors (gathered one at a time
        under ZeRO-3 / FSDP): wrap the iterator the sync sends, so nothing is gathered twice::

            client.update_named_params(metadata, monitor.attest_stream(named_params(), version=step))

        `options` as for `attest_weights`. A failure to hash stops the attestation (counted, logged
        once), never the stream."""
        return self._attester.stream(named_tensors, version, options)

    # ------------------------------------------------------------ control

    @guarded(default=True)
    def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Block while the run is paused; returns on resume or stop (check `should_stop`).
        False only when `timeout` ran out while still paused.

        Fail-open (the default) never waits on a backend it cannot reach or that refuses this
        process: only the first call may wait, at most 2 s, for the backend's first answer, so that
        a run paused before this process started holds its first step too. With fail_closed it
        holds the loop until the backend takes this process's requests."""
        if not self._open():
            return True
        return self._control.wait_if_paused(timeout)

    @property
    def state(self) -> str:
        """"running", "paused", "stopping", "stopped", or "unknown" before the server answered."""
        return self._control.state if self.enabled else "disabled"

    @property
    def should_stop(self) -> bool:
        return self.enabled and self._control.should_stop

    @property
    def healthy(self) -> bool:
        """True while the backend answers: metrics arrive and a pause or stop reaches this loop.
        False before its first answer and while it cannot be reached (the run is unprotected)."""
        return self.enabled and not self._closed and self._health.healthy

    @property
    def reachable(self) -> bool:
        """Whether the control channel last reached the backend (what fail_closed waits for)."""
        return self._control.reachable

    # ------------------------------------------------------------ lifecycle

    @guarded(default=False)
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything logged so far (and the spool leftovers of crashed processes this
        one adopted) reached the backend; False at the deadline."""
        if not self.enabled or self._closed:
            return False
        return self._worker.flush(timeout)

    @guarded(default=False)
    def close(self, timeout: float = 5.0) -> bool:
        """Stop, within `timeout` seconds (plus up to ~1 s for the threads to end); True when
        everything logged reached the backend.

        While the backend takes this process's requests, what is queued is sent until the deadline;
        while it is unreachable or refuses this process, nothing waits for it: what is left goes to
        the spool at once, for a later process. Then goodbye, in the last quarter of the time (at
        most 1 s): a trainer closing while its run is `stopping` reports that its loop has ended
        (the run becomes `stopped`), and every process reports that it closed cleanly, so its
        silence is not a lost process (the trainer closing finishes a running run). Batches not
        delivered are said once on stderr."""
        if self._closed or not self.enabled:
            return True
        self._closed = True
        skip_at_exit(self)
        return self._closer.close(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters: sent, spooled (`spool_waiting_batches`: this process's, not delivered yet),
        dropped (`dropped_points` in all, by reason: `queue_dropped_points`, `spool_dropped_points`,
        `rejected_points`; `dropped_batches`), errors; and health (`healthy`, `backend_problem`:
        unreachable, wrong_url, token_refused, wrong_scope, wrong_project or registration_refused;
        `backend_error`: the server's words; `unreachable_s`)."""
        stats = self._worker.stats()
        stats.update(self._health.stats())
        stats["healthy"] = self.healthy
        stats["internal_errors"] += self._guard.errors + self._poller.internal_errors
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


def _check_packs(packs: Sequence[str] | None, run: str | int | None) -> list[str]:
    """The framework packs to enable, checked now (a typo fails here, not on the server)."""
    if not packs:
        return []
    if isinstance(packs, str):
        packs = [packs]
    unknown = [p for p in packs if p not in contract.PACK_NAMES]
    if unknown:
        raise ValueError(f"unknown pack(s) {unknown}; the packs are {list(contract.PACK_NAMES)}")
    if isinstance(run, int):
        raise ValueError("packs= needs a run name (the monitor then creates or gets the run with them); "
                         "for a run given by id, enable packs in its settings (PUT /runs/{id}/settings)")
    return list(dict.fromkeys(packs))
