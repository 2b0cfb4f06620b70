"""vLLM rollout side: register an engine, turn its outputs into RolloutRecords, check a server.

Importing this module is free: nothing from vLLM, torch or transformers is imported here; the
objects you pass in are read by duck typing, and the server check speaks plain HTTP (httpx).

Rollout worker with an in-process engine (``vllm.LLM``)::

    from trainer_hooks import ParityMonitor
    from trainer_hooks.integrations.vllm import register_llm, records_from_request_outputs

    llm = LLM(model=path)
    monitor = ParityMonitor(run="grpo-qwen", side="rollout", url=PARITYWATCH_URL)
    register_llm(monitor, llm)          # the tokenizer AND generation config the engine really uses
    outputs = llm.chat(conversations, SamplingParams(logprobs=0, max_tokens=256))
    records = records_from_request_outputs(outputs, messages=conversations, policy_version=version)
    monitor.log_rollout_batch(records, processor=trainer_processor)   # or ship records to the trainer

A vLLM OpenAI-compatible server you cannot modify (black box, through ``/tokenize``)::

    result = check_openai_server("http://vllm:8000", trainer_tokenizer)   # {"verdict": ..., ...}
    post_openai_server_check(monitor, result)   # report it to the backend as a rollout component

What the server check can and cannot see: docs/vllm.md.
"""
from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..alignment import RolloutRecord
from ..fingerprint.components import SAMPLING_KEYS, tokenizer_behavior, unwrap
from ..fingerprint.core import assemble
from ..fingerprint.probes import PROBE_CONVERSATIONS, PROBE_TEXTS

__all__ = ["check_openai_server", "llm_generation_config", "post_openai_server_check",
           "records_from_request_outputs", "register_llm", "server_fingerprint"]

logger = logging.getLogger(__name__)

SERVER_KIND = "openai_server"


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
    (``llm_generation_config``). Returns what ``monitor.register_processor`` returns (a Future of
    the fingerprint for ParityMonitor)."""
    tokenizer = llm.get_tokenizer() if callable(getattr(llm, "get_tokenizer", None)) else llm
    return monitor.register_processor(tokenizer, generation_config=llm_generation_config(llm))


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


# --------------------------------------------------------------------------- black-box server check

class _Server:
    """The two endpoints we use, each answer kept raw: {"ok": ids/text} or {"error": message}."""

    def __init__(self, base_url: str, model: str | None, timeout_s: float, headers: Mapping[str, str] | None):
        import httpx

        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):  # /tokenize lives at the root, not under /v1
            self.base_url = self.base_url[:-3]
        self.model = model
        self.client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=dict(headers or {}))

    def _post(self, path: str, body: dict) -> tuple[bool, Any]:
        if self.model is not None:
            body = {"model": self.model, **body}
        response = self.client.post(path, json=body)
        if response.status_code == 404 and path in ("/tokenize", "/detokenize"):
            raise RuntimeError(f"{self.base_url}{path} answered 404: not a vLLM server, or the model name is wrong")
        try:
            data = response.json()
        except ValueError:
            data = {"message": response.text[:200]}
        if response.status_code >= 400:
            err = data.get("error", data) if isinstance(data, dict) else data
            message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return False, f"HTTP {response.status_code}: {str(message)[:200]}"
        return True, data

    def tokenize_text(self, text: str, add_special_tokens: bool) -> Any:
        ok, data = self._post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
        return list(data["tokens"]) if ok else {"error": data}

    def tokenize_chat(self, conversation: list, gen: bool, kwargs: dict | None) -> Any:
        body: dict[str, Any] = {"messages": conversation, "add_generation_prompt": gen, "add_special_tokens": False}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        ok, data = self._post("/tokenize", body)
        return list(data["tokens"]) if ok else {"error": data}

    def detokenize(self, ids: list[int]) -> Any:
        ok, data = self._post("/detokenize", {"tokens": ids})
        return data["prompt"] if ok else {"error": data}

    def info(self) -> dict:
        out: dict[str, Any] = {"url": self.base_url}
        for path, key in (("/version", "version"), ("/v1/models", "data")):
            try:
                response = self.client.get(path)
                if response.status_code == 200:
                    value = response.json().get(key)
                    if key == "data":
                        out["models"] = [m.get("id") for m in value or []]
                        out["max_model_len"] = next((m.get("max_model_len") for m in value or []), None)
                    else:
                        out["vllm_version"] = value
            except Exception:
                continue
        return out

    def close(self) -> None:
        self.client.close()


def _local_view(processor: Any, chat_template_kwargs: dict | None) -> tuple[Any, Any, dict]:
    kind, obj = unwrap(processor)
    if kind == "mistral":
        raise TypeError("check_openai_server compares transformers-style tokenizers; mistral-common "
                        "tokenizers render chats through mistral-common, not a Jinja template")
    tok = obj.tokenizer if kind == "processor" else obj
    template = getattr(obj, "chat_template", None) or getattr(tok, "chat_template", None)
    behavior = tokenizer_behavior(tok, template)
    if chat_template_kwargs and behavior["chat"] is not None:
        for name, conversation in PROBE_CONVERSATIONS:
            for gen in (False, True):
                behavior["chat"][f"{name}/gen={int(gen)}"] = _render_with(tok, list(conversation), gen,
                                                                          template, chat_template_kwargs)
    return tok, template, behavior


def _render_with(tok: Any, conversation: list, gen: bool, template: Any, kwargs: dict) -> Any:
    call = {"tokenize": False, "add_generation_prompt": gen, **kwargs}
    if not isinstance(template, dict):
        call["chat_template"] = template
    try:
        text = tok.apply_chat_template(conversation, **call)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)[:200]}
    return {"text": text, "ids": list(tok.encode(text, add_special_tokens=False))}


def _server_behavior(server: _Server, local: dict, chat_template_kwargs: dict | None) -> dict:
    """The behavior component's shape, every id and decoded text answered by the server."""
    encode = [server.tokenize_text(t, True) for t in PROBE_TEXTS]
    plain = [server.tokenize_text(t, False) for t in PROBE_TEXTS]
    decode = [server.detokenize(ids) if isinstance(ids, list) else ids for ids in plain]
    chat: dict[str, Any] | None = {}
    for name, conversation in PROBE_CONVERSATIONS:
        for gen in (False, True):
            key = f"{name}/gen={int(gen)}"
            ids = server.tokenize_chat([dict(m) for m in conversation], gen, chat_template_kwargs)
            if isinstance(ids, list):
                text = server.detokenize(ids)
                chat[key] = {"text": text, "ids": ids}
            else:
                mine = (local.get("chat") or {}).get(key)
                # Both refuse the conversation: the server's exception class is not observable, so
                # the entry records the local refusal (the observation is "it refused too").
                chat[key] = mine if isinstance(mine, dict) and "error" in mine else {"error": "ServerError",
                                                                                     "message": ids["error"]}
    if local.get("chat") is None and all("error" in v for v in chat.values()):
        chat = None  # no template on either side: the server refuses every chat, the local side has none
    return {"encode": encode, "encode_no_special": plain, "decode": decode, "chat": chat}


