"""Offline fixtures for the integration tests: the shared ChatML BPE tokenizer with Qwen2.5's chat template."""

from __future__ import annotations

import pytest

from tests.fixtures.tokenizers import build_chatml_tokenizer


def build_qwen_like_tokenizer(tmp_path, chat_template: str | None = None):
    """Byte-level BPE trained offline, ChatML specials, and TRL's copy of a Qwen template (2.5 by default).

    TRL's AsyncGRPO rollout loop only accepts chat templates it knows (`add_response_schema`).
    """
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    path = build_chatml_tokenizer(tmp_path, chat_template=chat_template or qwen2_5_chat_template, name="qwen-like")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    return build_qwen_like_tokenizer(tmp_path_factory.mktemp("tok"))
