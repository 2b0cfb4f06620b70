"""vLLM rollout side: register an engine and turn its outputs into RolloutRecords.

Importing this module is free: nothing from vLLM, torch or transformers is imported here; the
objects you pass in are read by duck typing. The black-box check of a running OpenAI-compatible
server lives in ``trainer_hooks.integrations.openai_server`` and is re-exported here.

Rollout worker with an in-process engine (``vllm.LLM``)::

    from trainer_hooks import ParityMonitor
    from trainer_hooks.integrations.vllm import register_llm, records_from_request_outputs

    llm = LLM(model=path)
    monitor = ParityMonitor(run="grpo-qwen", side="rollout", url=PARITYWATCH_URL)
    register_llm(monitor, llm)          # the tokenizer AND generation config the engine really uses
    watch_llm_sampling(monitor, llm)    # reports what every request is served with, log-prob mode too
    watch_llm_engine(monitor, llm)      # the LoRA adapter requests carry, prefix-cache resets after syncs
    outputs = llm.chat(conversations, SamplingParams(logprobs=0, max_tokens=256))
    records = records_from_request_outputs(outputs, messages=conversations, policy_version=version)
    monitor.log_rollout_batch(records, processor=trainer_processor)   # or ship records to the trainer

A vLLM OpenAI-compatible server you cannot modify (black box, through ``/tokenize``)::

    result = check_openai_server("http://vllm:8000", trainer_tokenizer)   # {"verdict": ..., ...}
    post_openai_server_check(monitor, result)   # report it to the backend as a rollout component

What the server check can and cannot see: docs/vllm.md.

Weight-sync attestation on the engine's workers (docs/vllm.md, "Weight-sync attestation")::

    llm.collective_rpc(install_weight_attestation, kwargs={"run": "grpo-qwen", "url": PARITYWATCH_URL})
    ...                                  # each sync: the framework's own RPC calls model.load_weights(...)
    llm.collective_rpc(commit_weight_attestation, args=(version,))   # every worker attests what it loaded
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from ..alignment import RolloutRecord
from .. import contract
from ..contract import SAMPLING_PARAM_KEYS
from ..fingerprint.components import SAMPLING_KEYS
from ..fingerprint.sampling import read_params
from ._vllm_engine import watch_llm_engine
from .openai_server import SERVER_KIND, check_openai_server, post_openai_server_check, server_fingerprint

__all__ = ["SERVER_KIND", "check_openai_server", "commit_weight_attestation", "install_weight_attestation",
           "llm_generation_config", "post_openai_server_check", "records_from_request_outputs", "register_llm",
           "report_served_sampling", "served_sampling_params", "server_fingerprint", "watch_llm_engine",
           "watch_llm_sampling"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- vllm.LLM registration

def _model_config(llm: Any) -> Any:
    for path in (("model_config",), ("llm_engine", "model_config"), ("llm_engine", "vllm_config", "model_config")):
        obj = llm
        for attr in path:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None and callable(getattr(obj, "try_get_generation_config", None)):
            return obj
    return None


def llm_generation_config(llm: Any) -> dict[str, Any] | None:
    """The generation config as the engine applies it (vLLM 0.32, ``vllm/config/model.py``).

    * eos ids: ``ModelConfig.try_get_generation_config()`` (the model's generation_config.json, or
      the one ``--generation-config DIR`` points at, as ``GenerationConfig.to_diff_dict()``); the
      input processor adds these to every request's stop ids (``update_from_generation_config``),
      whatever ``--generation-config`` mode is used.
    * sampling defaults: ``ModelConfig.get_diff_sampling_param()`` — what ``LLM.generate`` /
      ``chat`` and the OpenAI server apply when the caller sets nothing: empty with
      ``generation_config="vllm"``, overrides from ``override_generation_config`` included.

    None when the engine exposes no model config (not a vLLM engine).
    """
    model_config = _model_config(llm)
    if model_config is None:
        return None
    raw = dict(model_config.try_get_generation_config() or {})
    try:
        sampling = dict(model_config.get_diff_sampling_param() or {})
    except Exception:  # pragma: no cover - defensive: keep the file's values
        logger.debug("get_diff_sampling_param failed", exc_info=True)
        return raw
    for key in SAMPLING_KEYS:
        raw.pop(key, None)
        if sampling.get(key) is not None:
            raw[key] = sampling[key]
    return raw


def register_llm(monitor: Any, llm: Any) -> Any:
    """Register a ``vllm.LLM`` (or an engine with ``get_tokenizer()``) as the rollout processor.

    Fingerprints ``llm.get_tokenizer()`` (vLLM's cached tokenizer wrapper, exactly as the engine
    renders and detokenizes with it) together with the generation config the engine applies
    (``llm_generation_config``), and the model and engine the logits come from (``register_model``:
    hf_config with hf_overrides, dtype, quantization, max_model_len, eager, prefix caching...).
    Returns what ``monitor.register_processor`` returns (a Future of the fingerprint for ParityMonitor)."""
    tokenizer = llm.get_tokenizer() if callable(getattr(llm, "get_tokenizer", None)) else llm
    registered = monitor.register_processor(tokenizer, generation_config=llm_generation_config(llm))
    register_model = getattr(monitor, "register_model", None)
    if callable(register_model) and _model_config(llm) is not None:
        register_model(llm)  # after: it joins the processor's fingerprint (one post), never posted alone first
    return registered


# --------------------------------------------------------------------------- served sampling parameters

def served_sampling_params(llm: Any, sampling_params: Any = None) -> dict[str, Any]:
    """What a ``vllm.LLM`` serves a request with: ``{"params", "logprobs_mode", "filled_from_generation_config"}``.

    ``params``: the ``SamplingParams`` the engine uses: ``sampling_params`` as given, or, when None,
    the engine's defaults (``LLM.get_default_sampling_params()``: the model's generation_config.json
    values, NVIDIA-NeMo/RL#3497), exactly as ``LLM.generate`` / ``chat`` substitute them.
    ``logprobs_mode``: the engine's ``ModelConfig.logprobs_mode`` (vLLM v1: ``raw_logprobs`` by default).
    ``filled_from_generation_config``: the keys whose served value is the generation config's default.
    """
    model_config = _model_config(llm)
    defaults = _sampling_defaults(model_config)
    params = sampling_params if sampling_params is not None else llm.get_default_sampling_params()
    return {"params": params, "logprobs_mode": getattr(model_config, "logprobs_mode", None),
            "filled_from_generation_config": _filled(params, defaults)}


def _filled(params: Any, defaults: dict[str, Any]) -> list[str]:
    """The keys whose served value is the generation config's default (what vLLM fills in)."""
    served = read_params(params)
    return sorted(k for k in SAMPLING_PARAM_KEYS if k in defaults and served.get(k) == defaults[k])