def _first_diff(a: Any, b: Any) -> int | None:
    if not (isinstance(a, list) and isinstance(b, list)):
        return None if a == b else 0
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _behavior_rows(local: dict, server: dict) -> list[dict]:
    rows = []
    for part in ("encode", "encode_no_special", "decode"):
        for i, (mine, theirs) in enumerate(zip(local[part], server[part])):
            if mine != theirs:
                row = {"part": part, "probe": PROBE_TEXTS[i], "local": mine, "server": theirs}
                if part != "decode":
                    row["first_diff_pos"] = _first_diff(mine, theirs)
                rows.append(row)
    local_chat, server_chat = local.get("chat") or {}, server.get("chat") or {}
    for key in dict.fromkeys([*local_chat, *server_chat]):  # probe order
        mine, theirs = local_chat.get(key), server_chat.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict) and "error" in mine and "error" in theirs:
            continue  # both refuse this conversation
        mine_ids = mine.get("ids") if isinstance(mine, dict) else None
        theirs_ids = theirs.get("ids") if isinstance(theirs, dict) else None
        if mine_ids is not None and mine_ids == theirs_ids:
            continue
        rows.append({"part": "chat", "probe": key, "local": mine, "server": theirs,
                     "first_diff_pos": _first_diff(mine_ids, theirs_ids)})
    return rows


def _row_summary(row: dict) -> str:
    pos = row.get("first_diff_pos")
    where = f" (first differing id at position {pos})" if pos is not None else ""
    return f"{row['part']} probe {row['probe']!r}{where}"


