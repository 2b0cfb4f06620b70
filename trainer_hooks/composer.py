"""The fingerprint a process posts, composed from what it registers and reports.

The fingerprint as posted = the processor's (registered, fingerprinted on a thread of its own) + the
`sampling_params` component (reported, maybe later: a process without it yet is "not comparable",
never a mismatch) + the model and engine components (`model_config`, `lora_adapter`,
`engine_config`: `register_model`). Each report re-posts the whole when a value changed.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Mapping

from . import contract
# Imported here, never lazily: the fingerprint thread and the caller's thread (sampling reports)
# importing this package at the same moment can deadlock on Python's import locks (seen in CI:
# `_DeadlockError` on `trainer_hooks.fingerprint.sampling`, and the trainer posted no processor).
# Stdlib only at import time, so this costs ~40 ms and no ML library.
from .fingerprint import fingerprint_processor
from .fingerprint.core import assemble, with_component, with_components
from .fingerprint.sampling import read_params, sampling_value
from .guard import Guard, guarded

Fingerprint = dict[str, Any]
_Components = tuple[dict[str, Any], dict[str, Any]]  # (values, env)


class FingerprintComposer:
    """Holds what the process registered and posts the composed fingerprint through `post`.

    `is_open()`: whether the monitor still posts (enabled, not closed; it re-arms a forked child
    first). Its methods are called through the monitor's guarded ones, except the fingerprint
    thread's, which guard themselves."""

    def __init__(self, post: Callable[[Fingerprint], Any], is_open: Callable[[], bool], guard: Guard) -> None:
        self._post = post
        self._is_open = is_open
        self._guard = guard
        # The processor registered last and its generation config: the audit and the alignment
        # metrics render with it and count the config's eos ids as eos.
        self.processor: Any = None
        self.generation_config: Any = None
        self._lock = threading.Lock()
        self._processor_fingerprint: Fingerprint | None = None
        self._sampling: _Components | None = None
        self._model: _Components | None = None
        # Processor fingerprints still being computed: sampling and model reports wait for them
        # rather than post a fingerprint without the processor that its own replaces a moment later.
        self._in_flight = 0

    def after_fork(self) -> None:
        self._in_flight = 0  # the parent's fingerprinting threads are not in this process

    # ------------------------------------------------------------ the processor

    def register_processor(self, processor: Any, generation_config: Any,
                           chat_template_kwargs: Mapping[str, Any] | None) -> "concurrent.futures.Future[Fingerprint]":
        self.processor, self.generation_config = processor, generation_config
        with self._lock:
            self._in_flight += 1
        future: concurrent.futures.Future[Fingerprint] = concurrent.futures.Future()
        thread = threading.Thread(target=self._fingerprint_in_background,
                                  args=(processor, generation_config, future, chat_template_kwargs),
                                  name="paritywatch-fingerprint", daemon=True)
        thread.start()
        return future

    def _fingerprint_in_background(self, processor: Any, generation_config: Any,
                                   future: "concurrent.futures.Future[Fingerprint]",
                                   chat_template_kwargs: Mapping[str, Any] | None) -> None:
        try:
            fingerprint = self._fingerprint(processor, generation_config, future, chat_template_kwargs)
            if fingerprint is not None:
                self.register_fingerprint(fingerprint)
                future.set_result(fingerprint)
        finally:
            self._fingerprint_done()

    @guarded(default=None, says="could not fingerprint the processor")
    def _fingerprint(self, processor: Any, generation_config: Any, future: "concurrent.futures.Future[Fingerprint]",
                     chat_template_kwargs: Mapping[str, Any] | None) -> Fingerprint | None:
        try:
            return fingerprint_processor(processor, generation_config, chat_template_kwargs=chat_template_kwargs)
        except Exception as exc:
            future.set_exception(exc)  # the caller's Future carries the failure; the guard counts it
            raise

    def _fingerprint_done(self) -> None:
        """A processor fingerprint finished (or failed): post what was held back for it, if nothing has."""
        with self._lock:
            self._in_flight -= 1
            held = self._processor_fingerprint is None and (self._sampling is not None or self._model is not None)
            if held and self._in_flight == 0 and self._is_open():
                self._post(self._to_post())

    @guarded(default=False)  # the host's call and the fingerprint thread both post through here
    def register_fingerprint(self, fingerprint: Mapping[str, Any]) -> bool:
        if not self._is_open():
            return False
        if not isinstance(fingerprint.get("digest"), str):
            raise ValueError("fingerprint has no 'digest'")
        with self._lock:
            self._processor_fingerprint = dict(fingerprint)
            self._post(self._to_post())
        return True

    # ------------------------------------------------------------ the components reported later

    def report_sampling_params(self, params: Any, *, logprobs_mode: str | None, source: str,
                               filled_from_generation_config: Any, overrides: Mapping[str, Any]) -> bool:
        value = sampling_value(params, logprobs_mode=logprobs_mode, **overrides)
        env = {"sampling": {"source": source, "filled_from_generation_config": sorted(filled_from_generation_config),
                            "as_given": _plain_values({**read_params(params), **overrides})}}
        with self._lock:
            if self._sampling is not None and self._sampling[0] == value:
                return True
            self._sampling = (value, env)
            self._post_unless_held()
        return True

    def report_model_components(self, values: Mapping[str, Any], env: Mapping[str, Any] | None) -> bool:
        with self._lock:
            old_values, old_env = self._model or ({}, {})
            merged = {**old_values, **{k: v for k, v in values.items() if k in contract.MODEL_COMPONENTS}}
            if self._model is not None and merged == old_values:
                return True
            self._model = (merged, {**old_env, **(env or {})})
            self._post_unless_held()
        return True

    def _post_unless_held(self) -> None:
        """Post now, unless a processor fingerprint being computed will carry this. Under `_lock`."""
        if self._processor_fingerprint is not None or self._in_flight == 0:
            self._post(self._to_post())

    def _to_post(self) -> Fingerprint:
        """The processor fingerprint with the sampling and model components, or those alone while
        no processor is registered (kind "sampling" or "model"). Under `_lock`."""
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


def _plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """What the caller passed, JSON-safe, for the fingerprint's env (never compared)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        plain = value if isinstance(value, (str, int, float, bool, type(None))) else getattr(value, "value", None)
        out[key] = plain if isinstance(plain, (str, int, float, bool, type(None))) else repr(value)
    return out
