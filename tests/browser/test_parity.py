"""The parity panel and the fingerprint diff dialog in Chromium (issues 17.1, 17.8, 16.4, 12.3-4).

Real tokenizers are fingerprinted, posted to a real server, and read back through the dashboard.
"""
from __future__ import annotations

import copy
import random
import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems
from tests.browser.seed import Seeder, chatml_fingerprint
from tests.fixtures.chat_templates import TEXT_ONLY_VARIANT, TRL_CUSTOM_TEMPLATE, TRL_DEFAULT_TEMPLATE
from trainer_hooks.fingerprint.core import with_component

pytestmark = pytest.mark.browser

# Renders markup into every conversation: the probe texts carry it into the dialog.
MARKUP_TEMPLATE = "{{ '<img src=x onerror=\"window.__pwned = 1\"><b>bold</b>' }}" + TRL_DEFAULT_TEMPLATE


def _run(seeder, name, trainer_fp, rollout_fp):
    run = seeder.run(name, project="parity")
    trainer = seeder.component(run["id"], "trainer", "trainer-rank0")
    seeder.fingerprint(run["id"], trainer["id"], trainer_fp)
    rollout = seeder.component(run["id"], "rollout", "vllm-default-tok")
    seeder.fingerprint(run["id"], rollout["id"], rollout_fp)
    return run


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory):
    work = tmp_path_factory.mktemp("parity-tokenizers")
    default = chatml_fingerprint(work, TRL_DEFAULT_TEMPLATE, "default")
    s = Seeder(server.url)
    return {
        "trl": _run(s, "trl-bug", chatml_fingerprint(work, TRL_CUSTOM_TEMPLATE, "custom"), default),
        "text_only": _run(s, "text-only-template", default, chatml_fingerprint(work, TEXT_ONLY_VARIANT, "text-only")),
        "markup": _run(s, "markup-template", default, chatml_fingerprint(work, MARKUP_TEMPLATE, "markup")),
        "special": _run(s, "think-special-token", default,  # same renders, other ids
                        chatml_fingerprint(work, TRL_DEFAULT_TEMPLATE, "think", extra_special_tokens=("<think>",))),
        "unexplained": _run(s, "pad-and-other-ids", default, _other_ids_without_pad(work)),
    }


def _other_ids_without_pad(work):  # noqa: ANN001, ANN202
    """No pad token (an info difference) and one probe text encoded otherwise (an error no table
    explains: a patched runtime, say)."""
    fp = chatml_fingerprint(work, TRL_DEFAULT_TEMPLATE, "no-pad", pad_token=None)
    behavior = copy.deepcopy(fp["components"]["behavior"]["value"])
    behavior["encode"][0] = [1, 2, 3]
    return with_component(fp, "behavior", behavior)


def _open_cell(page, server, run, component):
    page.goto(f"{server.url}/#/runs/{run['id']}")
    page.locator(f"tr[data-component={component}] td[data-state=differs] button").click()
    details = page.locator(f"dialog[open] details[data-component={component}][open]")
    details.wait_for()
    return details


def test_trl_pair_shows_each_template_in_its_own_column(page, server, runs, screenshots):
    diff = _open_cell(page, server, runs["trl"], "chat_template")
    trainer = " ".join(diff.locator("td[data-side=trainer]").all_inner_texts())
    rollout = " ".join(diff.locator("td[data-side=rollout]").all_inner_texts())
    assert TRL_CUSTOM_TEMPLATE in trainer and TRL_DEFAULT_TEMPLATE not in trainer
    assert TRL_DEFAULT_TEMPLATE in rollout and TRL_CUSTOM_TEMPLATE not in rollout
    assert "+{% for message" not in trainer  # nothing glued onto the removed line
    expect(diff.locator(".no-eol")).to_have_count(2)  # neither template ends in a newline
    expect(diff.locator("td[data-side=rollout] mark")).not_to_have_count(0)
    page.screenshot(path=str(screenshots / "parity-trl-template.png"), full_page=False)


