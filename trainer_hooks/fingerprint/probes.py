"""The fixed behavior probes: texts and conversations every fingerprint encodes and renders.

Changing anything here changes every behavior digest: bump FINGERPRINT_VERSION when you do.
"""
from __future__ import annotations

PROBE_TEXTS: tuple[str, ...] = (
    "Hello world",
    "Cafe\u0301 na\u0131\u0308ve re\u0301sume\u0301 vs Caf\u00e9 na\u00efve r\u00e9sum\u00e9",  # NFD vs NFC
    "\uff21\uff22\uff23 \ufb01le \u2460 \u2163 \u00bd x\u00b2 \u212b",  # compatibility forms (NFKC)
    "0 7 42 1234567890 3.14159 1,000,000 2024-01-01 +1e-9",
    "  leading spaces\tand\ttabs\n\nnew  lines\r\n   trailing   ",
    "UPPER lower MiXeD Title Case",
    "I'm don't they'll we've she'd it's YOU'RE",
    "emoji \U0001f44b\U0001f3fd \U0001f1eb\U0001f1f7 \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f",
    "\u4e2d\u6587\u6d4b\u8bd5 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud55c\uad6d\uc5b4 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
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

PROBE_CONVERSATIONS: tuple[tuple[str, tuple[dict, ...]], ...] = (
    ("user", (_USER,)),
    ("system_user", (_SYSTEM, _USER)),
    ("multi_turn", (_SYSTEM, _USER, _ASSISTANT, _USER2)),
    ("tool", (_USER, _ASSISTANT, _USER2, _TOOL)),
)
