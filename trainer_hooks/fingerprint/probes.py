"""The fixed behavior probes: texts and conversations every fingerprint encodes and renders.

The diff compares probes by index (texts) and by name (conversations) on what both sides report,
so the probe set may grow within one ``fingerprint_version``: append texts, add conversations
under new names. Changing an existing probe's content changes what old fingerprints mean: that
needs a FINGERPRINT_VERSION bump.
"""
from __future__ import annotations

from typing import NamedTuple

PROBE_TEXTS: tuple[str, ...] = (
    "Hello world",
    "Cafe\u0301 na\u0131\u0308ve re\u0301sume\u0301 vs Caf\u00e9 na\u00efve r\u00e9sum\u00e9",  # NFD vs NFC
    "\uff21\uff22\uff23 \ufb01le \u2460 \u2163 \u00bd x\u00b2 \u212b",  # compatibility forms (NFKC)
    "0 7 42 1234567890 3.14159 1,000,000 2024-01-01 +1e-9",
    "  leading spaces\tand\ttabs\n\nnew  lines\r\n   trailing   ",
    "UPPER lower MiXeD Title Case",
    "I'm don't they'll we've she'd it's YOU'RE",
    "emoji \U0001f44b\U0001f3fd \U0001f1eb\U0001f1f7 \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f",
    "\u4e2d\u6587\u6d4b\u8bd5 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 "
    "\ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "def f(x):\n    return x ** 2  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<s>[INST] hi [/INST]</s> [CLS] x [SEP] <unk> <pad> <mask>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>hi<\uff5cend\u2581of\u2581sentence\uff5c><|begin_of_text|><|eot_id|>",
    "",
)

_SYSTEM = {"role": "system", "content": "You are a careful assistant."}
_USER = {"role": "user", "content": "What is 2 + 2? Answer with  two spaces."}
_ASSISTANT = {"role": "assistant", "content": "It is 4.\nAnything else?"}
_USER2 = {"role": "user", "content": "Call the tool, please \u2764\ufe0f"}
_TOOL = {"role": "tool", "content": "{\"result\": 4}"}
# Reasoning, both ways frameworks pass it: inline <think> (DeepSeek-R1, Qwen3 history) and the
# reasoning_content field that Qwen3-style templates read.
_ASSISTANT_THINK = {"role": "assistant", "content": "<think>\nAdd 2 and 2.\n</think>\n\nIt is 4."}
_ASSISTANT_REASONING = {"role": "assistant", "content": "It is 4.", "reasoning_content": "Add 2 and 2."}
_TOOLS = ({
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
},)
_ASSISTANT_CALL = {"role": "assistant", "content": "",
                   "tool_calls": [{"id": "call00001", "type": "function",
                                   "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]}
_TOOL_RESULT = {"role": "tool", "tool_call_id": "call00001", "name": "add", "content": "4"}


class Conversation(NamedTuple):
    name: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None = None


# The first four are the original probes (kept byte for byte: older fingerprints compare on them).
PROBE_CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation("user", (_USER,)),
    Conversation("system_user", (_SYSTEM, _USER)),
    Conversation("multi_turn", (_SYSTEM, _USER, _ASSISTANT, _USER2)),
    Conversation("tool", (_USER, _ASSISTANT, _USER2, _TOOL)),
    Conversation("reasoning_history", (_SYSTEM, _USER, _ASSISTANT_THINK, _USER2)),
    Conversation("reasoning_last", (_USER, _ASSISTANT_THINK)),
    Conversation("reasoning_field", (_USER, _ASSISTANT_REASONING)),
    Conversation("tools_defined", (_USER,), _TOOLS),
    Conversation("tool_call", (_SYSTEM, _USER, _ASSISTANT_CALL, _TOOL_RESULT), _TOOLS),
)

# Every conversation is rendered with and without add_generation_prompt: "<name>/gen=<0|1>".
GENERATION_PROMPT = (False, True)


def chat_probe_key(name: str, add_generation_prompt: bool) -> str:
    return f"{name}/gen={int(add_generation_prompt)}"


def text_probe_label(index: int) -> str:
    """A readable name for encode/decode probe ``index``: its position and its text, clipped."""
    if not 0 <= index < len(PROBE_TEXTS):
        return f"text[{index}]"
    text = PROBE_TEXTS[index]
    shown = text if len(text) <= 24 else text[:23] + "…"
    return f"text[{index}] {shown!r}"