def test_behaviour_rows_name_their_probes_and_fit_the_dialog(page, server, runs, screenshots):
    template = _open_cell(page, server, runs["trl"], "chat_template")
    template.locator("details.evidence-probes summary").click()  # the behaviour probes: the template's evidence
    behavior = template
    rows = behavior.locator("tr[data-probe]")
    expect(rows.first).to_be_visible()
    probes = [rows.nth(i).get_attribute("data-probe") for i in range(rows.count())]
    assert "user/gen=0" in probes and all(re.fullmatch(r"[a-z_]+/gen=[01]", p) for p in probes), probes
    first = behavior.locator(".rendered-probe tr[data-probe='user/gen=0']")
    expect(first.locator("th")).to_contain_text("user/gen=0")
    trainer_text = first.locator("td[data-side=trainer] .probe-text").inner_text()
    rollout_text = first.locator("td[data-side=rollout] .probe-text").inner_text()
    assert "You are a math tutor." in trainer_text and "You are a math tutor." not in rollout_text
    assert '\\n' in rollout_text  # escaped: newlines are visible
    # the first difference: the system prompt the custom template inserts, missing on the rollout side
    expect(first.locator("td[data-side=trainer] .probe-text mark")).to_have_text(
        "system\\nYou are a math tutor.<|im_end|>\\n<|im_start|>")
    expect(first.locator("td[data-side=rollout] .probe-text mark")).to_have_text("∅")
    expect(first.locator("td[data-side=rollout] .tok.differs")).not_to_have_count(0)
    width = page.viewport_size["width"]
    for cell in behavior.locator(".probe-table td[data-side=rollout]").all():
        box = cell.bounding_box()
        assert box["x"] + box["width"] <= width, "the rollout column runs off-screen"
    page.screenshot(path=str(screenshots / "parity-behaviour-rows.png"), full_page=False)


def test_parity_panel_shows_the_rendered_probe_and_its_tokens(page, server, runs, screenshots):
    """Issue 16.4: in the panel itself, the first differing probe conversation as each side renders
    it (escaped, first difference marked) and the token strings at the first differing id."""
    page.goto(f"{server.url}/#/runs/{runs['trl']['id']}")
    row = page.locator("#parity details.probe-preview[open] tr[data-probe]")
    expect(row).to_have_count(1)
    expect(row.locator("th")).to_contain_text("user/gen=0")
    trainer = row.locator("td[data-side=trainer]")
    rollout = row.locator("td[data-side=rollout]")
    assert "You are a math tutor." in trainer.locator(".probe-text").inner_text()
    assert "You are a math tutor." not in rollout.locator(".probe-text").inner_text()
    assert "<|im_start|>∅user\\nWhat is 2 + 2?" in rollout.locator(".probe-text").inner_text()  # newlines escaped
    expect(trainer.locator(".probe-text mark")).to_have_text("system\\nYou are a math tutor.<|im_end|>\\n<|im_start|>")
    expect(rollout.locator(".probe-text mark")).to_have_text("∅")
    expect(row.locator(".token-at")).to_contain_text("token ")
    trainer_tokens = trainer.locator(".tok.differs").all_inner_texts()
    rollout_tokens = rollout.locator(".tok.differs").all_inner_texts()
    assert trainer_tokens and rollout_tokens and trainer_tokens != rollout_tokens, (trainer_tokens, rollout_tokens)
    assert trainer.locator(".tok:not(.differs)").all_inner_texts() == rollout.locator(".tok:not(.differs)").all_inner_texts()
    page.locator("#parity").screenshot(path=str(screenshots / "parity-panel-rendered-probe.png"))


