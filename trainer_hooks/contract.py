"""The wire contract between the hooks and the backend, defined once (docs/design.md, "Wire contract").

Standard library only: the backend imports this module too, and the hooks must work in an image
that has nothing but the hooks' own dependencies. Change a rule here and both sides follow it.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import re
import struct
from typing import Any

# --------------------------------------------------------------------------- where

API_PREFIX = "/api/v1"
# A process of a run is one of these sides (`POST /runs/{id}/components`).
SIDES = ("trainer", "rollout")
# Severities of alerts and rules, worst first.
SEVERITIES = ("error", "warning", "info")


# The paths the hooks call, relative to API_PREFIX (tests/contract/test_hook_paths.py matches each
# against the backend's OpenAPI schema).
WHOAMI_PATH = "/whoami"
RUNS_PATH = "/runs"


def run_path(run_id: int, tail: str) -> str:
    """`/runs/{run_id}/{tail}`: metrics, audits, components, control/wait, control/stopped."""
    return f"{RUNS_PATH}/{run_id}/{tail}"


def component_path(run_id: int, component_id: int, tail: str) -> str:
    """`/runs/{run_id}/components/{component_id}/{tail}`: fingerprint, attestations, heartbeat, close."""
    return run_path(run_id, f"components/{component_id}/{tail}")


# --------------------------------------------------------------------------- runs and processes

# The run state machine (docs/design.md, "Runs, processes and control"): control actions move
# running <-> paused -> stopping -> stopped; process lifecycle adds finished (the trainer closed
# without a stop) and crashed (every process lost; recoverable).
RUN_STATES = ("running", "paused", "stopping", "stopped", "finished", "crashed")
LIVE_RUN_STATES = ("running", "paused", "stopping")  # the heartbeat sweep looks at these only
ENDED_RUN_STATES = ("stopped", "finished")  # a clean end: its open alerts resolve
STOP_STATES = ("stopping", "stopped")  # a hook that sees one of these stops training
ACTIVE_RUN_STATES = ("running", "paused")  # a detector acts on these only (a stopping run is ending)
# Control actions: action -> (the states it may start from, the state it moves the run to). The
# server enforces them; the dashboard offers an action only where it is allowed (/ui-config).
RUN_CONTROL_ACTIONS = {
    "pause": (("running",), "paused"),
    "resume": (("paused",), "running"),
    "stop": (("running", "paused", "crashed"), "stopping"),  # a crashed run: stopped at once (nobody is left)
}
COMPONENT_STATUSES = ("live", "closed", "lost")  # stored
# What readers are shown: the stored status, or `ended` (never stored): a live process of an ended
# run silent for the heartbeat timeout (backend/detect/workers.py, process_state).
ENDED_PROCESS = "ended"
PROCESS_STATES = (*COMPONENT_STATUSES, ENDED_PROCESS)
ALERT_KINDS = ("processor_mismatch", "metric_threshold", "metric_trend", "heartbeat_lost",
               "weights_mismatch", "weights_stale", "weights_backwards", "sample_audit")

# --------------------------------------------------------------------------- metric batches

# Points a batch may carry, counted on the wire: len(steps) * len(series), nulls included.
MAX_POINTS_PER_BATCH = 100_000
# Metric keys (series) a batch may create, and a run may hold: a batch over either is refused
# whole (422, saying the cap and how many keys were new) before anything is written. Every key is
# a row with its own chunks, roll-ups and stats: 10,000 keys a batch keep its write short beside
# the other runs' batches (docs/design.md, "Metric keys"); a run at 100,000 keys logs a key per
# sample or per token id, not a metric.
MAX_NEW_KEYS_PER_BATCH = 10_000
MAX_KEYS_PER_RUN = 100_000
MAX_KEY_LENGTH = 200
MAX_NAME_LENGTH = 200  # run, project and worker names
MAX_STEP = 2**53
MAX_CLIENT_ID_LENGTH = 64
MAX_SEQ = 2**62
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")

# Each process reports the metric points it lost (queue full, spool full, refused) as its running
# total under DROPPED_POINTS_KEY/<its worker id>, so a gap in a chart is explained on the run, process
# by process (one key for all would show whichever process posted last).
DROPPED_POINTS_KEY = "paritywatch/dropped_points"


def dropped_points_key(worker_id: str) -> str:
    """The key a process reports its lost points under: a valid metric key whatever its worker id."""
    key = f"{DROPPED_POINTS_KEY}/{_CONTROL_CHARACTERS.sub('?', worker_id)}"
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(worker_id.encode()).hexdigest()[:12]
    return f"{key[:MAX_KEY_LENGTH - len(digest) - 1]}~{digest}"


def is_dropped_points_key(key: str) -> bool:
    return key.startswith(DROPPED_POINTS_KEY + "/")


# Metrics one of many rollout workers posts carry its name as the key's first segment:
# `worker3/rollout/kl`, `w07/align/kl_k3`, `rollout-012/...` (a segment that ends in digits).
# Per-worker rules watch every such key of their base key (docs/design.md, "Trend rules").
_WORKER_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z_-]*\d+$")


def split_worker_key(key: str) -> tuple[str | None, str]:
    """(worker, base key) of a per-worker key; (None, key) for any other key."""
    head, sep, rest = key.partition("/")
    if sep and rest and _WORKER_SEGMENT.match(head):
        return head, rest
    return None, key


# Framework metric packs the backend ships (backend/detect/packs.py has their rules): a run or a
# project enables them by name (`packs=["verl"]`).
# `moe` is no framework: it holds the levels of MoE models (Paritywatch's own k3 and router flips).
PACK_NAMES = ("verl", "trl", "slime", "nemo_rl", "skyrl", "prime_rl", "moe")
# The router flip rate of an MoE model, as a user logs it (`trainer_hooks.sample_identity.router_flip_rate`):
# the share of (token, layer) top-k expert choices that differ between the rollout engine and the trainer.
MOE_ROUTER_FLIP_RATE_KEY = "moe/router_flip_rate"


# Kinds of rules (`POST /runs/{id}/rules`): a level, a trend, what a series started with, a
# saw-tooth (backend/detect/); the scored ones take a score against the noise as their threshold.
RULE_KINDS = ("threshold", "trend", "baseline", "sawtooth")
SCORED_RULE_KINDS = ("trend", "sawtooth")


# A run's config is JSON: NaN and the infinities (which strict JSON, and PostgreSQL's json type,
# cannot hold) are stored and returned as these strings, at any depth, on every database.
NONFINITE_CONFIG_VALUES = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def config_value(value: Any) -> Any:
    """`value` (a run config or any part of it) with each non-finite float replaced by its string."""
    if isinstance(value, float) and not math.isfinite(value):
        return NONFINITE_CONFIG_VALUES[repr(value)]
    if isinstance(value, dict):
        return {k: config_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [config_value(v) for v in value]
    return value


def metric_key_problem(key: Any, max_length: int = MAX_KEY_LENGTH) -> str | None:
    """Why `key` is not a metric key the server accepts, or None when it is one (`max_length`:
    a server configured with another limit, PARITYWATCH_MAX_KEY_LENGTH)."""
    if not isinstance(key, str):
        return f"metric keys are strings, not {type(key).__name__}"
    if not 0 < len(key) <= max_length:
        return f"metric keys are 1..{max_length} characters (got {len(key)})"
    if _CONTROL_CHARACTERS.search(key):
        return "metric keys contain no control characters"
    return None


def step_value(step: Any) -> int:
    """A step as the server takes it: an integer in [0, 2**53]. Python and numpy integers pass;
    bools, floats and strings raise TypeError, out-of-range integers ValueError."""
    return _whole_number(step, "step", MAX_STEP)


def _whole_number(value: Any, what: str, maximum: int) -> int:
    """`value` as an int in [0, maximum]; TypeError for bools and non-integers, ValueError outside."""
    if isinstance(value, bool) or _is_bool_dtype(value):
        raise TypeError(f"a bool is not a {what}")
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"a {what} is an integer, not {type(value).__name__}")
    number = int(value)
    if not 0 <= number <= maximum:
        raise ValueError(f"{what} {number} is outside [0, 2**53]")
    return number


def metric_value(value: Any) -> float | None:
    """A value as it goes on the wire: a float, or None for null, NaN and +-Infinity (which the
    server skips and counts; strict JSON has no NaN).

    The server takes JSON numbers only, so this raises TypeError for what it would reject: bools
    (True is not a number), strings ("2.5" is text), and anything else that is not a real number.
    Python ints and floats, numpy scalars and 0-d arrays, and one-element torch tensors pass.
    """
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes, complex)) or _is_bool_dtype(value):
        raise TypeError(f"metric values are numbers, not {type(value).__name__}")
    if not isinstance(value, numbers.Real) and not hasattr(value, "__float__"):
        raise TypeError(f"metric values are numbers, not {type(value).__name__}")
    try:
        number = float(value)
    except Exception as exc:  # a many-element array or tensor; torch raises RuntimeError
        raise TypeError(f"metric values are single numbers: {exc}") from None
    return number if math.isfinite(number) else None


def _is_bool_dtype(value: Any) -> bool:
    """numpy.bool_ and bool tensors: truth values, not numbers."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


