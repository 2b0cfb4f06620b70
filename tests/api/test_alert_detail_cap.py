"""Issue 13.5: the diff a processor_mismatch alert stores is bounded. A chat template can be any
size; its diff is repeated in every alert list, webhook and audit read, so the alert keeps a
bounded copy that says it was cut, while the parity endpoint still answers the whole diff."""
from __future__ import annotations

import json

from transformers import AutoTokenizer

from paritywatch.backend.detect.parity import CUT_MARK, bounded_diff
from tests.api.conftest import new_run
from tests.fixtures import tokenizers as builders
from tests.fixtures.chat_templates import TRL_DEFAULT_TEMPLATE
from tests.support.live import wait_for
from trainer_hooks.fingerprint import fingerprint_processor

CAP = 64 * 1024


def _size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def test_a_huge_template_difference_is_stored_bounded_and_marked(tmp_path, db_url, settings):
    from paritywatch.backend.main import create_app
    from tests.support.live import local_client

    # A 300 KB Jinja comment renders to nothing: the two templates behave alike (a warning), but
    # their text diff is large.
    comment = "{#- " + "release notes: nothing to render here. " * 7500 + " -#}"
    trainer = AutoTokenizer.from_pretrained(builders.build_chatml_tokenizer(tmp_path / "a", TRL_DEFAULT_TEMPLATE))
    rollout = AutoTokenizer.from_pretrained(builders.build_chatml_tokenizer(tmp_path / "b", comment + TRL_DEFAULT_TEMPLATE))
    app = create_app(settings.model_copy(update={"max_alert_detail_bytes": CAP}), upgrade_schema=False)
    with local_client(app) as api:
        run = new_run(api, "big-template")
        for side, tok in (("trainer", trainer), ("rollout", rollout)):
            comp = api.post(f"/api/v1/runs/{run['id']}/components", json={"side": side, "worker_id": side}).json()
            r = api.post(f"/api/v1/runs/{run['id']}/components/{comp['id']}/fingerprint", json=fingerprint_processor(tok))
            assert r.status_code == 200, r.text
        [alert] = wait_for(lambda: api.get(f"/api/v1/runs/{run['id']}/alerts").json()["alerts"], timeout_s=30)
        stored = alert["detail"]["diff"]
        assert alert["kind"] == "processor_mismatch" and alert["severity"] == "warning"
        assert _size(stored) <= CAP + 4096 and stored["truncated"] is True
        full = api.get(f"/api/v1/runs/{run['id']}/parity").json()["groups"][0]["diff"]
        assert "truncated" not in full and _size(full) > 4 * CAP
        kept = next(c for c in stored["components"] if c["name"] == "chat_template")["detail"]["unified_diff"]
        whole = next(c for c in full["components"] if c["name"] == "chat_template")["detail"]["unified_diff"]
        assert kept.endswith(CUT_MARK) and whole.startswith(kept.removesuffix(CUT_MARK))


def test_a_small_diff_is_stored_as_it_is():
    diff = {"verdict": "error", "components": [{"name": "vocab", "detail": {"sample": ["a"] * 10}}]}
    assert bounded_diff(diff, 10_000) is diff


def test_long_lists_are_cut_once_strings_cannot_be():
    diff = {"verdict": "error", "components": [{"name": "vocab", "detail": {"sample": [[i, "tok"] for i in range(5000)]}}]}
    out = bounded_diff(diff, 4096)
    assert out["truncated"] is True and _size(out) <= 4096
    assert out["components"][0]["detail"]["sample"][:3] == [[0, "tok"], [1, "tok"], [2, "tok"]]
    assert len(diff["components"][0]["detail"]["sample"]) == 5000  # the cached diff is left whole