def test_parity_panel_shows_the_tokens_when_the_renders_match_but_the_ids_do_not(page, server, runs):
    page.goto(f"{server.url}/#/runs/{runs['special']['id']}")
    preview = page.locator("#parity details.probe-preview[open]")
    expect(preview.locator("summary")).to_contain_text("tokenizes reasoning_history/gen=0 differently")
    row = preview.locator("tr[data-probe]")
    trainer, rollout = row.locator("td[data-side=trainer]"), row.locator("td[data-side=rollout]")
    assert trainer.locator(".probe-text").inner_text() == rollout.locator(".probe-text").inner_text()
    expect(row.locator(".probe-text mark")).to_have_count(0)  # the texts agree ...
    expect(trainer.locator(".tok.differs")).to_have_text(['"<"', '"thi"', '"n"', '"k"', '">"'])  # ... the ids do not
    expect(rollout.locator(".tok.differs")).to_have_text(['"<think>"'])
    expect(row.locator(".token-at")).to_contain_text('"<think>"')


def test_parity_panel_has_no_preview_when_only_the_template_text_differs(page, server, runs):
    page.goto(f"{server.url}/#/runs/{runs['text_only']['id']}")
    page.locator("tr[data-component=chat_template] td[data-state=differs]").wait_for()
    expect(page.locator("#parity .probe-preview")).to_have_count(0)


def test_show_diff_from_the_alert_opens_the_chat_template(page, server, runs):
    page.goto(f"{server.url}/#/runs/{runs['trl']['id']}")
    page.locator(".alert-item[data-kind=processor_mismatch] button", has_text="Show diff").click()
    template = page.locator("dialog[open] details[data-component=chat_template][open]")
    template.wait_for()
    expect(page.locator("dialog[open] details[data-component=behavior][open]")).to_have_count(0)
    # the rendered view first: the probe as both sides render it, then the template source
    rendered = template.locator(".rendered-probe tr[data-probe='user/gen=0']")
    expect(rendered.locator("td[data-side=trainer] .probe-text mark")).to_contain_text("You are a math tutor.")
    expect(rendered.locator("td[data-side=rollout] .tok.differs")).not_to_have_count(0)


def test_behaviour_probes_show_as_the_evidence_of_the_template_not_a_second_finding(page, server, runs, screenshots):
    """Issue 29.7: `behavior` listed as a differing component beside `chat_template` read as noise: the
    probes rendered differently because the templates differ. They are shown as that evidence."""
    page.goto(f"{server.url}/#/runs/{runs['trl']['id']}")
    template = page.locator("tr[data-component=chat_template] td[data-state=differs]")
    expect(template.locator("[data-evidence=chat]")).to_have_text(
        re.compile(r"^rendered differently in \d+ of 18 probe conversations$"), timeout=30_000)  # a busy machine
    behavior = page.locator("tr[data-component=behavior] td").first  # the one rollout group
    expect(behavior).to_have_attribute("data-state", "evidence")
    expect(behavior).to_have_text("↳ evidence of chat_template")
    expect(page.locator("td[data-state=differs]")).to_have_count(1)  # one finding: the template
    expect(page.locator("[data-banner=mismatch] code")).to_have_text("chat_template")
    expect(page.locator(".alert-item[data-kind=processor_mismatch] .muted")).not_to_contain_text("behavior")
    page.locator("#parity").screenshot(path=str(screenshots / "parity-behaviour-as-evidence.png"))

    behavior.get_by_role("button", name="chat_template").click()
    dialog = page.locator("dialog[open]")
    expect(dialog.locator(".diff-verdict")).to_contain_text("1 component(s) differ")
    expect(dialog.locator("details[data-component]")).to_have_count(1)
    evidence = dialog.locator("details[data-component=chat_template] [data-evidence=chat_template]")
    expect(evidence.locator(".evidence-head")).to_contain_text("rendered differently in")

    # the diff's mark decides: a pad token that differs (info) does not absorb an encode error it cannot cause
    page.goto(f"{server.url}/#/runs/{runs['unexplained']['id']}")
    behavior = page.locator("tr[data-component=behavior] td").first
    expect(behavior).to_have_attribute("data-state", "differs", timeout=30_000)
    expect(page.locator("tr[data-component=special_tokens] [data-evidence]")).to_have_count(0)

    # the same renders with other ids (a special token one side lacks): the probes show a tokenizer table's difference
    page.goto(f"{server.url}/#/runs/{runs['special']['id']}")
    behavior = page.locator("tr[data-component=behavior] td").first  # the one rollout group
    expect(behavior).to_have_attribute("data-state", "evidence", timeout=30_000)
    host = behavior.locator("button").inner_text()
    expect(page.locator(f"tr[data-component={host}] td[data-state=differs] [data-evidence=chat]")).to_contain_text(
        "tokenized differently in")


