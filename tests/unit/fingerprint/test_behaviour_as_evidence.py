"""Behaviour probes are evidence, not a second finding (issue 29, follow-up of 29.6): a diff marks
the behaviour row that only demonstrates another component's difference, and every text built from
a diff names the components that differ with the probes as their evidence."""
from __future__ import annotations

import copy

from conftest import builders
from paritywatch.backend.detect.parity import differing_components, evidence_of_findings
from paritywatch.backend.detect.taint import cause_of
from trainer_hooks.fingerprint import diff_fingerprints
from trainer_hooks.fingerprint.core import with_component
from trainer_hooks.fingerprint.diff import findings, findings_text


def _templates_differ(tmp_path, load, fp):
    a = fp(load(builders.build_chatml_tokenizer(tmp_path, name="a")))
    b = fp(load(builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=builders.CUSTOM_TEMPLATE)))
    return a, b, diff_fingerprints(a, b)


def test_a_template_difference_is_one_finding_with_the_renders_as_evidence(tmp_path, load, fp):
    _, _, result = _templates_differ(tmp_path, load, fp)
    rows = {r["name"]: r for r in result["components"]}
    assert rows["behavior"]["evidence_of"] == {"chat": "chat_template"}  # the row stays, marked
    n = len(rows["behavior"]["detail"]["differing_probes"]["chat"])
    m = rows["chat_template"]["detail"]["renders"]["compared"]
    assert 0 < n <= m
    assert findings(result, "error") == [("chat_template", f"rendered differently in {n} of {m} probe conversations")]
    assert differing_components(result, "error") == ["chat_template"]
    assert evidence_of_findings(result, "error") == {"chat_template": f"rendered differently in {n} of {m} probe conversations"}
    assert findings_text(result, "error") == f"chat_template (rendered differently in {n} of {m} probe conversations)"


def test_a_tokenizer_table_is_named_with_what_the_probes_show_of_it(tmp_path, load, fp):
    from tokenizers import normalizers

    a = fp(load(builders.build_chatml_tokenizer(tmp_path, name="a")))
    b = fp(load(builders.build_chatml_tokenizer(tmp_path, name="b", normalizer=normalizers.Lowercase())))
    result = diff_fingerprints(a, b)
    marked = next(r for r in result["components"] if r["name"] == "behavior")["evidence_of"]
    assert set(marked.values()) == {"normalizer"} and "encode" in marked
    [(name, why)] = findings(result, "error")
    assert name == "normalizer" and "encoded differently in" in why
    assert "behavior" not in findings_text(result)


def test_behaviour_no_component_explains_stays_a_finding(tmp_path, load, fp):
    a = fp(load(builders.build_chatml_tokenizer(tmp_path, name="a")))
    behavior = copy.deepcopy(a["components"]["behavior"]["value"])
    behavior["encode"][0] = [1, 2, 3]  # the same files, tokenized otherwise (a patched runtime, say)
    result = diff_fingerprints(a, with_component(a, "behavior", behavior))
    assert [r["name"] for r in result["components"]] == ["behavior"]
    assert result["components"][0]["evidence_of"] == {}  # marked as its own finding
    assert findings(result, "error") == [("behavior", "")] and differing_components(result) == ["behavior"]


def test_a_less_severe_component_does_not_absorb_an_error(tmp_path, load, fp):
    """Templates that differ in text only (a warning) explain no encode difference: the behaviour
    error keeps its own name, so the alert's title names the error it is about."""
    a = fp(load(builders.build_chatml_tokenizer(tmp_path, name="a")))
    b = with_component(a, "chat_template", a["components"]["chat_template"]["value"] + "{# a comment #}")
    behavior = copy.deepcopy(a["components"]["behavior"]["value"])
    behavior["encode"][0] = [1, 2, 3]
    result = diff_fingerprints(a, with_component(b, "behavior", behavior))
    assert {r["name"]: r["severity"] for r in result["components"]} == {"chat_template": "warning", "behavior": "error"}
    assert differing_components(result, "error") == ["behavior"]


def test_the_taint_record_says_what_differs_with_its_evidence():
    detail = {"components": ["chat_template"], "evidence": {"chat_template": "rendered differently in 3 of 18 probe conversations"}}
    cause = cause_of("processor_mismatch", "error", detail, 7)
    assert (cause.key, cause.what) == ("processor:chat_template",
                                       "chat_template differs (rendered differently in 3 of 18 probe conversations)")
    two = cause_of("processor_mismatch", "error", {**detail, "components": ["chat_template", "vocab"]}, 7)
    assert two.what == "chat_template, vocab differ (chat_template: rendered differently in 3 of 18 probe conversations)"
