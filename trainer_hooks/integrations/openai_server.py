"""Check a running vLLM OpenAI-compatible server nobody can modify, through ``/tokenize``.

Black box: the fingerprint probes go to ``POST /tokenize`` and ``POST /detokenize`` over the hooks'
own transport (``trainer_hooks.transport``); the answers become a fingerprint holding only the
``behavior`` component (``server_fingerprint``), and the verdict is the one diff's
(``trainer_hooks.fingerprint.diff_fingerprints``) between that and the local processor's behavior,
which is also what the backend concludes once the check is posted. What the check can and cannot
see: docs/vllm.md.

    result = check_openai_server("http://vllm:8000", trainer_tokenizer)   # {"verdict": ..., ...}
    post_openai_server_check(monitor, result)   # report it to the backend as a rollout component

    # the sampling parameters a request is served with (the server fills unset ones)
    report_request_sampling(monitor, request_body, model_dir="path/to/model", logprobs_mode="raw_logprobs")
"""
from __future__ import annotations

import json

import difflib
from collections.abc import Mapping
from typing import Any

from ..contract import ENGINE_CONFIG_COMPONENT, SAMPLING_PARAM_KEYS
from ..fingerprint import diff_fingerprints
from ..fingerprint.components import generation_config_dict, tokenizer_behavior, unwrap
from ..fingerprint.core import assemble
from ..fingerprint.probes import GENERATION_PROMPT, PROBE_CONVERSATIONS, PROBE_TEXTS, chat_probe_key
from ..transport import Transport, TransportConfig, TransportError

__all__ = ["SERVER_KIND", "check_openai_server", "post_openai_server_check", "report_request_sampling",
           "request_sampling_params", "server_fingerprint"]

SERVER_KIND = "openai_server"
LOCAL_KIND = "local_processor"
_TOKENIZER_PATHS = ("/tokenize", "/detokenize")
# What vLLM's OpenAI server uses for a parameter neither the request nor the server default sets
# (vLLM 0.32 ``ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS``; the completions request's too).
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                   "presence_penalty": 0.0, "frequency_penalty": 0.0}


class _TokenizeServer:
    """The endpoints we use, each answer kept raw: ids/text, or {"error": message}."""

    def __init__(self, base_url: str, model: str | None, timeout_s: float, headers: Mapping[str, str] | None):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):  # /tokenize lives at the root, not under /v1
            self.base_url = self.base_url[:-3]
        self.model = model
        self.transport = Transport(TransportConfig(url=self.base_url, prefix="", headers=dict(headers or {}),
                                                   connect_timeout_s=timeout_s, timeout_s=timeout_s))

    def _post(self, path: str, body: dict) -> tuple[bool, Any]:
        """(True, answer) or (False, "HTTP status: message"); raises when the server cannot be reached."""
        if self.model is not None:
            body = {"model": self.model, **body}
        try:
            return True, self.transport.request("POST", path, json=body)
        except TransportError as exc:
            if exc.status is None:
                raise
            if exc.status == 404 and path in _TOKENIZER_PATHS:
                raise RuntimeError(f"{self.base_url}{path} answered 404: not a vLLM server, "
                                   "or the model name is wrong") from exc
            return False, f"HTTP {exc.status}: {str(exc.detail)[:200]}"

    def tokenize_text(self, text: str, add_special_tokens: bool) -> Any:
        ok, data = self._post("/tokenize", {"prompt": text, "add_special_tokens": add_special_tokens})
        return list(data["tokens"]) if ok else {"error": data}

    def tokenize_chat(self, conversation: list, gen: bool, kwargs: dict | None, tools: Any = None) -> Any:
        body: dict[str, Any] = {"messages": [_openai_message(m) for m in conversation], "add_generation_prompt": gen,
                                "add_special_tokens": False}
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        if tools:
            body["tools"] = [dict(t) for t in tools]
        ok, data = self._post("/tokenize", body)
        return list(data["tokens"]) if ok else {"error": data}

    def detokenize(self, ids: list[int]) -> Any:
        ok, data = self._post("/detokenize", {"tokens": ids})
        return data["prompt"] if ok else {"error": data}

    def info(self) -> dict:
        out: dict[str, Any] = {"url": self.base_url}
        for path, key in (("/version", "version"), ("/v1/models", "data")):
            try:
                value = self.transport.request("GET", path).get(key)
            except (TransportError, AttributeError):
                continue
            if key == "data":
                out["models"] = [m.get("id") for m in value or []]
                out["max_model_len"] = next((m.get("max_model_len") for m in value or []), None)
            else:
                out["vllm_version"] = value
        return out

    def close(self) -> None:
        self.transport.close()


