"""Chat templates are judged by what they render (issue 12, point 3), with real tokenizers.

Text that renders to nothing is a warning that shows the diff and says on how many probe
conversations both render the same; any difference in a rendering stays an error. The probes cover
system prompts, multi-turn, reasoning, tools and the run's chat_template kwargs.
"""
from __future__ import annotations

import json

import pytest

from conftest import builders, names
from tests.fixtures.chat_templates import (GEN_PROMPT_NEWLINE_VARIANT, QWEN3_STYLE_TEMPLATE, TEXT_ONLY_VARIANT,
                                           TRL_DEFAULT_TEMPLATE)
from trainer_hooks.fingerprint import diff_fingerprints, fingerprint_processor
from trainer_hooks.fingerprint.cli import main
from trainer_hooks.fingerprint.probes import PROBE_CONVERSATIONS

RENDERS = 2 * len(PROBE_CONVERSATIONS)  # every conversation with and without the generation prompt


def _pair(tmp_path, template_a, template_b):
    a = builders.build_chatml_tokenizer(tmp_path, name="a", chat_template=template_a)
    b = builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=template_b)
    return a, b


def _row(result, name):
    return next(c for c in result["components"] if c["name"] == name)


def test_text_only_template_difference_is_a_warning_with_exit_1(tmp_path, capsys):
    a, b = _pair(tmp_path, TRL_DEFAULT_TEMPLATE, TEXT_ONLY_VARIANT)
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "verdict: WARNING" in out
    assert f"render all {RENDERS} probe conversations identically" in out
    assert "+{#- chat template v2 -#}{%- for message in messages -%}" in out  # the text diff is shown
    assert main(["diff", str(a), str(b), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert [(c["name"], c["severity"]) for c in result["components"]] == [("chat_template", "warning")]
    renders = _row(result, "chat_template")["detail"]["renders"]
    assert renders == {"compared": RENDERS, "same": RENDERS, "rendered": RENDERS, "differing": [], "unexercised": []}


def test_generation_prompt_one_newline_longer_stays_an_error(tmp_path, capsys):
    a, b = _pair(tmp_path, TRL_DEFAULT_TEMPLATE, GEN_PROMPT_NEWLINE_VARIANT)
    assert main(["diff", str(a), str(b), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)
    assert {c["name"]: c["severity"] for c in result["components"]} == {"chat_template": "error", "behavior": "error"}
    differing = _row(result, "chat_template")["detail"]["renders"]["differing"]
    assert differing == [f"{conv.name}/gen=1" for conv in PROBE_CONVERSATIONS]  # only with the prompt


def test_a_template_that_raises_on_a_probe_is_judged_by_that(tmp_path, load, fp):
    strict = ("{% for message in messages %}{% if message['role'] == 'tool' %}"
              "{{ raise_exception('no tool role') }}{% endif %}{% endfor %}" + TRL_DEFAULT_TEMPLATE)
    commented = "{# strict #}" + strict
    a, b = _pair(tmp_path, strict, commented)
    same_errors = diff_fingerprints(fp(load(a)), fp(load(b)))
    assert same_errors["verdict"] == "warning"
    assert "raise the same error on both sides" in _row(same_errors, "chat_template")["summary"]
    # the lenient default renders what the strict one refuses: that is a difference in behaviour
    c = builders.build_chatml_tokenizer(tmp_path, name="c", chat_template=TRL_DEFAULT_TEMPLATE)
    refused = diff_fingerprints(fp(load(a)), fp(load(c)))
    assert refused["verdict"] == "error"
    assert "tool/gen=0" in _row(refused, "chat_template")["detail"]["renders"]["differing"]


def test_named_template_that_no_probe_renders_stays_an_error(tmp_path, load, fp):
    a = load(builders.build_chatml_tokenizer(tmp_path, name="named"))
    b = load(tmp_path / "named")
    a.chat_template = {"default": TRL_DEFAULT_TEMPLATE, "rag": TRL_DEFAULT_TEMPLATE}
    b.chat_template = {"default": TEXT_ONLY_VARIANT, "rag": GEN_PROMPT_NEWLINE_VARIANT}
    result = diff_fingerprints(fp(a), fp(b))
    row = _row(result, "chat_template")
    assert (row["severity"], row["detail"]["renders"]["unexercised"]) == ("error", ["rag"])
    b.chat_template = {"default": TEXT_ONLY_VARIANT, "rag": TRL_DEFAULT_TEMPLATE}
    assert diff_fingerprints(fp(a), fp(b))["verdict"] == "warning"


@pytest.mark.parametrize("change, probes", [
    # reasoning kept in every assistant turn instead of only after the last user turn
    (("loop.index0 > ns.last_user and reasoning", "reasoning"), {"reasoning_history/gen=0", "reasoning_history/gen=1"}),
    # tool definitions announced differently
    (("'# Tools\\n<tools>'", "'# Functions\\n<tools>'"),
     {"tools_defined/gen=0", "tools_defined/gen=1", "tool_call/gen=0", "tool_call/gen=1"}),
    # tool calls serialised without their arguments
    (("'arguments': call.function.arguments", "'args': call.function.arguments"), {"tool_call/gen=0", "tool_call/gen=1"}),
])
def test_reasoning_and_tool_probes_catch_what_plain_chats_cannot(tmp_path, load, fp, change, probes):
    variant = QWEN3_STYLE_TEMPLATE.replace(*change)
    assert variant != QWEN3_STYLE_TEMPLATE
    a, b = _pair(tmp_path, QWEN3_STYLE_TEMPLATE, variant)
    result = diff_fingerprints(fp(load(a)), fp(load(b)))
    assert result["verdict"] == "error"
    assert set(_row(result, "chat_template")["detail"]["renders"]["differing"]) == probes
    # the original four conversations alone would have called these templates equivalent
    assert not probes & {f"{n}/gen={g}" for n in ("user", "system_user", "multi_turn", "tool") for g in (0, 1)}


def test_the_runs_chat_template_kwargs_are_rendered(tmp_path, load):
    path = builders.build_chatml_tokenizer(tmp_path, name="qwen3", chat_template=QWEN3_STYLE_TEMPLATE)
    tok = load(path)
    default = fingerprint_processor(tok, refresh=True)
    no_think = fingerprint_processor(tok, refresh=True, chat_template_kwargs={"enable_thinking": False})
    assert no_think["env"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in default["env"]
    text = no_think["components"]["behavior"]["value"]["chat"]["user/gen=1"]["text"]
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    result = diff_fingerprints(default, no_think)
    assert (result["verdict"], names(result)) == ("error", {"behavior"})
    assert [c["cause"] for c in result["causes"]] == ["chat_template_kwargs"]
    # a template difference inside the enable_thinking branch matters only to a run that sets it
    other = QWEN3_STYLE_TEMPLATE.replace("'<think>\\n\\n</think>\\n\\n'", "'<think>\\n</think>\\n'")
    tok_other = load(builders.build_chatml_tokenizer(tmp_path, name="other", chat_template=other))
    assert diff_fingerprints(default, fingerprint_processor(tok_other, refresh=True))["verdict"] == "warning"
    off = {"enable_thinking": False}
    assert diff_fingerprints(no_think, fingerprint_processor(tok_other, refresh=True, chat_template_kwargs=off))[
        "verdict"] == "error"


def test_kwargs_are_part_of_the_cache_key(tmp_path, load):
    tok = load(builders.build_chatml_tokenizer(tmp_path, name="qwen3", chat_template=QWEN3_STYLE_TEMPLATE))
    first = fingerprint_processor(tok, chat_template_kwargs={"enable_thinking": False})
    assert fingerprint_processor(tok)["digest"] != first["digest"]
    assert fingerprint_processor(tok, chat_template_kwargs={"enable_thinking": False}) is first


def test_cli_passes_chat_template_kwargs(tmp_path, capsys):
    path = builders.build_chatml_tokenizer(tmp_path, name="qwen3", chat_template=QWEN3_STYLE_TEMPLATE)
    assert main(["fingerprint", str(path), "--json", "--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    fp = json.loads(capsys.readouterr().out)
    assert fp["env"]["chat_template_kwargs"] == {"enable_thinking": False}
    with pytest.raises(SystemExit):
        main(["fingerprint", str(path), "--chat-template-kwargs", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_fingerprints_with_fewer_probes_compare_on_the_shared_ones(chatml_dir, load, fp):
    """A fingerprint from a paritywatch with the original four conversations (same wire version)
    against today's: no false alarm, the shared probes decide."""
    from trainer_hooks.fingerprint.core import assemble

    new = fp(load(chatml_dir))
    behavior = json.loads(json.dumps(new["components"]["behavior"]["value"]))
    originals = {"user", "system_user", "multi_turn", "tool"}
    behavior["chat"] = {k: v for k, v in behavior["chat"].items() if k.split("/")[0] in originals}
    old = assemble("tokenizer", {**{n: c["value"] for n, c in new["components"].items()}, "behavior": behavior},
                   new["env"])
    result = diff_fingerprints(old, new)
    assert result["verdict"] == "info"
    row = _row(result, "behavior")
    assert row["detail"]["compared"] == 3 * 14 + 8 and len(row["detail"]["only_b"]) == RENDERS - 8
    # and a real difference on a shared probe is still an error
    behavior["encode"][0] = [0]
    broken = assemble("tokenizer", {**{n: c["value"] for n, c in new["components"].items()}, "behavior": behavior},
                      new["env"])
    assert diff_fingerprints(broken, new)["verdict"] == "error"