def test_text_only_difference_is_a_warning_that_says_the_renders_match(page, server, runs, screenshots):
    page.goto(f"{server.url}/#/runs/{runs['text_only']['id']}")
    cell = page.locator("tr[data-component=chat_template] td[data-state=differs]")
    expect(cell).to_have_attribute("data-severity", "warning")
    expect(page.locator("td[data-state=differs]")).to_have_count(1)  # behaviour matches: only the text differs
    page.locator(".alert-item[data-kind=processor_mismatch]").wait_for()  # a warning alert, listed ...
    expect(page.locator("[data-banner=mismatch]")).to_have_count(0)  # ... with no red "misaligned tokens" banner
    diff = _open_cell(page, server, runs["text_only"], "chat_template")
    expect(diff.locator("[data-renders]")).to_contain_text("Rendered the same on all 18 probe conversations")
    expect(diff.locator("td[data-side=rollout]")).to_contain_text("{#- chat template v2 -#}")
    page.screenshot(path=str(screenshots / "parity-text-only-warning.png"), full_page=False)


def test_rendered_probe_text_stays_text(page, server, runs):
    template = _open_cell(page, server, runs["markup"], "chat_template")
    template.locator("details.evidence-probes summary").click()
    text = template.locator(".evidence tr[data-probe] td[data-side=rollout] .probe-text").first.inner_text()
    assert '<img src=x onerror=\\"window.__pwned = 1\\"><b>bold</b>' in text
    assert page.evaluate("window.__pwned") is None
    assert page.evaluate("document.querySelectorAll('dialog img, dialog b, #parity img, #parity b').length") == 0
    panel = page.locator("#parity details.probe-preview td[data-side=rollout] .probe-text").inner_text()
    assert '<img src=x onerror=\\"window.__pwned = 1\\"><b>bold</b>' in panel
    assert page_problems(page)["errors"] == []


FRAGMENTS = ["a", "b", "{% endif %}", " ", "\n", "\n", "\r\n", "\r", "\u2028", "é", "--- x", "+++ y", "-", "+",
             "@@ -1 +1 @@", "\\ No newline at end of file", "\t", ""]


def _pairs(count: int) -> list:
    rng = random.Random(17)
    out = []
    while len(out) < count:
        a = "".join(rng.choices(FRAGMENTS, k=rng.randint(0, 16)))
        b = list(a)
        for _ in range(rng.randint(1, 4)):
            if b and rng.random() < 0.4:
                del b[rng.randrange(len(b))]
            else:
                b.insert(rng.randint(0, len(b)), rng.choice(FRAGMENTS))
        if a != "".join(b):
            out.append((a, "".join(b)))
    return out


def test_side_by_side_columns_rebuild_both_texts_for_generated_pairs(page, server):
    """The dashboard's parser against the Python diff on 300 generated pairs: with full context, the
    trainer column spells the trainer's text exactly and the rollout column the rollout's."""
    from trainer_hooks.fingerprint.textdiff import unified_diff

    pairs = _pairs(300)
    diffs = [unified_diff(a, b, "chat_template", context=10**6) for a, b in pairs]
    page.goto(f"{server.url}/#/runs")
    rows = page.evaluate("async (diffs) => { const m = await import('/static/diff.js');"
                         " return diffs.map((d) => m.parseUnified(d)); }", diffs)

    def column(parsed, side):
        lines = [r for r in parsed if r["kind"] in ("same", "change") and r[side] is not None]
        return "".join(r[side] + ("" if r[f"{side}NoEol"] else "\n") for r in lines)

    for (a, b), parsed in zip(pairs, rows):
        assert (column(parsed, "a"), column(parsed, "b")) == (a, b), (a, b)