# --------------------------------------------------------------------------- sampling parity

# The fingerprint component that says how a process samples (rollout: what each request was
# really served with) or scores (trainer: what its log-prob recompute assumes). docs/fingerprint.md.
SAMPLING_PARAMS_COMPONENT = "sampling_params"
# Its keys, every one always present; null means "disabled" (top_k -1/0, top_p 1.0, penalty 1.0...).
SAMPLING_PARAM_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                       "frequency_penalty")
# Plus "logprobs_mode": what the reported log-probs are taken from (null: not known, not compared).
# raw: the model's distribution before temperature, penalties and top-k/top-p (vLLM v1's default);
# processed: the distribution tokens were sampled from, after all of them.
LOGPROBS_MODES = ("raw", "processed")


# --------------------------------------------------------------------------- heartbeats

# A heartbeat's body (`POST /runs/{id}/components/{cid}/heartbeat`, every field optional): how
# far along the process is. The trainer reports the weights version it last published, a rollout
# worker the version it serves; the server shows each worker's lag behind the trainer.
HEARTBEAT_POLICY_VERSION = "policy_version"
HEARTBEAT_SAMPLES_PER_S = "samples_per_s"  # samples produced per second over the last interval
HEARTBEAT_POINTS_PER_S = "points_per_s"  # metric points delivered per second over the last interval
MAX_POLICY_VERSION = MAX_STEP
MAX_RATE_PER_S = 1e12


