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
import os
import socket
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from . import contract
from .control import ControlPoller, ControlState
# Imported here, never lazily: the fingerprint thread and the caller's thread (sampling reports)
# importing this package at the same moment can deadlock on Python's import locks (seen in CI:
# `_DeadlockError` on `trainer_hooks.fingerprint.sampling`, and the trainer posted no processor).
# Stdlib only at import time, so this costs ~40 ms and no ML library.
from .fingerprint import fingerprint_processor
from .fingerprint.core import assemble, with_component, with_components
from .fingerprint.model_config import model_components
from .fingerprint.sampling import read_params, sampling_value
from .health import BackendHealth
from .logs import LogOnce, log
from .records import record_problem
from .registry import ComponentKey, Registry, RunKey
from .settings import HookSettings
from .spool import Spool
from .transport import Transport, TransportConfig, TransportError
from .worker import Worker

SIDES = contract.SIDES
_GOODBYE_S = 1.0  # of close()'s time, kept for telling the backend this process ended
_T = TypeVar("_T")
_LIVE: "weakref.WeakSet[ParityMonitor]" = weakref.WeakSet()


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
        self._internal_errors = 0
        self._log_once = LogOnce()
        self._closed = False
        self._last_step = 0
        self._processor: Any = None
        self._generation_config: Any = None
        self._audit_top_k, self._audit_window = audit_top_k, audit_window
        # The fingerprint as posted = the processor's (registered) + the sampling_params component
        # (reported, maybe later: a process without it yet is "not comparable", never a mismatch).
        self._fingerprint_lock = threading.Lock()
        self._processor_fingerprint: dict[str, Any] | None = None
        self._sampling: tuple[dict[str, Any], dict[str, Any]] | None = None
        # The model and engine components (model_config, lora_adapter, engine_config): register_model.
        self._model: tuple[dict[str, Any], dict[str, Any]] | None = None
        # Processor fingerprints still being computed: sampling waits for them rather than post a
        # sampling-only fingerprint that the processor's replaces a moment later.
        self._fingerprints_in_flight = 0
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
        self._log_once = LogOnce()
        self._fingerprints_in_flight = 0  # the parent's fingerprinting threads are not in this process
        self._registry.after_fork(self._component_key())
        self._worker.reset_after_fork()
        self._control.reset_after_fork()
        self._health.reset_after_fork()
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
    def register_processor(self, processor: Any, generation_config: Any = None, *,
                           chat_template_kwargs: Mapping[str, Any] | None = None,
                           ) -> "concurrent.futures.Future[dict[str, Any]]":
        """Fingerprint `processor` on a background thread and send it to the backend.
        `chat_template_kwargs`: the template variables this process renders prompts with (e.g.
        `{"enable_thinking": False}`); the chat probes are rendered with them.
        Returns a Future of the fingerprint (its exception if fingerprinting failed)."""
        self._processor = processor
        self._generation_config = generation_config  # its eos ids count as eos in the audit and metrics
        with self._fingerprint_lock:
            self._fingerprints_in_flight += 1
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        thread = threading.Thread(target=self._fingerprint_in_background,
                                  args=(processor, generation_config, future, chat_template_kwargs),
                                  name="paritywatch-fingerprint", daemon=True)
        thread.start()
        return future

    def _fingerprint_in_background(self, processor: Any, generation_config: Any,
                                   future: "concurrent.futures.Future[dict[str, Any]]",
                                   chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        try:
            fingerprint = fingerprint_processor(processor, generation_config, chat_template_kwargs=chat_template_kwargs)
            self.register_fingerprint(fingerprint)
            future.set_result(fingerprint)
        except Exception as exc:
            self._internal_errors += 1
            self._log_once.warning(("fingerprint", type(exc)), "paritywatch: could not fingerprint the processor: %r", exc)
            future.set_exception(exc)
        finally:
            self._fingerprint_done()

    def _fingerprint_done(self) -> None:
        """A processor fingerprint finished (or failed): post sampling held back for it, if nothing has."""
        with self._fingerprint_lock:
            self._fingerprints_in_flight -= 1
            held = self._processor_fingerprint is None and (self._sampling is not None or self._model is not None)
            if held and self._fingerprints_in_flight == 0 and self.enabled and not self._closed:
                self._worker.submit_fingerprint(self._fingerprint_to_post())

    @_guarded(default=False)
    def register_fingerprint(self, fingerprint: Mapping[str, Any]) -> bool:
        """Send an already computed fingerprint (must carry its "digest")."""
        if not self.enabled or self._closed:
            return False
        if not isinstance(fingerprint.get("digest"), str):
            raise ValueError("fingerprint has no 'digest'")
        if self._pid != os.getpid():
            self._after_fork()
        with self._fingerprint_lock:
            self._processor_fingerprint = dict(fingerprint)
            self._worker.submit_fingerprint(self._fingerprint_to_post())
        return True

    @_guarded(default=False)
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
        if not self.enabled or self._closed:
            return False
        value = sampling_value(params, logprobs_mode=logprobs_mode, **overrides)
        env = {"sampling": {"source": source, "filled_from_generation_config": sorted(filled_from_generation_config),
                            "as_given": _plain_values({**read_params(params), **overrides})}}
        if self._pid != os.getpid():
            self._after_fork()
        with self._fingerprint_lock:
            if self._sampling is not None and self._sampling[0] == value:
                return True
            self._sampling = (value, env)
            if self._processor_fingerprint is not None or self._fingerprints_in_flight == 0:
                self._worker.submit_fingerprint(self._fingerprint_to_post())
        return True

    @_guarded(default=False)
    def register_model(self, model: Any, **components: Any) -> bool:
        """Report the model this process computes logits with, and the engine running it: the
        `model_config`, `lora_adapter` and `engine_config` components (docs/fingerprint.md, "Model
        and engine"). `model`: a transformers `PreTrainedModel`, a peft `PeftModel` (the adapter
        really active), a `vllm.LLM`, a config, or a model directory. Keyword `components` replace
        whole components (e.g. `lora_adapter=None` for a rollout known to serve no adapter).
        Cheap (config fields only); re-posts only when a value changes. Call it after
        `register_processor`: it then joins the processor's fingerprint (one post); before any
        processor it is posted alone (kind "model"). Returns False when disabled or closed."""
        if not self.enabled or self._closed:
            return False
        values, env = model_components(model)
        return self.report_model_components({**values, **components}, env)

    @_guarded(default=False)
    def report_model_components(self, values: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> bool:
        """Set model / engine components (plain JSON values) as the integrations learn them, e.g.
        `engine_config` once a prefix-cache reset after a weight sync was seen; the others stay."""
        if not self.enabled or self._closed:
            return False
        if self._pid != os.getpid():
            self._after_fork()
        with self._fingerprint_lock:
            old_values, old_env = self._model or ({}, {})
            merged = {**old_values, **{k: v for k, v in values.items() if k in contract.MODEL_COMPONENTS}}
            if self._model is not None and merged == old_values:
                return True
            self._model = (merged, {**old_env, **(env or {})})
            if self._processor_fingerprint is not None or self._fingerprints_in_flight == 0:
                self._worker.submit_fingerprint(self._fingerprint_to_post())
        return True

    def _fingerprint_to_post(self) -> dict[str, Any]:
        """The processor fingerprint with the sampling and model components, or those alone while
        no processor is registered (kind "sampling" or "model"). Called under `_fingerprint_lock`."""
        fingerprint = self._processor_fingerprint
        if self._sampling is None and self._model is None:
            return dict(fingerprint or {})
        if self._sampling is not None:
            value, env = self._sampling
            if fingerprint is None:
                fingerprint = assemble("sampling", {contract.SAMPLING_PARAMS_COMPONENT: value}, env)
            else:
                fingerprint = with_component(fingerprint, contract.SAMPLING_PARAMS_COMPONENT, value, env)
        if self._model is not None:
            fingerprint = with_components(fingerprint, *self._model)
        return fingerprint

    @_guarded(default=False)
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
        processor = processor if processor is not None else self._processor
        step = self._last_step if step is None else step
        rendered = render_prompts(records, processor) if processor is not None else None
        metrics = compute_alignment_metrics(records, processor, trainer_logprobs=trainer_logprobs, rendered=rendered,
                                            generation_config=self._generation_config)
        self.add_samples(len(records))
        logged = self.log(metrics, step)
        if audit:
            self.audit_rollout_batch(records, processor, trainer_logprobs, step, rendered=rendered,
                                     trainer_ids=trainer_ids, trainer_images=trainer_images)
        return logged

    @_guarded(default=False)
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

        if not self.enabled or self._closed:
            return False
        if self._pid != os.getpid():
            self._after_fork()
        processor = processor if processor is not None else self._processor
        audit = audit_batch(records, processor, trainer_logprobs=trainer_logprobs, trainer_eos_ids=trainer_eos_ids,
                            trainer_ids=trainer_ids, trainer_images=trainer_images,
                            generation_config=self._generation_config,
                            step=contract.step_value(self._last_step if step is None else step),
                            top_k=self._audit_top_k, window=self._audit_window, rendered=rendered)
        self._worker.submit_audit(audit)
        return True

    # ------------------------------------------------------------ progress (the workers view)

    @_guarded(default=None)
    def set_policy_version(self, version: int) -> None:
        """The weights version this process works with: the trainer calls it with the version it
        just published, a rollout worker with the version it now serves. Heartbeats carry it (a
        new one beats within a few seconds), and the dashboard shows each worker's lag behind the
        trainer. An int in [0, 2**53]; anything else is logged once and ignored. Never blocks."""
        if not self.enabled or self._closed:
            return
        if self._pid != os.getpid():
            self._after_fork()
        self._worker.set_policy_version(version)

    @property
    def policy_version(self) -> int | None:
        """The version last given to `set_policy_version` (None before any)."""
        return self._worker.heartbeat.progress.policy_version

    @_guarded(default=None)
    def add_samples(self, n: int) -> None:
        """Count `n` samples (rollouts) this process produced: heartbeats report samples/s.
        `log_rollout_batch` counts its records itself."""
        if not self.enabled or self._closed:
            return
        if self._pid != os.getpid():
            self._after_fork()
        self._worker.add_samples(n)

    # ------------------------------------------------------------ weight sync

    @_guarded(default=None)
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
        from .attest import digest_weights

        if not self.enabled or self._closed:
            return None
        attestation = digest_weights(model_or_state_dict, version, _attest_options(
            mode=mode, algo=algo, threads=threads, block_bytes=block_bytes, chunk_bytes=chunk_bytes, chunks=chunks))
        return self._submit_attestation(attestation)

    def attest_stream(self, named_tensors: Iterable[tuple[str, Any]], version: int, **options: Any,
                      ) -> Iterator[tuple[str, Any]]:
        """Yield `named_tensors` unchanged, hashing each tensor on the way; once they are all through,
        the attestation is queued. For syncs that stream their tensors (gathered one at a time
        under ZeRO-3 / FSDP): wrap the iterator the sync sends, so nothing is gathered twice::

            client.update_named_params(metadata, monitor.attest_stream(named_params(), version=step))

        `options` as for `attest_weights`. A failure to hash stops the attestation (counted, logged
        once), never the stream."""
        digest = self._stream_digest(version, options)
        hashing = digest is not None
        try:
            for name, tensor in named_tensors:
                if hashing:
                    hashing = self._stream_add(digest, name, tensor)
                yield name, tensor
            if hashing:
                self._stream_finish(digest)
        finally:  # a sync that stopped half-way attests nothing, and leaves no hashing threads behind
            if digest is not None:
                digest.close()

    @_guarded(default=None)
    def _stream_digest(self, version: int, options: Mapping[str, Any]) -> Any:
        from .attest import WeightsDigest

        if not self.enabled or self._closed:
            return None
        return WeightsDigest(version, _attest_options(**options))

    @_guarded(default=False)
    def _stream_add(self, digest: Any, name: str, tensor: Any) -> bool:
        digest.add([(name, tensor)])
        return True

    @_guarded(default=None)
    def _stream_finish(self, digest: Any) -> dict[str, Any] | None:
        return self._submit_attestation(digest.result())

    def _submit_attestation(self, attestation: dict[str, Any]) -> dict[str, Any]:
        from .attest import summary

        if self._pid != os.getpid():
            self._after_fork()
        self._worker.submit_attestation(attestation)
        return summary(attestation)

    # ------------------------------------------------------------ control

    def wait_if_paused(self, timeout: float | None = None) -> bool:
        """Block while the run is paused; returns on resume or stop (check `should_stop`).
        False only when `timeout` ran out while still paused.

        Fail-open (the default) never waits on a backend it cannot reach or that refuses this
        process: only the first call may wait, at most 2 s, for the backend's first answer, so that
        a run paused before this process started holds its first step too. With fail_closed it
        holds the loop until the backend takes this process's requests."""
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
    def healthy(self) -> bool:
        """True while the backend answers: metrics arrive and a pause or stop reaches this loop.
        False before its first answer and while it cannot be reached (the run is unprotected)."""
        return self.enabled and not self._closed and self._health.healthy

    @property
    def reachable(self) -> bool:
        """Whether the control channel last reached the backend (what fail_closed waits for)."""
        return self._control.reachable

    # ------------------------------------------------------------ lifecycle

    @_guarded(default=False)
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything logged so far (and the spool leftovers of crashed processes this
        one adopted) reached the backend; False at the deadline."""
        if not self.enabled or self._closed:
            return False
        return self._worker.flush(timeout)

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
        try:
            _LIVE.discard(self)
            self._poller.stop()
            deadline = time.monotonic() + timeout
            goodbye_s = min(_GOODBYE_S, timeout / 4)
            delivered = self._worker.close(timeout - goodbye_s, give_up=lambda: self._health.problem is not None)
            if self._health.problem is None:
                self._acknowledge_stop(max(goodbye_s / 2, deadline - time.monotonic()))
                self._report_closed(max(goodbye_s / 2, deadline - time.monotonic()))
            self._say_undelivered()
            return delivered
        except Exception:
            self._internal_errors += 1
            return False

    def _say_undelivered(self) -> None:
        undelivered = self._worker.undelivered()
        if undelivered.batches or undelivered.dropped_points:
            later = (f"; the spool is replayed by the next process that uses {self.url}" if undelivered.waiting
                     else "")
            log.warning("paritywatch: closed. %s%s.", undelivered.describe(self._spool_dir), later)

    def _acknowledge_stop(self, timeout: float) -> None:
        """Only the trainer answers for the run: rollout workers end when it does."""
        ids = self._registry.own_ids()
        if self.side != "trainer" or self._control.state != "stopping" or ids is None:
            return
        run_id, component_id = ids
        transport = self._new_transport()
        try:
            control = transport.request("POST", contract.run_path(run_id, "control/stopped"),
                                        json={"component_id": component_id}, timeout=timeout)
            self._control.observe(control)
        except TransportError as exc:
            log.warning("paritywatch: could not report that the run stopped (the server marks it stopped once "
                        "the run's heartbeats cease): %s", exc)
        finally:
            transport.close()

    def _report_closed(self, timeout: float) -> None:
        ids = self._registry.own_ids()
        if ids is None:
            return  # never registered: the server knows nothing to close
        run_id, component_id = ids
        transport = self._new_transport()
        try:
            control = transport.request("POST", contract.component_path(run_id, component_id, "close"),
                                        json={"reason": "ParityMonitor.close()"}, timeout=timeout)
            if isinstance(control.get("control"), Mapping):
                self._control.observe(control["control"])
        except TransportError as exc:
            log.warning("paritywatch: could not report that this process closed (the server will count it as "
                        "lost once its heartbeats stop): %s", exc)
        finally:
            transport.close()

    def stats(self) -> dict[str, Any]:
        """Counters: sent, spooled (`spool_waiting_batches`: this process's, not delivered yet),
        dropped (`dropped_points` in all, by reason: `queue_dropped_points`, `spool_dropped_points`,
        `rejected_points`; `dropped_batches`), errors; and health (`healthy`, `backend_problem`:
        unreachable, wrong_url, token_refused, wrong_scope, wrong_project or registration_refused;
        `backend_error`: the server's words; `unreachable_s`)."""
        stats = self._worker.stats()
        stats.update(self._health.stats())
        stats["healthy"] = self.healthy
        stats["internal_errors"] += self._internal_errors + self._poller.internal_errors
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


def _attest_options(*, mode: str = "full", algo: str = "", threads: int = 0, block_bytes: int | None = None,
                    chunk_bytes: int | None = None, chunks: int | None = None) -> Any:
    """AttestOptions from `attest_weights` arguments (None: the default), checked."""
    from .attest import AttestOptions  # lazy: hashing libraries load on first use

    sizes = {k: v for k, v in (("block_bytes", block_bytes), ("chunk_bytes", chunk_bytes), ("chunks", chunks))
             if v is not None}
    return AttestOptions(algo=algo, mode=mode, threads=threads, **sizes).checked()


def _plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """What the caller passed, JSON-safe, for the fingerprint's env (never compared)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        plain = value if isinstance(value, (str, int, float, bool, type(None))) else getattr(value, "value", None)
        out[key] = plain if isinstance(plain, (str, int, float, bool, type(None))) else repr(value)
    return out


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
