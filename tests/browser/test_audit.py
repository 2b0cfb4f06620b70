"""The run page's "Sample audit" section in Chromium (issue 14.3): real hooks audit a batch made with
real tokenizers (an off-by-one log-prob list, a trainer template that drops `<think>`), post it to a
real server, and the page shows the tokens around each first mismatch, the mismatch marked, and
markup in token strings as text."""
from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems
from tests.unit.test_audit import CONVERSATION, DROPS_THINK_TEMPLATE, THINK, record
from trainer_hooks.monitor import ParityMonitor

pytestmark = pytest.mark.browser

SCRIPT_TOKEN = "<script>window.__pwned='audit'</script>"
IMG_TOKEN = "<img src=x onerror=\"window.__pwned='img'\">"


@pytest.fixture(scope="module")
def audited_run(server, tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import build_chatml_tokenizer

    extra = (*THINK, SCRIPT_TOKEN, IMG_TOKEN)
    rollout = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path_factory.mktemp("r"), extra_special_tokens=extra))
    trainer = AutoTokenizer.from_pretrained(build_chatml_tokenizer(
        tmp_path_factory.mktemp("t"), extra_special_tokens=extra, chat_template=DROPS_THINK_TEMPLATE))
    records = [record(rollout, answer=f"Hi {IMG_TOKEN} {SCRIPT_TOKEN}", logprobs_delta=-1), record(rollout, CONVERSATION),
               record(rollout)]
    # Open while the page is looked at: a run whose last process closes is finished, and its alerts resolve.
    with ParityMonitor("audited-in-browser", project="audit-ui", url=server.url,
                       spool_dir=tmp_path_factory.mktemp("spool")) as monitor:
        assert monitor.audit_rollout_batch(records, trainer, step=12)
        assert monitor.audit_rollout_batch([record(rollout)], trainer, step=13)  # a clean batch after it
        assert monitor.flush(30)
        [run] = httpx.get(f"{server.url}/api/v1/runs", params={"project": "audit-ui"}).json()["runs"]
        yield run["id"]


def test_the_audit_shows_token_windows_with_the_mismatch_marked_and_markup_as_text(page, server, audited_run,
                                                                                   screenshots):
    page.goto(f"{server.url}/#/runs/{audited_run}")
    section = page.locator("#audit")
    expect(section.locator(".audit-batch[data-step='13']")).to_contain_text("clean")
    section.locator("[data-action=failing-only]").check()  # the clean batch goes, the failing one stays
    expect(section.locator(".audit-batch[data-step='13']")).to_have_count(0)
    batch = section.locator(".audit-batch[data-step='12']")
    expect(batch).to_be_visible()
    expect(batch.locator(".audit-batch-head")).to_contain_text("1 length mismatch")
    expect(batch.locator(".audit-batch-head")).to_contain_text("1 re-render mismatch")

    rerender = batch.locator(".token-window[data-kind=rerender]")
    expect(rerender.locator("[data-side=rollout] mark[data-mismatch]")).to_have_text("<think>")
    expect(rerender.locator("[data-side=trainer] mark[data-mismatch]")).not_to_have_text("<think>")
    expect(rerender.locator("[data-side=trainer]")).not_to_contain_text("<think>")

    length = batch.locator(".token-window[data-kind=length]")
    # The eos id is the one without a log-prob: marked; the markup tokens before it show as text.
    expect(length.locator("mark[data-mismatch]")).to_have_text("<|im_end|>")
    expect(length).to_contain_text(SCRIPT_TOKEN)
    expect(length).to_contain_text(IMG_TOKEN.replace(" ", "␣"))  # spaces shown, escaped by the server
    expect(section.locator("script, img")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    section.screenshot(path=str(screenshots / "sample-audit.png"))
    # the alerts say why and lead to the samples
    alerts = page.locator("#alerts li[data-kind=sample_audit]")
    expect(alerts).to_have_count(2)
    expect(alerts.first.locator(".alert-why")).to_contain_text("Why:")
    alerts.first.locator("[data-action=show-audit]").click()
    expect(section).to_be_in_viewport()
    assert page_problems(page)["errors"] == []


def test_the_audit_shows_trained_ids_that_left_the_sampled_ones_a_trainer_cut_and_missing_image_features(
        page, server, tmp_path):
    from transformers import AutoTokenizer

    from tests.fixtures.tokenizers import build_chatml_tokenizer
    from tests.unit.test_audit import identity_record, sampled

    tok = AutoTokenizer.from_pretrained(build_chatml_tokenizer(tmp_path))
    ids = sampled(tok, "It is 6, and 7.", split="6,", eos=tok.eos_token_id)
    seen = {"images": 1, "grid": [[1, 4, 6]], "image_tokens": 6}
    records = [identity_record(tok, ids), identity_record(tok, ids), identity_record(tok, ids, images=seen)]
    trained = [tok.encode(tok.decode(ids), add_special_tokens=False), ids[:4], ids]
    with ParityMonitor("identity-in-browser", project="audit-ui-2", url=server.url, spool_dir=tmp_path / "spool") as m:
        assert m.audit_rollout_batch(records, tok, trainer_ids=trained,
                                     trainer_images=[None, None, {"images": 0, "grid": [], "image_tokens": 0}], step=4)
        assert m.flush(30)
        [run] = httpx.get(f"{server.url}/api/v1/runs", params={"project": "audit-ui-2"}).json()["runs"]
        page.goto(f"{server.url}/#/runs/{run['id']}")
        batch = page.locator("#audit .audit-batch[data-step='4']")
        head = batch.locator(".audit-batch-head")
        for badge in ("1 trained ids ≠ sampled", "1 cut by the trainer", "1 image features differ"):
            expect(head).to_contain_text(badge)
        expect(batch.locator(".token-window[data-kind=ids]")).to_have_count(2)  # where they part; where the cut is
        expect(batch.locator("[data-finding=truncated]")).to_contain_text(f"4 of {len(ids)} sampled ids")
        expect(batch.locator("[data-finding=images]")).to_contain_text(
            "images: rollout 1 image 1×4×6, 6 image tokens; trainer no image features")
        assert page_problems(page)["errors"] == []