def test_side_by_side_splits_named_templates_by_name(page, server):
    """Named templates: one section per name, each column rebuilding that template's text."""
    from urllib.parse import quote

    from trainer_hooks.fingerprint.textdiff import template_diff

    rng = random.Random(5)
    cases = []
    for _ in range(60):
        a = {n: "".join(rng.choices(FRAGMENTS, k=rng.randint(0, 8))) for n in ("default", "tool use") if rng.random() < 0.8}
        b = {n: "".join(rng.choices(FRAGMENTS, k=rng.randint(0, 8))) for n in ("default", "tool use", "rag") if rng.random() < 0.7}
        if a != b:
            cases.append((a, b))
    diffs = [template_diff(a or None, b or None, context=10**6) for a, b in cases]
    page.goto(f"{server.url}/#/runs")
    parsed = page.evaluate("async (diffs) => { const m = await import('/static/diff.js');"
                           " return diffs.map((d) => m.parseUnified(d)); }", diffs)
    for (a, b), rows in zip(cases, parsed):
        texts = {}
        name = None
        for r in rows:
            if r["kind"] == "file":
                path = r["b"] if r["b"] != "/dev/null" else r["a"]
                name = path.split("/", 2)[2]
                texts[name] = ["", ""]
            elif r["kind"] in ("same", "change"):
                for i, side in enumerate(("a", "b")):
                    if r[side] is not None:
                        texts[name][i] += r[side] + ("" if r[f"{side}NoEol"] else "\n")
        for template in set(a) | set(b):
            got = texts.get(quote(template, safe=""), ["", ""])
            assert got == [a.get(template, ""), b.get(template, "")], (a, b, template)


def test_a_sampling_mismatch_explains_each_parameter_and_why(page, server, tmp_path, screenshots):
    from trainer_hooks.fingerprint.core import with_component
    from trainer_hooks.fingerprint.sampling import sampling_value

    processor = chatml_fingerprint(tmp_path, TRL_DEFAULT_TEMPLATE, "sampling")
    trainer = with_component(processor, "sampling_params", sampling_value(temperature=1.0, logprobs_mode="processed"))
    rollout = with_component(processor, "sampling_params",
                             sampling_value({"temperature": 0.6, "top_k": 20}, logprobs_mode="processed_logprobs"),
                             {"sampling": {"filled_from_generation_config": ["temperature", "top_k"]}})
    run = _run(Seeder(server.url), "sampling-mismatch", trainer, rollout)
    details = _open_cell(page, server, run, "sampling_params")
    table = details.locator("table[aria-label='sampling parameters']")
    cells = table.locator("tr[data-key=temperature] td")
    expect(cells.nth(0)).to_have_text("error temperature")
    expect(cells.nth(1)).to_have_text("1")  # the trainer (JSON has no 1.0)
    expect(cells.nth(2)).to_have_text("0.6")
    expect(cells.nth(3)).to_contain_text("importance ratio")
    expect(table.locator("tr[data-key=top_k] td").nth(1)).to_have_text("off")
    expect(page.locator("dialog[open] [data-cause=generation_config_defaults]")).to_contain_text("temperature=0.6")
    page.keyboard.press("Escape")
    expect(page.locator("[data-banner=mismatch]")).to_contain_text("Sampling mismatch")
    expect(page.locator("[data-banner=mismatch]")).to_contain_text("importance ratio is biased")
    page.screenshot(path=str(screenshots / "parity-sampling.png"), full_page=False)