def policy_version_value(version: Any) -> int:
    """A policy version as the server takes it: an integer in [0, 2**53] (bools and floats raise
    TypeError, out-of-range integers ValueError), the same rule as a step."""
    if isinstance(version, bool) or _is_bool_dtype(version) or not isinstance(version, numbers.Integral):
        raise TypeError(f"policy versions are integers, not {type(version).__name__}")
    value = int(version)
    if not 0 <= value <= MAX_POLICY_VERSION:
        raise ValueError(f"policy version {value} is outside [0, 2**53]")
    return value


# --------------------------------------------------------------------------- errors

# The error envelope: {"error": {"status", "code", "message", "details"?}}. Every code the server
# sends is one of these (tests/api/test_error_codes.py checks the backend against this list).
ERROR_BAD_REQUEST = "bad_request"
ERROR_UNAUTHORIZED = "unauthorized"
ERROR_FORBIDDEN = "forbidden"
ERROR_NOT_FOUND = "not_found"
ERROR_FINGERPRINT_UNKNOWN = "fingerprint_unknown"  # 404: post the full fingerprint, not only its digest
ERROR_METHOD_NOT_ALLOWED = "method_not_allowed"
ERROR_CONFLICT = "conflict"
ERROR_PAYLOAD_TOO_LARGE = "payload_too_large"
ERROR_UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
ERROR_VALIDATION = "validation_error"
ERROR_FINGERPRINT_DIGEST_MISMATCH = "fingerprint_digest_mismatch"  # 422: a digest its values do not hash to
ERROR_TOO_MANY_REQUESTS = "too_many_requests"
ERROR_INTERNAL = "internal_error"
ERROR_UNAVAILABLE = "unavailable"  # 503 + Retry-After: the database is busy or away
ERROR_SECRET_KEY_MISSING = "secret_key_missing"  # 503: webhook secrets need PARITYWATCH_SECRET_KEYS
ERROR_OTHER = "error"  # an HTTP status without a code of its own

# The code of an error that has no more specific one.
ERROR_CODE_FOR_STATUS = {
    400: ERROR_BAD_REQUEST,
    401: ERROR_UNAUTHORIZED,
    403: ERROR_FORBIDDEN,
    404: ERROR_NOT_FOUND,
    405: ERROR_METHOD_NOT_ALLOWED,
    409: ERROR_CONFLICT,
    413: ERROR_PAYLOAD_TOO_LARGE,
    415: ERROR_UNSUPPORTED_MEDIA_TYPE,
    422: ERROR_VALIDATION,
    429: ERROR_TOO_MANY_REQUESTS,
    500: ERROR_INTERNAL,
    503: ERROR_UNAVAILABLE,
}
ERROR_CODES = frozenset(ERROR_CODE_FOR_STATUS.values()) | {
    ERROR_FINGERPRINT_UNKNOWN, ERROR_FINGERPRINT_DIGEST_MISMATCH, ERROR_SECRET_KEY_MISSING, ERROR_OTHER}


