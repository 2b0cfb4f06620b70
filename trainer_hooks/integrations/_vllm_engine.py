"""A ``vllm.LLM``'s model and engine components, kept current as the engine serves.

``register_llm`` reports them once (model_config, engine_config, lora_adapter when LoRA is off);
``watch_llm_engine`` follows what only serving shows: the LoRA adapter each request really carries,
and whether the prefix cache is reset after each weight sync (NVIDIA-NeMo/RL#4018, trl#3024).
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from ..contract import ENGINE_CONFIG_COMPONENT, LORA_ADAPTER_COMPONENT
from ..fingerprint.model_config import vllm_components, vllm_lora_value

logger = logging.getLogger(__name__)
_UNSET = object()


class EngineWatch:
    """Reads each request the engine receives and each prefix-cache reset.

    A weight sync is seen as a change of the monitor's policy version between two requests (a
    rollout worker calls ``monitor.set_policy_version`` with the version it now serves). The cache
    counts as reset after that sync when ``reset_prefix_cache`` ran between the last request of
    the old version and the first of the new one; one sync without a reset is reported for good.
    """

    def __init__(self, monitor: Any, llm: Any):
        self.monitor = monitor
        components, _ = vllm_components(llm)
        self.engine = dict(components[ENGINE_CONFIG_COMPONENT])
        self.engine["prefix_cache_reset_after_sync"] = None
        self._lock = threading.Lock()
        self._version: Any = _UNSET
        self._reset_since_version = False
        self._adapter: Any = _UNSET

    def on_reset(self) -> None:
        with self._lock:
            self._reset_since_version = True

    def on_request(self, lora_request: Any) -> None:
        updates: dict[str, Any] = {}
        with self._lock:
            if self.engine.get("prefix_caching"):
                updates.update(self._prefix_update())
            key = _adapter_key(lora_request)
            if key != self._adapter:  # the same adapter as the last request: nothing new to read
                self._adapter = key
                updates[LORA_ADAPTER_COMPONENT] = vllm_lora_value(lora_request)
        if updates:
            self.monitor.report_model_components(updates)  # re-posts only on a changed value

    def _prefix_update(self) -> dict[str, Any]:
        version = getattr(self.monitor, "policy_version", None)
        if self._version is _UNSET:
            self._version, self._reset_since_version = version, False
            return {}
        if version == self._version:
            return {}
        reset = self._reset_since_version
        self._version, self._reset_since_version = version, False
        if self.engine["prefix_cache_reset_after_sync"] is False:
            return {}  # one sync served from a stale cache stays reported
        self.engine["prefix_cache_reset_after_sync"] = reset
        return {ENGINE_CONFIG_COMPONENT: dict(self.engine)}


def _adapter_key(lora_request: Any) -> Any:
    if lora_request is None:
        return None
    return tuple(getattr(lora_request, a, None) for a in ("lora_name", "lora_int_id", "lora_path"))


def watch_llm_engine(monitor: Any, llm: Any) -> Any:
    """Follow the LoRA adapter each request carries and the prefix-cache resets after weight syncs
    of this ``vllm.LLM`` (wraps ``llm.llm_engine.add_request`` and ``llm.reset_prefix_cache``).
    Returns a callable that removes the wrappers."""
    watch = EngineWatch(monitor, llm)
    engine = llm.llm_engine
    add_request, reset = engine.add_request, llm.reset_prefix_cache

    def watched_add_request(request_id: Any, prompt: Any, params: Any, arrival_time: Any = None,
                            lora_request: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            watch.on_request(lora_request)
        except Exception:  # never fail a request for monitoring
            logger.debug("paritywatch: could not read the engine state", exc_info=True)
        return add_request(request_id, prompt, params, arrival_time, lora_request, *args, **kwargs)

    def watched_reset(*args: Any, **kwargs: Any) -> Any:
        done = reset(*args, **kwargs)
        watch.on_reset()
        return done

    engine.add_request, llm.reset_prefix_cache = watched_add_request, watched_reset

    def unwatch() -> None:
        engine.add_request, llm.reset_prefix_cache = add_request, reset
    return unwatch