def check_openai_server(base_url: str, processor: Any, *, model: str | None = None,
                        chat_template_kwargs: dict[str, Any] | None = None, timeout_s: float = 30.0,
                        headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Compare a running vLLM OpenAI-compatible server's tokenization with ``processor``'s.

    Black box: only ``POST /tokenize`` (text probes with and without special tokens; the probe
    conversations with and without ``add_generation_prompt``, rendered by the server's own chat
    template) and ``POST /detokenize`` (decode of the server's ids) are used, with the probes of
    ``trainer_hooks.fingerprint.probes``. ``processor`` renders and encodes the same probes locally.

    Returns ``{"verdict": "same"|"error", "components": [...], "probes_compared": int,
    "server": {url, vllm_version, models, max_model_len}, "server_behavior": {...}}``; a component is
    ``{"name": "chat_template"|"behavior", "severity": "error", "summary", "detail"}``:
    ``chat_template`` when a probe conversation renders to other ids (detail: the first such
    conversation, both id lists, the first differing position, and a unified diff of the local
    rendered text against the server's ids detokenized); ``behavior`` when any probe differs
    (detail: ``first`` differing probe with both id lists, ``parts``, ``differing``, a sample).
    ``server_behavior`` feeds ``server_fingerprint``. Raises on transport errors (server down).
    """
    _, _, local = _local_view(processor, chat_template_kwargs)
    server = _Server(base_url, model, timeout_s, headers)
    try:
        observed = _server_behavior(server, local, chat_template_kwargs)
        info = server.info()
    finally:
        server.close()
    rows = _behavior_rows(local, observed)
    components = []
    chat_rows = [r for r in rows if r["part"] == "chat"]
    if chat_rows:
        first = chat_rows[0]
        mine, theirs = first["local"], first["server"]
        mine_text = mine.get("text") if isinstance(mine, dict) else None
        theirs_text = theirs.get("text") if isinstance(theirs, dict) else None
        detail = {"probe": first["probe"], "first_diff_pos": first["first_diff_pos"],
                  "local_ids": mine.get("ids") if isinstance(mine, dict) else None,
                  "server_ids": theirs.get("ids") if isinstance(theirs, dict) else None,
                  "local_error": mine.get("error") if isinstance(mine, dict) else None,
                  "server_error": theirs.get("message") if isinstance(theirs, dict) and "error" in theirs else None,
                  "differing_conversations": [r["probe"] for r in chat_rows]}
        if isinstance(mine_text, str) and isinstance(theirs_text, str):
            detail["unified_diff"] = "".join(difflib.unified_diff(
                mine_text.splitlines(keepends=True), theirs_text.splitlines(keepends=True),
                fromfile="local (rendered)", tofile="server (its ids, detokenized)"))
        components.append({"name": "chat_template", "severity": "error",
                           "summary": f"the server renders {len(chat_rows)} of {len(local.get('chat') or {}) or len(chat_rows)}"
                                      f" probe conversations to other ids; first: {first['probe']}",
                           "detail": detail})
    if rows:
        first = rows[0]
        components.append({"name": "behavior", "severity": "error",
                           "summary": f"{len(rows)} probes differ; first: {_row_summary(first)}",
                           "detail": {"parts": sorted({r["part"] for r in rows}), "differing": len(rows),
                                      "first": first, "sample": rows[:5]}})
    compared = 3 * len(PROBE_TEXTS) + (2 * len(PROBE_CONVERSATIONS) if (local.get("chat") or observed.get("chat")) else 0)
    return {"verdict": "error" if components else "same", "components": components,
            "probes_compared": compared, "server": info, "server_behavior": observed,
            "chat_template_kwargs": dict(chat_template_kwargs or {})}


def server_fingerprint(check: Mapping[str, Any]) -> dict[str, Any]:
    """A fingerprint-shaped object holding ONLY what the server was seen to do.

    Its one component is ``behavior``, built from the server's answers (ids from ``/tokenize``,
    decodes from ``/detokenize``; a conversation's ``text`` is the server's ids detokenized, since
    the rendered text itself is not observable). Every other component (vocab, special tokens,
    chat template text, generation eos ids, sampling defaults...) is absent, which the diff and
    the backend read as "not comparable" (info), never as "same". So the backend's parity verdict
    against the trainer is ``error`` when the server behaves differently on the probes, and
    ``info`` (never ``same``) when it agrees on them. ``kind`` is ``"openai_server"``.
    """
    env = {"class": "OpenAIServer", "kind": SERVER_KIND, "observed_via": ["/tokenize", "/detokenize"],
           **{k: v for k, v in dict(check.get("server") or {}).items() if k in ("url", "vllm_version", "models")}}
    if check.get("chat_template_kwargs"):
        env["chat_template_kwargs"] = dict(check["chat_template_kwargs"])
    return assemble(SERVER_KIND, {"behavior": check["server_behavior"]}, env)


def post_openai_server_check(monitor: Any, check: Mapping[str, Any], *, step: int | None = None) -> bool:
    """Report a ``check_openai_server`` result through a rollout-side ``ParityMonitor``.

    Registers ``server_fingerprint(check)`` as the monitor's fingerprint (the backend then compares
    it with the trainer's, as for any rollout worker) and logs ``parity/server_check_error``
    (1.0 or 0.0) and ``parity/server_probes_differing``. Returns what register_fingerprint returned.
    """
    ok = monitor.register_fingerprint(server_fingerprint(check))
    differing = next((c["detail"]["differing"] for c in check.get("components", []) if c["name"] == "behavior"), 0)
    metrics = {"parity/server_check_error": float(check.get("verdict") == "error"),
               "parity/server_probes_differing": float(differing)}
    monitor.log(metrics, 0 if step is None else step)
    return bool(ok)