def error_envelope(status: int, message: str, code: str | None = None, details: Any = None) -> dict:
    """The body of an error answer; `code` defaults to the status's own code."""
    error: dict[str, Any] = {"status": status, "code": code or ERROR_CODE_FOR_STATUS.get(status, ERROR_OTHER),
                             "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def error_code_and_message(body: Any) -> tuple[str | None, str | None]:
    """(code, message) of an error body in the envelope; (None, None) for anything else."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, None
    code, message = error.get("code"), error.get("message")
    return (code if isinstance(code, str) else None), (message if isinstance(message, str) else None)


# --------------------------------------------------------------------------- retries

# 4xx answers that describe a passing condition, so the same request may succeed later. Every
# other 4xx is permanent: 409 is a conflict with stored state (a stop nobody asked for, a second
# run of that name...), and repeating the request cannot change it.
RETRYABLE_CLIENT_ERRORS = frozenset({408, 425, 429})
# Statuses whose Retry-After header says when to come back (503: the database is busy).
RETRY_AFTER_STATUSES = frozenset({429, 503})


def is_retryable_status(status: int) -> bool:
    """May repeating a request that got `status` succeed? Server errors and RETRYABLE_CLIENT_ERRORS."""
    return status >= 500 or status in RETRYABLE_CLIENT_ERRORS


# --------------------------------------------------------------------------- connections

# An idle keep-alive connection must be dropped by the hook before the server drops it: a request
# sent on a connection the server is closing at that moment is reset, and the hook reports the
# backend unreachable. The hook keeps idle connections HOOK_KEEPALIVE_S (httpx's default, made
# explicit); the server, SERVER_KEEPALIVE_S (uvicorn's default, 5 s, is the same as httpx's: a race).
HOOK_KEEPALIVE_S = 5.0
SERVER_KEEPALIVE_S = 30.0


# --------------------------------------------------------------------------- webhooks

EVENT_ALERT_FIRING = "alert.firing"
EVENT_ALERT_RESOLVED = "alert.resolved"
EVENT_ALERT_ACKNOWLEDGED = "alert.acknowledged"
EVENT_RUN_CONTROL = "run.control"
EVENT_RUN_ENDED_TAINTED = "run.ended_tainted"
EVENT_TEST = "test"
# The event types a webhook subscribes to, with what each means (GET /webhooks/event-types).
WEBHOOK_EVENT_DESCRIPTIONS = {
    EVENT_ALERT_FIRING: "A group of alerts (by default: one run, one alert kind) has new or still-firing alerts.",
    EVENT_ALERT_RESOLVED: "Every alert of a group that was announced as firing has resolved.",
    EVENT_ALERT_ACKNOWLEDGED: "Someone acknowledged an alert.",
    EVENT_RUN_CONTROL: "A run was paused, resumed, stopped, completed its stop, or crashed (never for a clean finish).",
    EVENT_RUN_ENDED_TAINTED: ("A run ended (stopped, finished or crashed) having trained steps while a divergence "
                              "was open (a processor or weights mismatch, misaligned samples): data.taint lists the step ranges; "
                              "checkpoints from data.taint.first_step on were trained on them. Never sent for a "
                              "run that trained clean."),
    EVENT_TEST: "The test event sent from the Webhooks page or POST /webhooks/{id}/test.",
}
WEBHOOK_EVENT_TYPES = tuple(WEBHOOK_EVENT_DESCRIPTIONS)

# --------------------------------------------------------------------------- fingerprints

# Tables and settings the probes can only sample: judged by what differs in them (an eos id is an
# error, a pad token info: trainer_hooks/fingerprint/effects.py), an error when that cannot be told.
FINGERPRINT_TABLES = ("vocab", "merges", "added_tokens", "special_tokens", "encode_flags",
                      "generation_eos", "image_processor", "processor")
# The tokenizer pipeline's structure: a difference matters when behaviour differs too.
FINGERPRINT_STRUCTURE = ("model_params", "normalizer", "pre_tokenizer", "post_processor", "decoder")
# The order a diff lists components in (and the dashboard shows them in): chat_template first,
# the readable cause of most behavior differences.
# The model and the engine that run it (trainer_hooks/fingerprint/model_config.py): config fields that
# change logits, weight / lm_head precision, the LoRA adapter really active, the engine's settings.
MODEL_CONFIG_COMPONENT = "model_config"
LORA_ADAPTER_COMPONENT = "lora_adapter"
ENGINE_CONFIG_COMPONENT = "engine_config"
MODEL_COMPONENTS = (MODEL_CONFIG_COMPONENT, LORA_ADAPTER_COMPONENT, ENGINE_CONFIG_COMPONENT)
# Components a process learns while it serves (its first request, a weight sync) and re-posts:
# not part of a mismatch alert's identity, so the re-post refreshes an open alert.
LATE_FINGERPRINT_COMPONENTS = (SAMPLING_PARAMS_COMPONENT, LORA_ADAPTER_COMPONENT, ENGINE_CONFIG_COMPONENT)
FINGERPRINT_COMPONENT_ORDER = (("chat_template", "behavior") + FINGERPRINT_TABLES + FINGERPRINT_STRUCTURE
                               + (SAMPLING_PARAMS_COMPONENT, "sampling_defaults") + MODEL_COMPONENTS + ("runtime",))


# --------------------------------------------------------------------------- per-sample audits

# `POST /runs/{id}/audits`: one rollout batch's per-sample audit (trainer_hooks/audit.py). Only the
# worst samples travel, each with a few tokens either side of its first mismatch: bounded whatever
# the batch size.
AUDIT_DEFAULT_TOP_K = 8
AUDIT_MAX_SAMPLES = 64
AUDIT_DEFAULT_WINDOW = 4  # tokens shown on each side of a mismatch
AUDIT_MAX_WINDOW = 16
AUDIT_MAX_TOKEN_CHARS = 64  # a token string longer than this is cut (marked with a trailing "…")
# Why a completion ended: on an eos id, cut at the length limit, on another stop (a stop string or
# a stop id the trainer does not count as eos), or not known.
FINISH_REASONS = ("eos", "length", "stop", "unknown")
# Where a sample's first mismatch is: the trainer's re-render of the prompt, where ids and
# log-probs stop lining up, where the ids the trainer trains on leave the sampled ones, or an eos id
# the rollout sampled past.
AUDIT_WINDOW_KINDS = ("rerender", "length", "ids", "eos")
AUDIT_MAX_IMAGES = 32  # image grid rows a sample's image summary carries (more are cut)
AUDIT_MAX_GRID_DIMS = 4  # numbers in a grid row ([t, h, w] or [h, w]; more are cut)


def token_ids_digest(ids: Any) -> str:
    """The digest of a sample's completion ids (blake2b-128 of little-endian int64s). The rollout
    computes it where it sampled them (`RolloutRecord.completion_ids_digest`); the trainer over the
    ids it trains on: post-processing in between (huggingface/trl#7039) shows as a different digest."""
    values = [int(i) for i in ids]
    return hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=16).hexdigest()

# --------------------------------------------------------------------------- weight attestations

# `POST /runs/{id}/components/{cid}/attestations`: the digests of the weights a process holds for a
# version (docs/design.md, "Weight-sync attestation"). Tensor digests are hex strings of the
# named algorithm over the tensor's bytes (plus dtype and shape); `digest` is WEIGHTS_DIGEST of
# the sorted (name, tensor digest) pairs, which the server recomputes (standard library only).
ATTEST_ALGOS = ("xxh3_128", "sha256")
ATTEST_MODES = ("full", "sampled")
MAX_ATTEST_TENSORS = 100_000
MAX_TENSOR_NAME_LENGTH = 500
MAX_WEIGHTS_VERSION = 2**53


def weights_version_value(version: Any) -> int:
    """A weights version as the server takes it: an integer in [0, 2**53] (usually the trainer's
    step at the sync). Same rules as a step: bools, floats and strings raise TypeError."""
    return _whole_number(version, "weights version", MAX_WEIGHTS_VERSION)


def weights_digest(tensor_digests: Any) -> str:
    """The digest of a whole attestation: sha256 over "name\\tdigest\\n" lines sorted by name. Two
    attestations with equal digests hold equal tensor digests under equal names."""
    lines = sorted(f"{name}\t{digest}\n" for name, digest in tensor_digests)
    return hashlib.sha256("".join(lines).encode()).hexdigest()