def _sampling_defaults(model_config: Any) -> dict[str, Any]:
    try:
        return dict(model_config.get_diff_sampling_param() or {}) if model_config is not None else {}
    except Exception:  # pragma: no cover - defensive: an engine without generation defaults
        logger.debug("get_diff_sampling_param failed", exc_info=True)
        return {}


def watch_llm_sampling(monitor: Any, llm: Any) -> Any:
    """Report the ``SamplingParams`` of every request the engine receives, as it receives them.

    Wraps this engine object's ``llm.llm_engine.add_request``, where ``LLM.generate`` / ``chat``
    hand over each request after substituting the generation-config defaults for a missing
    ``SamplingParams``: so what is reported is what was served. The monitor re-posts only when
    the values change. Watch an engine that serves training rollouts only (evaluation requests at
    another temperature would be reported too). Returns a callable that removes the wrapper.
    """
    engine = llm.llm_engine
    original = engine.add_request
    model_config = _model_config(llm)
    defaults = _sampling_defaults(model_config)
    mode = getattr(model_config, "logprobs_mode", None)

    def add_request(request_id: Any, prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        if hasattr(params, "temperature"):  # SamplingParams, not PoolingParams
            _report(monitor, params, mode, defaults)
        return original(request_id, prompt, params, *args, **kwargs)

    engine.add_request = add_request
    return lambda: vars(engine).pop("add_request", None)


def _report(monitor: Any, params: Any, mode: Any, defaults: dict[str, Any]) -> None:
    try:
        monitor.report_sampling_params(params, logprobs_mode=mode, source="vllm",
                                       filled_from_generation_config=_filled(params, defaults))
    except Exception:  # never fail a request for monitoring
        logger.debug("paritywatch: could not report sampling params", exc_info=True)


def report_served_sampling(monitor: Any, llm: Any, sampling_params: Any = None) -> bool:
    """Report ``served_sampling_params(llm, sampling_params)`` through ``monitor`` (the rollout side's
    ``sampling_params`` component). Call it with the params of each training ``generate``/``chat``
    call (cheap: the monitor re-posts only when the values change). Returns what the monitor returns."""
    served = served_sampling_params(llm, sampling_params)
    return monitor.report_sampling_params(served["params"], logprobs_mode=served["logprobs_mode"], source="vllm",
                                          filled_from_generation_config=served["filled_from_generation_config"])


# --------------------------------------------------------------------------- RequestOutput -> records

def records_from_request_outputs(outputs: Sequence[Any], *, messages: Sequence[Any] | None = None,
                                 policy_version: int | Sequence[int | None] | None = None) -> list[RolloutRecord]:
    """One ``RolloutRecord`` per completion (a request with ``n=4`` gives four records).

    ``outputs``: vLLM ``RequestOutput`` objects (from ``LLM.generate`` / ``LLM.chat`` or the async
    engine), read by attribute. ``messages``: one conversation per request (the messages the
    prompt was rendered from; enables the trainer's re-render check), or None.
    ``policy_version``: one int for the batch, one per request, or None to read vLLM's
    ``CompletionOutput.weight_versions`` (the oldest numeric version that sampled a token).

    Log-probs: the sampled token's log-prob at each position, when the request asked for them
    (``SamplingParams(logprobs=0)`` returns exactly the sampled token; ``logprobs=k`` adds the
    top-k). Without them ``rollout_logprobs`` is None.
    ``finish_reason``: vLLM's, except that a stop *string* becomes ``"stop_string"``: vLLM reports
    "stop" for eos ids, ``stop_token_ids`` and stop strings alike, but only the first two end on a
    stop id (the alignment eos check reads "stop" as "ended on an eos id").
    """
    outputs = list(outputs)
    if messages is not None:
        messages = list(messages)
        if len(messages) != len(outputs):
            raise ValueError(f"messages has {len(messages)} conversations for {len(outputs)} request outputs")
    versions: list[Any]
    if policy_version is None or isinstance(policy_version, int):
        versions = [policy_version] * len(outputs)
    else:
        versions = list(policy_version)
        if len(versions) != len(outputs):
            raise ValueError(f"policy_version has {len(versions)} entries for {len(outputs)} request outputs")
    records = []
    for i, request in enumerate(outputs):
        prompt_ids = [int(t) for t in (getattr(request, "prompt_token_ids", None) or [])]
        conversation = messages[i] if messages is not None else None
        for completion in getattr(request, "outputs", None) or []:
            ids = [int(t) for t in completion.token_ids]
            version = versions[i] if versions[i] is not None else _weight_version(completion)
            records.append(RolloutRecord(
                messages=[dict(m) for m in conversation] if conversation is not None else None,
                prompt_ids=prompt_ids,
                completion_ids=ids,
                rollout_logprobs=_sampled_logprobs(completion, ids),
                finish_reason=_finish_reason(completion),
                policy_version=version,
                completion_text=getattr(completion, "text", None),
                completion_ids_digest=contract.token_ids_digest(ids),  # the ids as sampled, before any post-processing
            ))
    return records


def _sampled_logprobs(completion: Any, ids: list[int]) -> list[float] | None:
    """Log-prob of the sampled token at each position; None when not requested or incomplete.
    Works for vLLM's ``list[dict[int, Logprob]]`` and ``FlatLogprobs`` (same indexing)."""
    logprobs = getattr(completion, "logprobs", None)
    if logprobs is None or len(logprobs) != len(ids):
        if logprobs is not None:
            logger.warning("paritywatch: %d log-prob positions for %d sampled ids; dropping log-probs",
                           len(logprobs), len(ids))
        return None
    values = []
    for pos, token in enumerate(ids):
        entry = logprobs[pos]
        item = entry.get(token) if entry is not None else None
        if item is None:
            return None
        value = float(getattr(item, "logprob", item))
        values.append(value if not math.isnan(value) else float("-inf"))
    return values


def _finish_reason(completion: Any) -> str | None:
    reason = getattr(completion, "finish_reason", None)
    if reason == "stop" and isinstance(getattr(completion, "stop_reason", None), str):
        return "stop_string"
    return reason


def _weight_version(completion: Any) -> int | None:
    spans = getattr(completion, "weight_versions", None) or []
    numeric = []
    for span in spans:
        try:
            numeric.append(int(getattr(span, "version", None)))
        except (TypeError, ValueError):
            continue
    return min(numeric) if numeric else None


# --------------------------------------------------------------------------- weight-sync attestation
# These run on vLLM's workers, through `LLM.collective_rpc(function, ...)`: vLLM calls a function
# with the worker as its first argument, in the worker's own process (pickled there when the
# engine runs its workers in other processes, so they live at module level).

_ATTEST_STATE = "_paritywatch_attest"


def install_weight_attestation(worker: Any, *, worker_id: str | None = None, attest_options: dict | None = None,
                               **monitor_kwargs: Any) -> str:
    """Make this worker hash every (name, tensor) its model's ``load_weights`` receives, whatever
    delivered them (NCCL broadcast, IPC handles, a colocated trainer, a checkpoint), as the trainer
    named them. Opens a rollout ``ParityMonitor(**monitor_kwargs)`` in the worker (worker id
    ``{worker_id}-rank{rank}`` when given). `attest_options` as for ``attest_weights``; both sides
    must use the same. Idempotent. Returns the monitor's worker id.

    Why the received tensors and not the model's parameters afterwards: vLLM fuses tensors
    (q/k/v into qkv_proj, gate/up into gate_up_proj), pads vocabularies and, on CPU, repacks
    linear weights for oneDNN and frees the originals, so its parameters neither match the
    trainer's names nor stay readable. What it was handed under which name is comparable.

    Full mode hashes each tensor as it is loaded (the digest does not depend on the version) and
    keeps only digests. Sampled mode's offsets depend on the version, known at the commit: it
    keeps references to the received tensors until then."""
    from ..attest import AttestOptions

    model = _worker_model(worker)
    state = getattr(worker, _ATTEST_STATE, None)
    if state is None:
        from ..monitor import ParityMonitor

        kwargs = {"side": "rollout", **monitor_kwargs}
        if worker_id is not None:
            kwargs["worker_id"] = f"{worker_id}-rank{getattr(worker, 'rank', 0)}"
        state = {"monitor": ParityMonitor(**kwargs), "options": AttestOptions(**(attest_options or {})).checked(),
                 "entries": {}, "tensors": {}, "bytes_hashed": 0, "seconds": 0.0}
        setattr(worker, _ATTEST_STATE, state)
    original = model.load_weights
    if not getattr(original, "_paritywatch_attested", False):
        def load_weights(weights: Any, *args: Any, **kwargs: Any) -> Any:
            return original(_recorded(weights, state), *args, **kwargs)

        load_weights._paritywatch_attested = True  # type: ignore[attr-defined]
        model.load_weights = load_weights
    return state["monitor"]._registry.component.worker_id


def commit_weight_attestation(worker: Any, version: int) -> dict[str, Any] | None:
    """Attest, as `version`, every tensor this worker loaded since the last commit (the latest
    copy of a name wins). Returns the attestation's summary (None if nothing was loaded or it could
    not be computed: the monitor counts and logs why; it never raises into the engine)."""
    state = getattr(worker, _ATTEST_STATE, None)
    if state is None:
        raise RuntimeError("call install_weight_attestation on the workers first")
    try:
        return _commit(state, version)
    except Exception as exc:  # never into the engine: counted and logged like any SDK failure
        state["monitor"]._guard.swallow("commit_weight_attestation", exc, says=f"could not attest version {version!r}")
        return None


def _commit(state: dict[str, Any], version: int) -> dict[str, Any] | None:
    from ..attest import WeightsDigest, payload

    monitor, opts = state["monitor"], state["options"]
    entries, tensors = state["entries"], state["tensors"]
    state["entries"], state["tensors"] = {}, {}
    hashed, seconds = state["bytes_hashed"], state["seconds"]
    state["bytes_hashed"], state["seconds"] = 0, 0.0
    if tensors:  # sampled mode: now that the version is known
        started = time.perf_counter()
        digest = WeightsDigest(version, opts)
        entries = {e["name"]: e for e in digest.digest(list(tensors.items()))}
        digest.close()
        seconds += time.perf_counter() - started
        hashed = digest.bytes_hashed
    if not entries:
        return None
    return monitor._attester.submit(payload(version, opts, list(entries.values()), hashed, seconds))


def close_weight_attestation(worker: Any, timeout: float = 10.0) -> bool:
    """Flush and close the worker's monitor (before the engine shuts down)."""
    state = getattr(worker, _ATTEST_STATE, None)
    return True if state is None else state["monitor"].close(timeout)


def _worker_model(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", worker)
    get_model = getattr(runner, "get_model", None)
    model = get_model() if callable(get_model) else getattr(runner, "model", None)
    if model is None or not callable(getattr(model, "load_weights", None)):
        raise RuntimeError("this vLLM worker has no model with load_weights (is the model loaded?)")
    return model


def _recorded(weights: Any, state: dict[str, Any]) -> Any:
    """Pass the (name, tensor) pairs through, hashing each before the model copies (and maybe
    repacks) it; a failure to hash is the monitor's to count, never the load's."""
    from ..attest import WeightsDigest

    sampled = state["options"].mode == "sampled"
    digest = None if sampled else WeightsDigest(0, state["options"])  # full digests ignore the version
    try:
        for name, tensor in weights:
            if sampled:
                state["tensors"][name] = tensor
            else:
                _hash_into(state, digest, name, tensor)
            yield name, tensor
    finally:
        if digest is not None:
            digest.close()


def _hash_into(state: dict[str, Any], digest: Any, name: str, tensor: Any) -> None:
    started = time.perf_counter()
    try:
        [entry] = digest.digest([(name, tensor)])
        state["entries"][name] = entry  # the same name may come again: the later copy wins
        state["bytes_hashed"] += entry["bytes"]
    except Exception as exc:  # the monitor's to count, never the load's
        state["monitor"]._guard.swallow("attest_load_weights", exc, says=f"could not hash {name!r} for attestation")
    state["seconds"] += time.perf_counter() - started
