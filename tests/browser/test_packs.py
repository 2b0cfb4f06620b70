"""The pack suggestion on the run page: a run that posts verl's metric names is told so, and one
click enables the verl pack, whose rules then alert on those metrics."""
from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import page_problems

pytestmark = pytest.mark.browser


def test_verl_keys_suggest_the_verl_pack_and_one_click_enables_it(page, server):
    api = f"{server.url}/api/v1"
    run = httpx.post(f"{api}/runs", json={"name": "verl-suggest", "project": "packs"}).json()

    def post(seq: int, kl: float) -> None:
        r = httpx.post(f"{api}/runs/{run['id']}/metrics", json={"client_id": "verl", "seq": seq, "steps": [seq],
                       "series": {"rollout_corr/kl": [kl], "rollout_corr/rollout_is_mean": [1.0]}})
        assert r.status_code == 200, r.text

    post(1, 0.01)
    page.goto(f"{server.url}/#/runs/{run['id']}")
    banner = page.locator("[data-banner=pack][data-pack=verl]")
    expect(banner).to_contain_text("these metrics look like verl's: enable the verl pack")
    expect(banner).to_contain_text("rollout_corr/kl")
    banner.get_by_role("button", name="Enable the verl pack").click()
    expect(banner).to_have_count(0, timeout=20_000)
    expect(page.locator(".rules-table tr", has_text="rollout_corr/chi2_token")).to_contain_text("verl pack")
    assert httpx.get(f"{api}/runs/{run['id']}/settings").json()["packs"] == ["verl"]

    post(2, 0.5)  # |kl| > 0.1: verl's documented example alert
    expect(page.locator(".alert-item[data-kind=metric_threshold]")).to_contain_text("rollout_corr/kl", timeout=20_000)
    assert page_problems(page) == {"csp": [], "errors": []}