def _local_view(processor: Any, chat_template_kwargs: dict | None) -> tuple[Any, Any, dict]:
    kind, obj = unwrap(processor)
    if kind == "mistral":
        raise TypeError("check_openai_server compares transformers-style tokenizers; mistral-common "
                        "tokenizers render chats through mistral-common, not a Jinja template")
    tok = obj.tokenizer if kind == "processor" else obj
    template = getattr(obj, "chat_template", None) or getattr(tok, "chat_template", None)
    behavior = tokenizer_behavior(tok, template, chat_template_kwargs)
    return tok, template, behavior


def _server_behavior(server: _TokenizeServer, local: dict, chat_template_kwargs: dict | None) -> dict:
    """The behavior component's shape, every id and decoded text answered by the server."""
    encode = [server.tokenize_text(t, True) for t in PROBE_TEXTS]
    plain = [server.tokenize_text(t, False) for t in PROBE_TEXTS]
    decode = [server.detokenize(ids) if isinstance(ids, list) else ids for ids in plain]
    chat: dict[str, Any] | None = {}
    for conv in PROBE_CONVERSATIONS:
        for gen in GENERATION_PROMPT:
            key = chat_probe_key(conv.name, gen)
            ids = server.tokenize_chat([dict(m) for m in conv.messages], gen, chat_template_kwargs, conv.tools)
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
    The verdict is ``diff_fingerprints`` between the two behavior-only fingerprints.

    Returns ``{"verdict": "same"|"error", "components": [...], "probes_compared": int,
    "server": {url, vllm_version, models, max_model_len}, "server_behavior": {...}}``; a component is
    ``{"name": "chat_template"|"behavior", "severity": "error", "summary", "detail"}``:
    ``chat_template`` when a probe conversation renders to other ids (detail: the first such
    conversation, both id lists, the first differing position, and a unified diff of the local
    rendered text against the server's ids detokenized); ``behavior`` when any probe differs
    (detail: ``first`` differing probe with both id lists, ``parts``, ``differing``, a sample).
    ``server_behavior`` feeds ``server_fingerprint``. Raises ``TransportError`` when the server
    cannot be reached.
    """
    _, _, local = _local_view(processor, chat_template_kwargs)
    server = _TokenizeServer(base_url, model, timeout_s, headers)
    try:
        observed = _server_behavior(server, local, chat_template_kwargs)
        info = server.info()
    finally:
        server.close()
    result: dict[str, Any] = {"server": info, "server_behavior": observed,
                              "chat_template_kwargs": dict(chat_template_kwargs or {})}
    diff = diff_fingerprints(assemble(LOCAL_KIND, {"behavior": local}, {}), server_fingerprint(result))
    rows = _behavior_rows(local, observed)
    components = _chat_template_component(rows, local) + _behavior_component(diff, rows)
    compared = 3 * len(PROBE_TEXTS) + (2 * len(PROBE_CONVERSATIONS) if (local.get("chat") or observed.get("chat")) else 0)
    return {"verdict": diff["verdict"], "components": components, "probes_compared": compared, **result}


def _chat_template_component(rows: list[dict], local: dict) -> list[dict]:
    """The first probe conversation the server renders to other ids, explained."""
    chat_rows = [r for r in rows if r["part"] == "chat"]
    if not chat_rows:
        return []
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
    total = len(local.get("chat") or {}) or len(chat_rows)
    return [{"name": "chat_template", "severity": "error",
             "summary": f"the server renders {len(chat_rows)} of {total} probe conversations to other ids; "
                        f"first: {first['probe']}",
             "detail": detail}]


def _behavior_component(diff: dict, rows: list[dict]) -> list[dict]:
    """The diff's behavior row, with the probe-level rows that say which probe and where."""
    found = [c for c in diff["components"] if c["name"] == "behavior"]
    if not found:
        return []
    component = dict(found[0])
    if rows:
        component["summary"] = f"{len(rows)} probes differ; first: {_row_summary(rows[0])}"
    component["detail"] = {"parts": component["detail"].get("parts", []), "differing": len(rows),
                           "first": rows[0] if rows else None, "sample": rows[:5]}
    return [component]


def server_fingerprint(check: Mapping[str, Any]) -> dict[str, Any]:
    """A fingerprint-shaped object holding ONLY what the server was seen to do.

    Its one component is ``behavior``, built from the server's answers (ids from ``/tokenize``,
    decodes from ``/detokenize``; a conversation's ``text`` is the server's ids detokenized, since
    the rendered text itself is not observable). Every other component (vocab, special tokens,
    chat template text, generation eos ids, sampling defaults...) is absent, which the diff and
    the backend read as "not comparable" (info), never as "same". So the backend's parity verdict
    against the trainer is ``error`` when the server behaves differently on the probes, and
    ``info`` (never ``same``) when it agrees on them. ``kind`` is ``"openai_server"``. The one
    engine setting the API shows, ``/v1/models``' ``max_model_len``, is an ``engine_config``
    component (judged against the trainer model's ``max_position_embeddings``).
    """
    env = {"class": "OpenAIServer", "kind": SERVER_KIND, "observed_via": ["/tokenize", "/detokenize"],
           **{k: v for k, v in dict(check.get("server") or {}).items() if k in ("url", "vllm_version", "models")}}
    if check.get("chat_template_kwargs"):
        env["chat_template_kwargs"] = dict(check["chat_template_kwargs"])
    values = {"behavior": check["server_behavior"]}
    max_model_len = (check.get("server") or {}).get("max_model_len")
    if isinstance(max_model_len, int):  # the one engine setting /v1/models shows
        values[ENGINE_CONFIG_COMPONENT] = {"engine": SERVER_KIND, "max_model_len": max_model_len}
    return assemble(SERVER_KIND, values, env)


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


# --------------------------------------------------------------------------- served sampling parameters

def request_sampling_params(request: Mapping[str, Any], *, generation_config: Any = None,
                            model_dir: Any = None) -> dict[str, Any]:
    """The sampling parameters a vLLM OpenAI server serves ``request`` (a chat or completions body)
    with: ``{"params": {key: value}, "filled_from_generation_config": [keys]}``.

    vLLM's rule (``to_sampling_params``): the request's value when it is set (not null), else the
    server's default, else the OpenAI default. The server's defaults are not observable through
    the API: they come from the model's generation_config.json (vLLM's ``--generation-config auto``,
    the default; NVIDIA-NeMo/RL#3497), so give ``generation_config`` (a dict, a GenerationConfig, or
    the string ``"vllm"`` for a server started with ``--generation-config vllm``: no defaults) or
    the ``model_dir`` whose generation_config.json the server reads.
    """
    if isinstance(generation_config, str) and generation_config == "vllm":
        defaults: dict[str, Any] = {}
    else:
        defaults = dict(generation_config_dict(generation_config, model_dir) or {})
    params, filled = {}, []
    for key in SAMPLING_PARAM_KEYS:
        if request.get(key) is not None:
            params[key] = request[key]
        elif defaults.get(key) is not None:
            params[key], filled = defaults[key], [*filled, key]
        else:
            params[key] = OPENAI_DEFAULTS[key]
    return {"params": params, "filled_from_generation_config": filled}


def report_request_sampling(monitor: Any, request: Mapping[str, Any], *, generation_config: Any = None,
                            model_dir: Any = None, logprobs_mode: str | None = None) -> bool:
    """Report what a vLLM OpenAI server serves ``request`` with (``request_sampling_params``)
    through a rollout-side ``monitor``. ``logprobs_mode``: the server's ``--logprobs-mode`` (vLLM
    v1's default is ``raw_logprobs``), not observable through the API: None leaves it uncompared."""
    served = request_sampling_params(request, generation_config=generation_config, model_dir=model_dir)
    return monitor.report_sampling_params(served["params"], logprobs_mode=logprobs_mode, source=SERVER_KIND,
                                          filled_from_generation_config=served["filled_from_generation_config"])


def _openai_message(message: dict) -> dict:
    """A probe message in the OpenAI wire format: tool-call arguments travel as a JSON string (the
    server rejects an object; vLLM parses the string back into the dict the chat template renders,
    as transformers' apply_chat_template gets it locally)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": c["function"]["arguments"]
                           if isinstance(c["function"].get("arguments"), str)
                           else json.dumps(c["function"].get("arguments", {}))}} for c in calls]}
